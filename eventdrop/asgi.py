"""The ASGI application the production server runs (eventdrop/web.py), one per worker process.

A router by path: `/webhooks/` goes to the receive path's own ASGI application
(ingress/asgi.py), everything else (console, admin, API, metrics) to Django's own handler,
`get_asgi_application()`. Lifespan is answered here (Django's handler takes HTTP only): at
shutdown the webhook store's connections are closed.
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings")
django_application = get_asgi_application()  # sets Django up: only then may models be imported

from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

if settings.DEBUG:
    # `make run`: the admin's static files from the apps, as runserver serves them.
    django_application = ASGIStaticFilesHandler(django_application)

from eventdrop.web import WebServerConfig  # noqa: E402
from ingress.asgi import PATH_PREFIX, WebhookApp  # noqa: E402
from kernel.db.plans import serve_pages  # noqa: E402

serve_pages()  # the console's pages and APIs: plans with the values (kernel/db/plans.py)

_config = WebServerConfig.from_environ()
webhooks = WebhookApp(
    header_read_timeout_seconds=_config.header_read_timeout_seconds,
    max_requests=_config.max_concurrent_requests,
    max_body_bytes=_config.max_body_bytes_in_flight,
    store_connections=_config.store_connections,
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"].startswith(PATH_PREFIX):
        await webhooks(scope, receive, send)
    elif scope["type"] == "lifespan":
        await _lifespan(receive, send)
    else:
        await django_application(scope, receive, send)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await webhooks.writer.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
