"""The handlers of the fair-share tests (see the package docstring)."""

import os

import requests

from ingress.handlers import DownstreamRateLimited, webhook_handler
from kernel.retry import parse_retry_after
from tests.ingress.paced.marks import CONCURRENCY, FRESH, PACED, RATE


@webhook_handler(provider="github", event_types=[PACED], rate=RATE, concurrency=CONCURRENCY)
def call_the_paced_downstream(event, payload) -> None:
    answer = requests.post(
        os.environ["PACED_DOWNSTREAM_URL"], json={"raw_event_id": event.id}, timeout=(1.0, 5.0)
    )
    if answer.status_code == 429:
        pause = parse_retry_after(answer.headers.get("Retry-After"))
        raise DownstreamRateLimited(retry_after=pause)
    answer.raise_for_status()


@webhook_handler(provider="github", event_types=[FRESH])
def handle_fresh(event, payload) -> None:
    return None
