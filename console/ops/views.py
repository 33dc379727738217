"""The ops page (/ops/) and the Prometheus endpoint (/metrics). Reads only.

Both need `console.view_ops`. The page is the admin's: staff sign in there (anonymous and
non-staff users are sent to the admin login) and see it in the admin's frame. /metrics also
takes `Authorization: Bearer <METRICS_BEARER_TOKEN>` for Prometheus, and a console API token
(`Authorization: Token …`) of a staff user with the permission.
"""

import hmac
from datetime import datetime
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework.exceptions import AuthenticationFailed

from console.authentication import ApiTokenAuthentication
from console.incidents.services import RESOLVED, incident_groups
from console.ops import charts
from console.ops.figures import (
    DAY,
    DRAIN_WINDOW,
    SLOS,
    VIEW_OPS_PERMISSION,
    YELLOW_FRACTION,
    HourlySeries,
    hourly_ack_p99,
    hourly_dead,
    hourly_lags,
    hourly_volume,
    ops_snapshot,
)
from console.ops.metrics import metrics_registry
from console.presentation import format_seconds
from ingress.models import RejectionReason, SignatureStatus
from ingress.sources import all_sources
from kernel.routers import replica_status
from regions.selectors import region_overview

# The page reloads itself: left open on a screen, it never shows stale colours for long.
REFRESH_SECONDS = 60


def _admin_filter_since(since: datetime) -> str:
    # The admin's date filter parameter, in the form docs/console.md documents.
    return since.isoformat(sep=" ", timespec="seconds")


def _rejected_link(*, source: str, reason: str, since: datetime) -> str:
    query = urlencode(
        {
            "signature_status__exact": SignatureStatus.REJECTED,
            "rejection_reason__exact": reason,
            "source": source,
            "received_at__gte": _admin_filter_since(since),
        }
    )
    return f"{reverse('admin:ingress_rawevent_changelist')}?{query}"


def _count(value: float) -> str:
    return f"{value:g}"


def _lag(value: float) -> str:
    return format_seconds(value) if value else "0"


def ops_charts(*, now: datetime, volume: HourlySeries | None = None) -> list[charts.Chart]:
    """The last 24 h per hour: one grouped query per chart (console.ops.figures, hourly_*); the
    volume comes with the snapshot when there is one (the same scan as the volume table)."""
    volume = volume or hourly_volume(now=now)
    series = dict(volume.series)
    rejected = series.pop("rejected (all sources)")
    lags = hourly_lags(now=now)
    dead = hourly_dead(now=now)
    ack = hourly_ack_p99(now=now)
    ack_slo = SLOS["ack_p99"]
    return [
        charts.lines(
            key="ack",
            title="ACK latency p99 per hour, by source",
            hours=ack.hours,
            series=ack.series,
            fmt=format_seconds,
            red_lines={f"{ack_slo.label}: red from {ack_slo.display_red}": ack_slo.red_at},
            note=(
                "From the ACK histogram's buckets, added up per hour by every scrape of /metrics "
                "and opening of this page: the p99 is interpolated inside the bucket that holds "
                "the 99th percentile, as Prometheus' histogram_quantile does, so the true value "
                "lies within that bucket's bounds (…, 125 ms, 250 ms, 500 ms, …)."
            ),
        ),
        charts.stacked_bars(
            key="volume",
            title="Events received per hour, by source",
            hours=volume.hours,
            series=series,
            fmt=_count,
        ),
        charts.stacked_bars(
            key="rejected",
            title="Events rejected per hour (all sources)",
            hours=volume.hours,
            series={"rejected": rejected},
            fmt=_count,
        ),
        charts.lines(
            key="lags",
            title="Verification and processing lag p95, by hour received",
            hours=lags.hours,
            series=lags.series,
            fmt=_lag,
            red_lines={
                f"{SLOS[key].label}: red from {SLOS[key].display_red}": SLOS[key].red_at
                for key in ("verification_lag_p95", "processing_lag_p95")
            },
        ),
        charts.stacked_bars(
            key="dead",
            title="Rows that went dead per hour",
            hours=dead.hours,
            series=dead.series,
            fmt=_count,
        ),
    ]


