"""The bulk job and pause pages in a real browser (Playwright, Debian's chromium).

An on-call engineer's path: fill the job form, preview (count and breakdown, nothing
touched), start, watch the progress page reload while a worker runs the batches, see it
done and recorded; start another and cancel it mid-way; pause a handler while events keep
arriving, see it held on the ops page, resume it.

The worker is the test itself (console.jobs.services.bulk_job_run, one batch at a time), so the
page's intermediate states can be watched; the live server runs in this process, so the
start's enqueue is recorded instead of run inline (the test settings' django-q2 is sync).
"""

import os

import pytest
from django.test import Client

from console.jobs import services as bulk_jobs
from console.models import BulkJob, OperatorAction
from ingress.deliveries import deliveries_run_due
from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from tests.console import test_browser as browser_tests
from tests.console.conftest import receive_github
from tests.console.test_browser import screenshot
from tests.console.test_bulk_jobs import stored_events

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The same browser (skipped, or failed on CI, without chromium) and signed-in page as the
# console's other browser tests.
browser = browser_tests.browser
page = browser_tests.page


@pytest.fixture
def enqueued(monkeypatch):
    jobs: list[int] = []
    monkeypatch.setattr(bulk_jobs, "_enqueue", jobs.append)
    return jobs


def test_preview_start_progress_done_and_cancel(
    page, live_server, push_handler, enqueued, tmp_path
):
    from playwright.sync_api import expect

    stored_events(12)
    stored_events(3, signature_status="rejected", rejection_reason="bad_signature")

    page.goto(f"{live_server.url}/ops/jobs/")
    expect(page.locator("#jobs-none")).to_be_visible()
    page.click("#jobs-new")
    page.select_option("#id_kind", "replay_raw_events")
    page.select_option("#id_source", "github")
    expect(page.locator("#source-disable-link a")).to_have_attribute(
        "href", "/ops/pauses/#source-disable-cost"
    )
    page.click("#jobs-preview")

    # The preview: counted, broken down, nothing touched.
    expect(page.locator("#job-state")).to_contain_text("previewed")
    expect(page.locator("#job-total")).to_have_text("15")
    expect(page.locator("#job-eligible")).to_have_text("12")
    expect(page.locator("#job-breakdown")).to_contain_text("rejected")
    assert not Delivery.objects.exists() and not OperatorAction.objects.exists()
    screenshot(page, "console-bulk-job-preview.png", tmp_path)

    page.click("#job-start")
    expect(page.locator("ul.messagelist")).to_contain_text("queued: 15 rows")
    job = BulkJob.objects.get()
    assert enqueued == [job.id]
    expect(page.locator("#job-state")).to_have_attribute("data-state", "queued")

    # A worker runs one batch: the page, reloading itself, shows the progress.
    bulk_jobs.bulk_job_run(job_id=job.id, batch_size=5, budget_seconds=0)
    expect(page.locator("#job-processed")).to_have_text("5", timeout=10_000)
    expect(page.locator("#job-state")).to_have_attribute("data-state", "running")
    expect(page.locator("#job-cancel")).to_be_visible()

    bulk_jobs.bulk_job_run(job_id=job.id, batch_size=5)
    expect(page.locator("#job-state")).to_have_attribute("data-state", "done", timeout=10_000)
    expect(page.locator("#job-succeeded")).to_have_text("12")
    expect(page.locator("#job-refused")).to_have_text("3")
    expect(page.locator("#job-problems")).to_contain_text("only verified events are replayed")
    expect(page.locator("#job-operator-action")).to_be_visible()
    expect(page.locator("#job-cancel")).to_have_count(0)
    screenshot(page, "console-bulk-job-done.png", tmp_path)
    assert Delivery.objects.count() == 12

    # A second job, by ids, cancelled after its first batch.
    ids = " ".join(str(pk) for pk in Delivery.objects.values_list("raw_event_id", flat=True))
    page.goto(f"{live_server.url}/ops/jobs/new/")
    page.fill("#id_ids", ids)
    page.click("#jobs-preview")
    expect(page.locator("#job-total")).to_have_text("12")
    page.click("#job-start")
    second = BulkJob.objects.latest("id")
    bulk_jobs.bulk_job_run(job_id=second.id, batch_size=4, budget_seconds=0)
    page.reload()
    page.click("#job-cancel")
    expect(page.locator("ul.messagelist")).to_contain_text("cancelling")
    bulk_jobs.bulk_job_run(job_id=second.id, batch_size=4)
    expect(page.locator("#job-state")).to_have_attribute("data-state", "cancelled", timeout=10_000)
    expect(page.locator("#job-processed")).to_have_text("4")
    action = OperatorAction.objects.get(bulk_job=second)
    assert (action.outcome, action.skipped) == ("cancelled", 8)

    page.goto(f"{live_server.url}/ops/jobs/")
    expect(page.locator(f"#job-{job.id}")).to_contain_text("done")
    expect(page.locator(f"#job-{second.id}")).to_contain_text("cancelled")


def test_pause_hold_see_it_on_the_ops_page_and_resume(page, live_server, push_handler, tmp_path):
    from playwright.sync_api import expect

    name = "tests.console.conftest.push_handler.<locals>.console_test_on_push"
    page.goto(f"{live_server.url}/ops/pauses/")
    expect(page.locator("#pauses-none")).to_be_visible()
    expect(page.locator("#source-disable-cost")).to_contain_text("disables the endpoint")
    page.click(f'a.pause-handler[data-handler="{name}"]')
    # The confirmation asks why; the reason is required.
    page.fill("#id_reason", "the downstream CRM is down")
    page.click("#pause-confirm-submit")
    expect(page.locator("ul.messagelist")).to_contain_text(f"handler {name}: 0 deliveries held")

    # Events keep arriving and are verified; their deliveries are held, not run.
    for n in range(3):
        receive_github(Client(), delivery=f"held-{n}")
    inbox_run_once()
    deliveries_run_due()
    assert push_handler.calls == []
    assert set(Delivery.objects.values_list("status", flat=True)) == {"held"}

    page.reload()
    row = page.locator("#pauses-active tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("3")
    expect(row).to_have_attribute("data-level", "green")
    page.goto(f"{live_server.url}/ops/")
    expect(page.locator("#ops-pauses")).to_contain_text(name)
    expect(page.locator("#ops-pauses")).to_contain_text("the downstream CRM is down")
    expect(page.locator("#source-disable-link")).to_be_visible()
    screenshot(page, "console-pauses-ops.png", tmp_path)

    page.goto(f"{live_server.url}/ops/pauses/")
    page.locator("#pauses-active input[type=submit]").click()
    expect(page.locator("ul.messagelist")).to_contain_text("3 deliveries released")
    expect(page.locator("#pauses-none")).to_be_visible()
    assert list(
        OperatorAction.objects.order_by("id").values_list("action", "outcome", "actor_username")
    ) == [("handler_pause", "succeeded", "oncall"), ("handler_resume", "succeeded", "oncall")]
