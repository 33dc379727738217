"""The production web server: granian serving eventdrop/asgi.py, through its documented options.

`python -m eventdrop.web` is the Procfile's `web` line. `/webhooks/` is the receive path's own
ASGI application (ingress/asgi.py), everything else Django's own ASGI handler
(eventdrop/asgi.py). Why granian, and what each setting does (docs/architecture.md, "The web
server"; figures in docs/benchmarks.md):

- It bounds a request's head with options of its own: the request line and headers must
  arrive within `WEB_HEADER_READ_TIMEOUT_SECONDS` of the connection's start or of the end of
  the previous answer on it (so an idle keep-alive connection is closed then too, and a
  connection that sends nothing), and a head past `WEB_MAX_HEADER_BYTES` is answered 431
  (its own empty-bodied answer) before the application sees it. uvicorn has neither. The
  header read counts against every webhook's budget (ingress.E003), Slack's 3 s included.
- `WEB_MAX_CONNECTIONS` is granian's backpressure: a process accepts at most that many
  connections at once. granian has no option to refuse the next one: it stays in the
  kernel's listen queue, unread and unanswered, until a connection closes, for as long as
  that takes. So the cap is set above what the receive path serves at once
  (`WEB_MAX_CONCURRENT_REQUESTS`, which it answers 503 + Retry-After past, at once) and is a
  bound on memory, not a queue: each connection holds at most its head.
- The body deadline, the per-process body bytes and the request's own deadline are the
  receive path's (ingress/asgi.py). What a process holds is bounded in docs/architecture.md
  ("Memory").

Settings come from the environment: `PORT` (8000), `WEB_BIND` or `HOST` (127.0.0.1: binding
every interface is a deployment decision, not a default), `WEB_CONCURRENCY` (processes, 2),
`WEB_HEADER_READ_TIMEOUT_SECONDS` (1), `WEB_MAX_HEADER_BYTES` (64 KiB, never below 8 KiB; the
receive path bounds each source lower, `max_header_bytes`), `WEB_MAX_CONNECTIONS` (512 per
process), `WEB_MAX_CONCURRENT_REQUESTS` (256 webhooks per process, below the connections),
`WEB_MAX_BODY_BYTES_IN_FLIGHT` (16 MiB per process, at least the largest source
`max_body_bytes`: ingress.E003), `WEB_STORE_CONNECTIONS` (4: the asyncio connections per
process that write webhooks, ingress/store.py), `WEB_LOG_LEVEL` (info) and `WEB_RELOAD` (off;
`make run` sets it: the processes restart when a source file changes).
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# How long the server waits at shutdown for requests in flight, which end within their own
# deadlines anyway (each webhook within its source's budget: ingress.E003).
GRACEFUL_SHUTDOWN_SECONDS = 30
# Under `make run`'s reload: granian's worker misses a stop that arrives while it starts (two
# saves in a row) and is killed only after this; nothing in flight there is worth waiting for.
RELOAD_SHUTDOWN_SECONDS = 3


@dataclass(frozen=True)
class WebServerConfig:
    host: str
    port: int
    processes: int
    header_read_timeout_seconds: float
    max_header_bytes: int
    max_connections: int = 512
    max_concurrent_requests: int = 256
    max_body_bytes_in_flight: int = 16 * 1024 * 1024
    store_connections: int = 4
    reload: bool = False

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError("WEB_CONCURRENCY must be at least 1")
        if not 0 < self.header_read_timeout_seconds <= 60:
            raise ValueError("WEB_HEADER_READ_TIMEOUT_SECONDS must be above 0 and at most 60")
        if not 1 <= self.max_concurrent_requests < self.max_connections:
            raise ValueError(
                "WEB_MAX_CONCURRENT_REQUESTS must be at least 1 and below WEB_MAX_CONNECTIONS "
                "(past it a webhook is answered 503 at once, past the connections it waits "
                "unanswered)"
            )
        if self.max_body_bytes_in_flight < 1:
            raise ValueError("WEB_MAX_BODY_BYTES_IN_FLIGHT must be at least 1")
        if self.store_connections < 1:
            raise ValueError("WEB_STORE_CONNECTIONS must be at least 1")

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> "WebServerConfig":
        env = os.environ if environ is None else environ
        return cls(
            host=env.get("WEB_BIND") or env.get("HOST") or "127.0.0.1",
            port=int(env.get("PORT") or 8000),
            processes=int(env.get("WEB_CONCURRENCY") or 2),
            header_read_timeout_seconds=float(env.get("WEB_HEADER_READ_TIMEOUT_SECONDS") or 1),
            # The request line and headers; never below 8 KiB, which every provider's head
            # fits in (nginx's default buffer for one long header line), and granian's least.
            max_header_bytes=max(8192, int(env.get("WEB_MAX_HEADER_BYTES") or 64 * 1024)),
            max_connections=int(env.get("WEB_MAX_CONNECTIONS") or 512),
            max_concurrent_requests=int(env.get("WEB_MAX_CONCURRENT_REQUESTS") or 256),
            max_body_bytes_in_flight=int(
                env.get("WEB_MAX_BODY_BYTES_IN_FLIGHT") or 16 * 1024 * 1024
            ),
            store_connections=int(env.get("WEB_STORE_CONNECTIONS") or 4),
            reload=env.get("WEB_RELOAD", "") in ("1", "true", "yes"),
        )


def _empty_prometheus_multiproc_dir() -> None:
    # prometheus_client's multiprocess mode: the directory must start empty (stale files of
    # an earlier run would be added to this one's figures). No metric of ours is a live
    # gauge, so a worker that exits leaves nothing that needs marking dead.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def serve(
    config: WebServerConfig | None = None, *, target: str = "eventdrop.asgi:application"
) -> None:
    """Serve `target` (module:attribute, an ASGI application): the project's, or another one
    a benchmark holds it against (bench/plain_asgi.py)."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    config = config or WebServerConfig.from_environ()
    _empty_prometheus_multiproc_dir()
    reload_filter = None
    if config.reload:  # watchfiles comes with granian[reload], a dev dependency
        import watchfiles

        reload_filter = watchfiles.PythonFilter
    Granian(
        target,
        address=config.host,
        port=config.port,
        interface=Interfaces.ASGI,
        workers=config.processes,
        loop=Loops.uvloop,
        http=HTTPModes.http1,
        websockets=False,
        backpressure=config.max_connections,
        http1_settings=HTTP1Settings(
            header_read_timeout=round(config.header_read_timeout_seconds * 1000),
            max_buffer_size=config.max_header_bytes,
        ),
        # A worker that dies (a segfault, the OOM killer) is replaced.
        respawn_failed_workers=True,
        respawn_interval=0.5,
        workers_kill_timeout=(
            RELOAD_SHUTDOWN_SECONDS if config.reload else GRACEFUL_SHUTDOWN_SECONDS
        ),
        log_level=LogLevels(os.environ.get("WEB_LOG_LEVEL", "info")),
        log_access=False,
        reload=config.reload,
        reload_paths=[ROOT] if config.reload else None,
        # Python files only: the embedded PostgreSQL writes its WAL under the checkout
        # (.pgdata/), and a reload on each write kept the worker restarting.
        reload_filter=reload_filter,
        reload_ignore_dirs=[".venv", ".git", "node_modules", "staticfiles", "tests"],
    ).serve()


if __name__ == "__main__":
    serve()
