from django.urls import path

from console import apis, apis_jobs

app_name = "console"
urlpatterns = [
    path("raw-events/", apis.RawEventListApi.as_view(), name="raw-event-list"),
    path(
        "raw-events/<int:raw_event_id>/",
        apis.RawEventDetailApi.as_view(),
        name="raw-event-detail",
    ),
    path("raw-events/replay/", apis.RawEventReplayApi.as_view(), name="raw-event-replay"),
    path("raw-events/reverify/", apis.RawEventReverifyApi.as_view(), name="raw-event-reverify"),
    path("side-effects/rearm/", apis.SideEffectRearmApi.as_view(), name="side-effect-rearm"),
    path(
        "side-effects/mark-dead/",
        apis.SideEffectMarkDeadApi.as_view(),
        name="side-effect-mark-dead",
    ),
    path("recaps/retry-render/", apis.RecapRetryRenderApi.as_view(), name="recap-retry-render"),
    path("queues/", apis.QueueDepthsApi.as_view(), name="queue-depths"),
    path("operator-actions/", apis.OperatorActionListApi.as_view(), name="operator-action-list"),
    # Bulk jobs (console/apis_jobs.py).
    path("jobs/", apis_jobs.BulkJobListApi.as_view(), name="bulk-job-list"),
    path("jobs/<int:job_id>/", apis_jobs.BulkJobDetailApi.as_view(), name="bulk-job-detail"),
    path("jobs/<int:job_id>/start/", apis_jobs.BulkJobStartApi.as_view(), name="bulk-job-start"),
    path("pauses/", apis_jobs.PauseListApi.as_view(), name="pause-list"),
    path("pauses/resume/", apis_jobs.PauseResumeApi.as_view(), name="pause-resume"),
    path("jobs/<int:job_id>/cancel/", apis_jobs.BulkJobCancelApi.as_view(), name="bulk-job-cancel"),
]
