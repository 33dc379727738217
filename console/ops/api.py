"""Queue depths in the console API: how much waits, how fast it drains, when it is clear."""

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import ConsoleApi
from console.ops.figures import (
    VIEW_OPS_PERMISSION,
    LaneDrain,
    QueueDrain,
    drained_counts,
    lane_drains,
    queue_drains,
)
from console.selectors import queue_depths


class QueueDepthsApi(ConsoleApi):
    """Queue depths, drain rates and the time to clear each queue, each source and each
    handler (with its limits now)."""

    required_permission = VIEW_OPS_PERMISSION

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        now = timezone.now()
        depths = queue_depths()
        counted = drained_counts(now=now)
        drains = queue_drains(
            now=now, inbox=depths["ingress"], outbox=depths["outbox"], counted=counted
        )
        depths["drain"] = {drain.queue: _drain(drain) for drain in drains}
        # Per source (raw events to verify) and per handler (deliveries to run).
        lanes = lane_drains(now=now, counted=counted)
        depths["sources"] = {lane.label: _lane(lane) for lane in lanes if lane.queue == "source"}
        depths["handlers"] = {lane.label: _lane(lane) for lane in lanes if lane.queue == "handler"}
        return Response(depths)


def _drain(drain: QueueDrain) -> dict:
    return {
        "backlog": drain.backlog,
        "drained": drain.drained,
        "window_seconds": drain.window_seconds,
        "per_second": drain.per_second,
        "seconds_to_clear": drain.seconds_to_clear,
    }


def _lane(lane: LaneDrain) -> dict:
    shown = {**_drain(lane), "in_flight": lane.in_flight, "over_replay_slo": lane.over_replay_slo}
    if lane.queue == "handler":
        shown |= {
            "held": lane.held,
            "rate_limit_per_second": lane.rate_limit,
            "concurrency_limit": lane.concurrency,
            "paused_until": lane.paused_until,
            "slowed_until": lane.slowed_until,
        }
    return shown
