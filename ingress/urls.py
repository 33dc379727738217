from collections.abc import Callable
from typing import Any

from django.urls import URLPattern, path

from ingress.views import receive_webhook


def webhook_patterns(view: Callable[..., Any]) -> list[URLPattern]:
    """The receive routes, for the WSGI view here and the loop's (ingress/urls_on_the_loop.py)."""
    return [
        path("<slug:source_name>/", view, name="receive"),
        # Providers are configured by hand and POST wherever they were told to, and none of
        # them re-POSTs a body to a redirect: without this, APPEND_SLASH would answer 301 (a
        # 500 in debug) and the event would be lost.
        path("<slug:source_name>", view, name="receive_without_slash"),
    ]


app_name = "ingress"
urlpatterns = webhook_patterns(receive_webhook)
