"""The console's bulk job, pause and incident pages (console/views_jobs.py,
console/views_incidents.py), under /ops/."""

from django.urls import path

from console import views_incidents, views_jobs

INCIDENT = "incidents/<str:kind>/<str:scope>/<str:error_class>/"

urlpatterns = [
    path("jobs/", views_jobs.job_list, name="console-job-list"),
    path("jobs/new/", views_jobs.job_new, name="console-job-new"),
    path("jobs/<int:job_id>/", views_jobs.job_detail, name="console-job-detail"),
    path("jobs/<int:job_id>/start/", views_jobs.job_start, name="console-job-start"),
    path("jobs/<int:job_id>/cancel/", views_jobs.job_cancel, name="console-job-cancel"),
    path("pauses/", views_jobs.pause_list, name="console-pauses"),
    path("pauses/pause/", views_jobs.pause_handlers, name="console-pause"),
    path("pauses/resume/", views_jobs.resume_handlers, name="console-resume"),
    path("incidents/", views_incidents.incident_list, name="console-incidents"),
    path(INCIDENT, views_incidents.incident_detail, name="console-incident"),
    path(
        f"{INCIDENT}acknowledge/",
        views_incidents.incident_acknowledge,
        name="console-incident-acknowledge",
    ),
    path(f"{INCIDENT}resolve/", views_incidents.incident_resolve, name="console-incident-resolve"),
    path(f"{INCIDENT}rearm/", views_incidents.incident_rearm, name="console-incident-rearm"),
]
