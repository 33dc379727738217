"""The project's import graph between its layers, from the source (docs/architecture.md).

    .venv/bin/python scripts/import_graph.py            # layer -> layers it imports, cycles,
                                                        # and every import that points up
    .venv/bin/python scripts/import_graph.py --edges    # every edge across layers

The layers, top to bottom: `project` (eventdrop's wiring: settings, urls, the web server),
`console`, `outbox`, `recaps`, `ingress`, `eventdrop` (the kernel every app may use: errors,
retry, budgets, db, logging). An import should point down. Every `import` / `from … import`
is read, at any depth (inside a function: "deferred"; under TYPE_CHECKING: "typing"), in the
apps' own code: tests and migrations are left out. Exits 1 when two layers import each other
(a cycle), 0 otherwise; upward imports without a cycle are listed, for docs/architecture.md
to name and justify.
"""

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("eventdrop", "ingress", "recaps", "outbox", "console")
LAYERS = ("project", "console", "outbox", "recaps", "ingress", "eventdrop")  # top first
# eventdrop's modules that wire the project together (and so may import any app).
PROJECT_MODULES = (
    "urls", "web", "web_protocol", "checks", "wsgi", "asgi", "settings", "settings_test", "views"
)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "eventdrop" and len(parts) > 1 and parts[1] in PROJECT_MODULES:
        return "project"
    return parts[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, str]]:
    """(imported module, how) for each import in the file; how is '', 'deferred' or 'typing'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            child_how = how
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                child_how = how or "deferred"
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                child_how = "typing"
            if isinstance(child, ast.Import):
                found.extend((alias.name, child_how) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.module, child_how))
            visit(child, child_how)

    visit(tree, "")
    return found


def edges() -> list[tuple[str, str, str]]:
    """(importing module, imported module, how) across two different layers."""
    result = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            source = _module_name(path)
            for target, how in _imports(path):
                if target.split(".")[0] in APPS and layer_of(target) != layer_of(source):
                    result.append((source, target, how))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="list every edge across apps")
    args = parser.parse_args()
    all_edges = edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target, _ in all_edges:
        graph[layer_of(source)].add(layer_of(target))
    if args.edges:
        for source, target, how in all_edges:
            print(f"{source} -> {target}" + (f"  ({how})" if how else ""))
        print()
    for layer in LAYERS:
        print(f"{layer:10} -> {', '.join(sorted(graph[layer], key=LAYERS.index)) or '-'}")

    def between(a: str, b: str) -> list[str]:
        return sorted(
            {
                f"{s} -> {t}" + (f"  ({how})" if how else "")
                for s, t, how in all_edges
                if layer_of(s) == a and layer_of(t) == b
            }
        )

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph[b]})
    for a, b in cycles:
        print(f"\ncycle {a} <-> {b}:")
        for line in between(a, b) + between(b, a):
            print(f"  {line}")
    upward = [
        line
        for a in LAYERS
        for b in LAYERS
        if LAYERS.index(b) < LAYERS.index(a) and (min(a, b), max(a, b)) not in cycles
        for line in between(a, b)
    ]
    print("\nimports that point up:" if upward else "\nno import points up")
    for line in upward:
        print(f"  {line}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
