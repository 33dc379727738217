"""The console's pages under /ops/ besides the ops page itself: bulk jobs, pauses, incidents
(each feature's views.py)."""

from django.urls import path

from console.incidents import views as views_incidents
from console.jobs import views as views_jobs
from console.pauses import views as views_pauses
from console.regions import views as views_regions

INCIDENT = "incidents/<str:kind>/<str:scope>/<str:error_class>/"

urlpatterns = [
    path("jobs/", views_jobs.job_list, name="console-job-list"),
    path("jobs/new/", views_jobs.job_new, name="console-job-new"),
    path("jobs/<int:job_id>/", views_jobs.job_detail, name="console-job-detail"),
    path("jobs/<int:job_id>/start/", views_jobs.job_start, name="console-job-start"),
    path("jobs/<int:job_id>/cancel/", views_jobs.job_cancel, name="console-job-cancel"),
    path("pauses/", views_pauses.pause_list, name="console-pauses"),
    path("pauses/pause/", views_pauses.pause_handlers, name="console-pause"),
    path("pauses/resume/", views_pauses.resume_handlers, name="console-resume"),
    path("incidents/", views_incidents.incident_list, name="console-incidents"),
    path("regions/", views_regions.region_list, name="console-regions"),
    path("regions/switch/", views_regions.region_switch, name="console-region-switch"),
    path(INCIDENT, views_incidents.incident_detail, name="console-incident"),
    path(
        f"{INCIDENT}acknowledge/",
        views_incidents.incident_acknowledge,
        name="console-incident-acknowledge",
    ),
    path(f"{INCIDENT}resolve/", views_incidents.incident_resolve, name="console-incident-resolve"),
    path(f"{INCIDENT}rearm/", views_incidents.incident_rearm, name="console-incident-rearm"),
]
