"""The production URLs plus `/bench/noop/<source>/`: the same request through the same
middleware, body read, 202 answered, nothing written. The webhook's latency minus this one's
is what the durable INSERT costs."""

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from eventdrop.urls import urlpatterns as production_urlpatterns


@csrf_exempt
def noop(request: HttpRequest, source_name: str) -> JsonResponse:
    return JsonResponse({"received": len(request.body), "status": "accepted"}, status=202)


urlpatterns = [
    path("bench/noop/<slug:source_name>/", noop),
    *production_urlpatterns,
]
