from django.urls import path

from ingress.views import receive_webhook

app_name = "ingress"
urlpatterns = [
    path("<slug:source_name>/", receive_webhook, name="receive"),
]
