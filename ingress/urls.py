from django.urls import path

from ingress.views import receive_webhook

app_name = "ingress"
urlpatterns = [
    path("<slug:source_name>/", receive_webhook, name="receive"),
    # Providers are configured by hand and POST wherever they were told to, and none of them
    # re-POSTs a body to a redirect: without this, APPEND_SLASH would answer 301 (a 500 in
    # debug) and the event would be lost.
    path("<slug:source_name>", receive_webhook, name="receive_without_slash"),
]
