from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/", include("ingress.urls")),
    path("recaps/", include("recaps.urls")),
    path("api/", include("console.urls")),
]
