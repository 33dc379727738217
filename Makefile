# Two entry points: `make run` (try it) and `make test`. Both run on PostgreSQL: DATABASE_URL,
# else the one on 127.0.0.1:$LOCAL_POSTGRES_PORT (5432), else an embedded one they start there
# and stop when they end (scripts/localdb.py).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

BENCH_INGRESS_JSON ?= /tmp/eventdrop_bench_ingress.json

.PHONY: run test check lint typecheck bench clean install

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} ./scripts/run-local.sh

# mypy (config and strictness: pyproject.toml [tool.mypy]) runs between ruff and pytest, so
# `make test` (and CI, which runs it) fails on a type error; `make typecheck` runs it alone.
TYPECHECK := $(PY) -m mypy
# The layers' contracts (pyproject.toml [tool.importlinter], docs/architecture.md): an import
# that points up fails the lint, like a type error.
LINT_IMPORTS := $(VENV)/bin/lint-imports --no-logo
LINT := $(PY) -m ruff check . && $(TYPECHECK) && $(LINT_IMPORTS)
# pytest on PostgreSQL (scripts/localdb.py), in parallel (pytest-xdist): each worker has its
# own test database, each real-process module stays on one worker (tests/conftest.py).
PYTEST := DJANGO_SETTINGS_MODULE=eventdrop.settings_test $(PY) scripts/localdb.py run -- \
	$(PY) -m pytest --dist loadgroup
# Workers: more than the cores for the whole suite (its real-process tests mostly wait),
# about the cores for the in-process tier (docs/development.md, "The tiers").
TEST_WORKERS ?= 4
CHECK_WORKERS ?= 3
IN_PROCESS := not slow and not faults and not browser

# The system packages the suite needs first (installed as root, else named), then lint, types
# and the layers, then the whole suite.
test: $(STAMP)
	@bash scripts/install-test-deps.sh
	$(LINT)
	@$(PYTEST) -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The inner loop: lint, types, the layers and every in-process test (no server, command,
# cluster or browser), in about two minutes.
check: $(STAMP)
	$(LINT)
	@$(PYTEST) -n $(CHECK_WORKERS) -m "$(IN_PROCESS)" $(PYTEST_ARGS)

lint: $(STAMP)
	$(LINT)

typecheck: $(STAMP)
	$(PY) -m mypy

bench: $(STAMP)
	@# bench/ingress_ack.py installs wrk (apt-get update, then install) when it is missing.
	$(PY) bench/ingress_ack.py --connections 16 1 --slow-clients 32 --json-out $(BENCH_INGRESS_JSON)
	$(PY) bench/inbox_throughput.py --events 50000 --workers 2 --ingress-json $(BENCH_INGRESS_JSON)

clean:
	rm -rf $(VENV)  # .env stays (your key and ports), and so does .pgdata/ (the local database)
