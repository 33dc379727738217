"""The console's bulk job and pause pages (console/views_jobs.py), under /ops/."""

from django.urls import path

from console import views_jobs

urlpatterns = [
    path("jobs/", views_jobs.job_list, name="console-job-list"),
    path("jobs/new/", views_jobs.job_new, name="console-job-new"),
    path("jobs/<int:job_id>/", views_jobs.job_detail, name="console-job-detail"),
    path("jobs/<int:job_id>/start/", views_jobs.job_start, name="console-job-start"),
    path("jobs/<int:job_id>/cancel/", views_jobs.job_cancel, name="console-job-cancel"),
    path("pauses/", views_jobs.pause_list, name="console-pauses"),
    path("pauses/pause/", views_jobs.pause_handlers, name="console-pause"),
    path("pauses/resume/", views_jobs.resume_handlers, name="console-resume"),
]
