"""What the local fakes share (fakes/stripe.py, fake_renderer.py): the HTTP server
lifecycle, and the secret a fake signs its webhooks with.

A real server on 127.0.0.1: on a daemon thread for tests (`start`/`stop`, or `with`), or in
the foreground for a management command (`serve_until_interrupted`). `stopping` is set on
the way out so every bounded wait a fake is in ends early.
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from ingress.sources import all_sources


def sender_secret(source_name: str) -> str:
    """The secret a sender signs with: the first of the source's secrets.

    During a rotation the variable holds "new,old": the ingress accepts either, a sender
    signs with the current one. Parsed by the ingress's own source configuration, so both
    sides read the variable the same way. CommandError when there is none.
    """
    try:
        source = all_sources().get(source_name)
    except ImproperlyConfigured as exc:
        raise CommandError(f"webhook sources are misconfigured: {exc}") from exc
    if source is None or not source.secrets:
        env = source.secrets_env if source else f"{source_name.upper()}_WEBHOOK_SECRET"
        raise CommandError(f"{env} is not set: its webhooks cannot be signed.")
    return source.secrets[0]


class LocalHTTPService:
    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0):
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def serve_until_interrupted(self) -> None:
        """Serve in the foreground until Ctrl-C, then close the socket (a management command)."""
        try:
            self.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.stopping.set()
            self._server.server_close()

    def stop(self) -> None:
        self.stopping.set()
        # shutdown() waits for a serve_forever loop: only one that was started would end.
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
