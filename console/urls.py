from django.urls import path, re_path

from console import apis, apis_jobs, apis_reads, apis_regions
from console.api_schema import ApiNotFound, SchemaApi

app_name = "console"
urlpatterns = [
    path("", apis_reads.ApiRootApi.as_view(), name="root"),
    path("schema/", SchemaApi.as_view(), name="schema"),
    path("raw-events/", apis.RawEventListApi.as_view(), name="raw-event-list"),
    path(
        "raw-events/<int:raw_event_id>/",
        apis.RawEventDetailApi.as_view(),
        name="raw-event-detail",
    ),
    path("raw-events/replay/", apis.RawEventReplayApi.as_view(), name="raw-event-replay"),
    path("raw-events/reverify/", apis.RawEventReverifyApi.as_view(), name="raw-event-reverify"),
    path(
        "raw-events/accept-repeat/",
        apis.RawEventAcceptRepeatApi.as_view(),
        name="raw-event-accept-repeat",
    ),
    path(
        "raw-events/reject-repeat/",
        apis.RawEventRejectRepeatApi.as_view(),
        name="raw-event-reject-repeat",
    ),
    path("deliveries/", apis_reads.DeliveryListApi.as_view(), name="delivery-list"),
    path(
        "deliveries/<int:delivery_id>/",
        apis_reads.DeliveryDetailApi.as_view(),
        name="delivery-detail",
    ),
    path("side-effects/", apis_reads.SideEffectListApi.as_view(), name="side-effect-list"),
    path(
        "side-effects/<int:side_effect_id>/",
        apis_reads.SideEffectDetailApi.as_view(),
        name="side-effect-detail",
    ),
    path("side-effects/rearm/", apis.SideEffectRearmApi.as_view(), name="side-effect-rearm"),
    path(
        "side-effects/mark-dead/",
        apis.SideEffectMarkDeadApi.as_view(),
        name="side-effect-mark-dead",
    ),
    path("recaps/", apis_reads.RecapListApi.as_view(), name="recap-list"),
    path("recaps/<uuid:recap_id>/", apis_reads.RecapDetailApi.as_view(), name="recap-detail"),
    path("recaps/retry-render/", apis.RecapRetryRenderApi.as_view(), name="recap-retry-render"),
    path("incidents/", apis_reads.IncidentListApi.as_view(), name="incident-list"),
    path(
        "incidents/acknowledge/",
        apis_reads.IncidentAcknowledgeApi.as_view(),
        name="incident-acknowledge",
    ),
    path("incidents/resolve/", apis_reads.IncidentResolveApi.as_view(), name="incident-resolve"),
    path("incidents/rearm/", apis_reads.IncidentRearmApi.as_view(), name="incident-rearm"),
    path("queues/", apis.QueueDepthsApi.as_view(), name="queue-depths"),
    path(
        "operator-actions/",
        apis_reads.OperatorActionListApi.as_view(),
        name="operator-action-list",
    ),
    # Bulk jobs (console/apis_jobs.py).
    path("jobs/", apis_jobs.BulkJobListApi.as_view(), name="bulk-job-list"),
    path("jobs/<int:job_id>/", apis_jobs.BulkJobDetailApi.as_view(), name="bulk-job-detail"),
    path("jobs/<int:job_id>/start/", apis_jobs.BulkJobStartApi.as_view(), name="bulk-job-start"),
    path("pauses/", apis_jobs.PauseListApi.as_view(), name="pause-list"),
    path("pauses/resume/", apis_jobs.PauseResumeApi.as_view(), name="pause-resume"),
    path("regions/", apis_regions.RegionListApi.as_view(), name="region-list"),
    path(
        "regions/processing/",
        apis_regions.ProcessingRegionApi.as_view(),
        name="processing-region",
    ),
    path("jobs/<int:job_id>/cancel/", apis_jobs.BulkJobCancelApi.as_view(), name="bulk-job-cancel"),
    # Anything else under /api/ is a 404 in the API's own error shape, not an HTML page.
    re_path(r"^.*$", ApiNotFound.as_view(), name="not-found"),
]
