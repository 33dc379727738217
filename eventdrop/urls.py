from django.contrib import admin
from django.urls import include, path

from console.ops.views import metrics, ops_page
from console.views_landing import home

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("webhooks/", include("ingress.urls")),
    path("recaps/", include("recaps.urls")),
    path("api/", include("console.urls")),
    path("ops/", ops_page, name="ops"),
    path("ops/", include("console.urls_ops")),  # bulk jobs and handler pauses
    path("metrics", metrics, name="metrics"),
]
