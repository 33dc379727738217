"""gunicorn settings for `web` in the Procfile (read from the working directory).

gthread workers keep connections from a load balancer alive (no TCP handshake per webhook);
the 30 s timeout is the webhook route's budget (WEBHOOK_REQUEST_BUDGET_SECONDS).
The two hooks are prometheus_client's multiprocess set-up: with PROMETHEUS_MULTIPROC_DIR
set, every worker writes its metrics to files there, which must start empty and lose a
worker's live gauges when it exits.
"""

import os
import shutil

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "4"))
timeout = 30


def on_starting(server):
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
