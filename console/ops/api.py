"""Queue depths in the console API: how much waits, how fast it drains, when it is clear."""

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import ConsoleApi
from console.ops.figures import VIEW_OPS_PERMISSION, queue_drains
from console.selectors import queue_depths


class QueueDepthsApi(ConsoleApi):
    """Queue depths, drain rates and the time to clear each queue."""

    required_permission = VIEW_OPS_PERMISSION

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        depths = queue_depths()
        drains = queue_drains(now=timezone.now(), inbox=depths["ingress"], outbox=depths["outbox"])
        depths["drain"] = {
            drain.queue: {
                "backlog": drain.backlog,
                "drained": drain.drained,
                "window_seconds": drain.window_seconds,
                "per_second": drain.per_second,
                "seconds_to_clear": drain.seconds_to_clear,
            }
            for drain in drains
        }
        return Response(depths)
