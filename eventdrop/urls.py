from django.contrib import admin
from django.urls import include, path

from console.views_landing import home
from console.views_ops import metrics, ops_page

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("webhooks/", include("ingress.urls")),
    path("recaps/", include("recaps.urls")),
    path("api/", include("console.urls")),
    path("ops/", ops_page, name="ops"),
    path("ops/", include("console.urls_jobs")),  # bulk jobs and handler pauses
    path("metrics", metrics, name="metrics"),
]
