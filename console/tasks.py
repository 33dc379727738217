"""django-q2 entry points of the console: thin, the work is in console/jobs/services.py."""

from console.jobs.services import bulk_job_run as _bulk_job_run
from console.jobs.services import bulk_jobs_sweep as _bulk_jobs_sweep


def bulk_job_run(job_id: int) -> str:
    """One task's share of a bulk job (it enqueues its own continuation)."""
    job = _bulk_job_run(job_id=job_id)
    return f"bulk job #{job.id} {job.state}: {job.processed}/{job.total}"


def bulk_jobs_sweep() -> None:
    """Every minute: resume jobs whose worker died, measure the replay SLO of finished jobs."""
    _bulk_jobs_sweep()
