"""The URLconf of `/webhooks/` on the production server's event loop.

eventdrop/web.py (WebhooksOnTheLoop) makes it each webhook request's URLconf: the same paths
and names as ingress/urls.py under the project's `webhooks/`, with the coroutine view, so the
row joins the loop's group commit. Anywhere else (WSGI, the test client) the project's
URLconf serves the plain view, which needs no event loop at all.
"""

from django.urls import include, path

from ingress.urls import app_name, webhook_patterns
from ingress.views import receive_webhook_on_the_loop

urlpatterns = [
    path("webhooks/", include((webhook_patterns(receive_webhook_on_the_loop), app_name))),
]