@never_cache
@staff_member_required
def ops_page(request: HttpRequest) -> TemplateResponse:
    if not request.user.has_perm(VIEW_OPS_PERMISSION):
        raise PermissionDenied
    # Measured first: the figures below are read from the replica only while it is fit to.
    replica = replica_status(fresh=True)
    snapshot = ops_snapshot()
    since = snapshot.taken_at - DAY
    reasons = dict(RejectionReason.choices)
    rejections = [
        {
            "row": row,
            "meaning": reasons.get(row.reason, ""),
            "link": _rejected_link(source=row.source, reason=row.reason, since=since),
        }
        for row in snapshot.rejections
    ]
    drift = SLOS["drift"]
    reconciliation = [
        {"run": run, "drift": drift.display(run.drift), "level": drift.level(run.drift)}
        for run in snapshot.reconciliation
    ]
    context = {
        **admin.site.each_context(request),
        "title": "Operations",
        "snapshot": snapshot,
        "figures": snapshot.figures(),
        "worst_level": snapshot.worst_level(),
        "rejections": rejections,
        "reconciliation": reconciliation,
        "ack_p99": SLOS["ack_p99"].display(snapshot.ack.p99),
        "charts": [
            {"chart": chart, "legend": charts.legend_html(chart)}
            for chart in ops_charts(now=snapshot.taken_at, volume=snapshot.volume_by_hour)
        ],
        "yellow_percent": round(YELLOW_FRACTION * 100),
        "refresh_seconds": REFRESH_SECONDS,
        "drain_window": format_seconds(DRAIN_WINDOW.total_seconds()),
        "disabled_sources": sorted(n for n, source in all_sources().items() if not source.enabled),
        "replica": replica,
        "regions": region_overview(now=snapshot.taken_at),
        "raw_events_since_query": urlencode({"received_at__gte": _admin_filter_since(since)}),
        "oldest_pending": format_seconds(snapshot.inbox["raw_events_oldest_pending_age_seconds"]),
        "oldest_due_delivery": format_seconds(snapshot.inbox["deliveries_oldest_due_age_seconds"]),
        "oldest_due_side_effect": format_seconds(snapshot.outbox["oldest_due_age_seconds"]),
    }
    groups = incident_groups(now=snapshot.taken_at)
    context["incidents"] = [group for group in groups if group.state != RESOLVED]
    return TemplateResponse(request, "console/ops.html", context)


def _unauthorized() -> HttpResponse:
    response = HttpResponse("Authentication required.\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _forbidden() -> HttpResponse:
    return HttpResponse("Forbidden.\n", status=403, content_type="text/plain")


def _metrics_refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read /metrics, else the answer to give.

    Three ways in: `Bearer <METRICS_BEARER_TOKEN>` (Prometheus), `Token <console API token>`
    of a staff user with console.view_ops (a script, the same token as for /api/), or a
    staff session with that permission (a browser).
    """
    header = request.headers.get("Authorization")
    if header is not None:
        # A presented credential decides alone: a wrong token is refused even for a browser
        # that also carries a staff session.
        scheme, _, presented = header.partition(" ")
        if scheme.lower() == "token":
            try:
                authenticated = ApiTokenAuthentication().authenticate(request)
            except AuthenticationFailed:
                return _unauthorized()
            if authenticated is None:
                return _unauthorized()
            user, _ = authenticated
            if not (user.is_staff and user.has_perm(VIEW_OPS_PERMISSION)):
                return _forbidden()
            return None
        token = settings.METRICS_BEARER_TOKEN
        if (
            token
            and scheme.lower() == "bearer"
            and hmac.compare_digest(presented.strip().encode(), token.encode())
        ):
            return None
        return _unauthorized()
    if not request.user.is_authenticated:
        return _unauthorized()
    if not (request.user.is_staff and request.user.has_perm(VIEW_OPS_PERMISSION)):
        return _forbidden()
    return None


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _metrics_refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
