from django.urls import path, re_path

from console.api import ApiNotFound, ApiRootApi, SchemaApi
from console.audit.api import OperatorActionListApi
from console.deliveries.api import DeliveryDetailApi, DeliveryListApi, DeliveryRearmApi
from console.incidents import api as incidents
from console.jobs import api as jobs
from console.ops.api import QueueDepthsApi
from console.pauses.api import PauseListApi, PauseResumeApi
from console.raw_events import api as raw_events
from console.recaps import api as recaps
from console.regions.api import ProcessingRegionApi, RegionListApi
from console.side_effects import api as side_effects

app_name = "console"
urlpatterns = [
    path("", ApiRootApi.as_view(), name="root"),
    path("schema/", SchemaApi.as_view(), name="schema"),
    path("raw-events/", raw_events.RawEventListApi.as_view(), name="raw-event-list"),
    path("raw-events/<int:pk>/", raw_events.RawEventDetailApi.as_view(), name="raw-event-detail"),
    path("raw-events/replay/", raw_events.RawEventReplayApi.as_view(), name="raw-event-replay"),
    path(
        "raw-events/reverify/", raw_events.RawEventReverifyApi.as_view(), name="raw-event-reverify"
    ),
    path(
        "raw-events/accept-repeat/",
        raw_events.RawEventAcceptRepeatApi.as_view(),
        name="raw-event-accept-repeat",
    ),
    path(
        "raw-events/reject-repeat/",
        raw_events.RawEventRejectRepeatApi.as_view(),
        name="raw-event-reject-repeat",
    ),
    path("deliveries/", DeliveryListApi.as_view(), name="delivery-list"),
    path("deliveries/<int:pk>/", DeliveryDetailApi.as_view(), name="delivery-detail"),
    path("deliveries/rearm/", DeliveryRearmApi.as_view(), name="delivery-rearm"),
    path("side-effects/", side_effects.SideEffectListApi.as_view(), name="side-effect-list"),
    path(
        "side-effects/<int:pk>/",
        side_effects.SideEffectDetailApi.as_view(),
        name="side-effect-detail",
    ),
    path(
        "side-effects/rearm/", side_effects.SideEffectRearmApi.as_view(), name="side-effect-rearm"
    ),
    path(
        "side-effects/mark-dead/",
        side_effects.SideEffectMarkDeadApi.as_view(),
        name="side-effect-mark-dead",
    ),
    path("recaps/", recaps.RecapListApi.as_view(), name="recap-list"),
    path("recaps/<uuid:pk>/", recaps.RecapDetailApi.as_view(), name="recap-detail"),
    path("recaps/retry-render/", recaps.RecapRetryRenderApi.as_view(), name="recap-retry-render"),
    path("incidents/", incidents.IncidentListApi.as_view(), name="incident-list"),
    path(
        "incidents/acknowledge/",
        incidents.IncidentAcknowledgeApi.as_view(),
        name="incident-acknowledge",
    ),
    path("incidents/resolve/", incidents.IncidentResolveApi.as_view(), name="incident-resolve"),
    path("incidents/rearm/", incidents.IncidentRearmApi.as_view(), name="incident-rearm"),
    path("queues/", QueueDepthsApi.as_view(), name="queue-depths"),
    path("operator-actions/", OperatorActionListApi.as_view(), name="operator-action-list"),
    path("jobs/", jobs.BulkJobListApi.as_view(), name="bulk-job-list"),
    path("jobs/<int:job_id>/", jobs.BulkJobDetailApi.as_view(), name="bulk-job-detail"),
    path("jobs/<int:job_id>/start/", jobs.BulkJobStartApi.as_view(), name="bulk-job-start"),
    path("jobs/<int:job_id>/cancel/", jobs.BulkJobCancelApi.as_view(), name="bulk-job-cancel"),
    path("pauses/", PauseListApi.as_view(), name="pause-list"),
    path("pauses/resume/", PauseResumeApi.as_view(), name="pause-resume"),
    path("regions/", RegionListApi.as_view(), name="region-list"),
    path("regions/processing/", ProcessingRegionApi.as_view(), name="processing-region"),
    # Anything else under /api/ is a 404 in the API's own error shape, not an HTML page.
    re_path(r"^.*$", ApiNotFound.as_view(), name="not-found"),
]
