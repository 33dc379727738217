"""The on-call runbook end to end in a real browser (Playwright, Debian's chromium), at
1,366 px with the admin's sidebar open: a rejected event found through its incident and
re-verified, a pause with a reason then resumed, a bulk job from a list's filter, an incident
acknowledged and its group re-armed — and on every list, the key columns inside the window
(their headers' bounding boxes).

The worker is the test itself (console.jobs.services.bulk_job_run, the inbox's functions), as in
test_browser_jobs.py; the live server runs in this process.
"""

import os
import re

import pytest
from django.test import Client
from django.utils import timezone

from console.jobs import services as bulk_jobs
from console.models import BulkJob, Incident, OperatorAction
from ingress.deliveries import deliveries_run_due
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from ingress.sources import all_sources
from outbox.models import RecapSideEffect
from tests.console import test_browser as browser_tests
from tests.console.conftest import receive_github
from tests.console.samples import side_effect
from tests.console.test_browser import screenshot

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

browser = browser_tests.browser
page = browser_tests.page

LAPTOP = {"width": 1366, "height": 768}
PUSH_HANDLER = "tests.console.conftest.push_handler.<locals>.console_test_on_push"
# Each list, and the columns that must be inside the window (header cells).
LISTS = {
    "/admin/ingress/rawevent/": [
        f"th.column-{name}"
        for name in (
            "signature_badge",
            "reason_column",
            "dispatch_badge",
            "age",
            "source",
            "event_type_link",
        )
    ],
    "/admin/ingress/delivery/": [
        *(
            f"th.column-{name}"
            for name in ("status_badge", "event_link", "handler_column", "next_attempt_column")
        ),
        # The error column, with or without its message (the payload permission decides).
        "th.column-short_error, th.column-short_error_without_message",
    ],
    "/admin/outbox/recapsideeffect/": [
        f"th.column-{name}"
        for name in ("status_badge", "recap_link", "last_error_class", "short_error", "attempts")
    ],
    "/admin/recaps/recapvideo/": [
        f"th.column-{name}" for name in ("short_id", "status_badge", "render_state", "paid")
    ],
    "/admin/console/operatoraction/": [
        f"th.column-{name}"
        for name in ("outcome_badge", "action", "actor_username", "started", "counts")
    ],
    "/ops/jobs/": ["#jobs-list thead th"],
    "/ops/incidents/": ["#incidents thead th"],
    "/ops/pauses/": ["#pause-handlers thead th", "#pause-sources thead th"],
}


@pytest.fixture
def enqueued(monkeypatch):
    jobs: list[int] = []
    monkeypatch.setattr(bulk_jobs, "_enqueue", jobs.append)
    return jobs


# The part of an element that can be seen without scrolling: its box, clipped by the window
# and by every ancestor that clips its overflow (the admin's list scrolls sideways inside
# its own box, beside the filters: a column past that box's edge is cut off, not shown).
VISIBLE_PART = """element => {
    const box = element.getBoundingClientRect();
    let left = 0, right = window.innerWidth;
    for (let node = element.parentElement; node; node = node.parentElement) {
        if (getComputedStyle(node).overflowX !== "visible") {
            const clip = node.getBoundingClientRect();
            left = Math.max(left, clip.left);
            right = Math.min(right, clip.right);
        }
    }
    return {left: box.left, right: box.right, visibleLeft: left, visibleRight: right};
}"""


def assert_key_columns_inside(page, live_server, path: str) -> None:
    page.goto(f"{live_server.url}{path}")
    sidebar = page.locator("#nav-sidebar")
    assert sidebar.count() == 0 or sidebar.is_visible(), path  # the admin's sidebar is open
    for selector in LISTS[path]:
        cells = page.locator(selector)
        assert cells.count() > 0, (path, selector)
        for n in range(cells.count()):
            box = cells.nth(n).evaluate(VISIBLE_PART)
            inside = (
                box["left"] >= box["visibleLeft"] - 0.5
                and box["right"] <= box["visibleRight"] + 0.5
            )
            assert inside, (path, selector, n, box)


def test_the_runbook_end_to_end(page, live_server, push_handler, enqueued, admin_user, tmp_path):
    from playwright.sync_api import expect

    page.set_viewport_size(LAPTOP)
    # The store as on-call finds it: a push handled, one forged push rejected, a handler
    # that died on 6 events with one cause, a recap whose render died.
    receive_github(Client(), {"ref": "refs/heads/main"}, delivery="ok-" + "a" * 33)
    rejected = receive_github(Client(), {"zen": "rotated"}, delivery="rotated", secret="old-one")
    for n in range(6):
        receive_github(Client(), {"n": n}, delivery=f"crm-{n:02d}-" + "b" * 28)
    inbox_run_once()
    deliveries_run_due()
    Delivery.objects.exclude(raw_event__delivery_id__startswith="ok-").update(
        status="dead",
        attempts=5,
        last_error="ConnectionError: the CRM refused the connection",
        finished_at=timezone.now(),
    )
    render = side_effect(Client(), admin_user)
    RecapSideEffect.objects.filter(pk=render.pk).update(
        status="dead",
        attempts=5,
        last_error_class="http_422",
        last_error="422 Unprocessable Entity: the photo set is empty",
        finished_at=timezone.now(),
    )

    # 1. A rejected event, found through its incident on the ops page, re-verified.
    page.goto(f"{live_server.url}/ops/")
    incidents = page.locator("#ops-incidents")
    expect(incidents).to_contain_text("bad_signature")
    expect(incidents).to_contain_text("ConnectionError")
    page.locator("#ops-incidents a.incident-link", has_text="bad_signature").click()
    expect(page.locator("#incident-state")).to_contain_text("1 rejected events of github")
    expect(page.locator("#incident-rearm")).to_have_count(0)  # nothing to re-arm there
    page.click("#incident-sample")
    expect(page.locator("#content h2").first).to_contain_text(
        f"github #{rejected.pk}: rejected: bad_signature"
    )
    expect(page.locator("#console-replay")).to_have_count(0)  # refused on a rejected event
    os.environ["GITHUB_WEBHOOK_SECRET"] = f"{os.environ['GITHUB_WEBHOOK_SECRET']},old-one"
    all_sources.cache_clear()
    try:
        page.click("#console-reverify")
        page.click("#operator-action-confirm")
        expect(page.locator("ul.messagelist")).to_contain_text("Re-verify: 1 succeeded")
        expect(page.locator("#raw-event-status")).to_contain_text("verified")
    finally:
        os.environ["GITHUB_WEBHOOK_SECRET"] = os.environ["GITHUB_WEBHOOK_SECRET"].rsplit(",", 1)[0]
        all_sources.cache_clear()
    assert RawEvent.objects.get(pk=rejected.pk).signature_status == "verified"

    # 2. A pause with a reason, its held deliveries, then resumed.
    page.goto(f"{live_server.url}/ops/pauses/")
    page.click(f'a.pause-handler[data-handler="{PUSH_HANDLER}"]')
    page.click("#pause-confirm-submit")  # no reason: the browser asks for one
    expect(page.locator("#pause-confirm")).to_be_visible()
    page.fill("#id_reason", "the CRM is down, vendor ticket 4711")
    page.click("#pause-confirm-submit")
    expect(page.locator("ul.messagelist")).to_contain_text("Paused handler")
    receive_github(Client(), {"late": True}, delivery="while-paused")
    inbox_run_once()
    deliveries_run_due()
    row = page.locator("#pauses-active tbody tr")
    page.reload()
    expect(row).to_contain_text("the CRM is down, vendor ticket 4711")
    expect(row).to_contain_text("oncall")
    expect(row).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · .+ ago"))
    # Held: the late event's delivery, and the re-verified one's, due when the pause began.
    row.locator("a.pause-held").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    expect(page.locator("#result_list")).to_contain_text("held")
    page.goto(f"{live_server.url}/ops/pauses/")
    page.locator("#pauses-active input[type=submit]").click()
    expect(page.locator("ul.messagelist")).to_contain_text("2 deliveries released")

    # 3. A bulk job from a list's filter: the verified github events, replayed.
    page.goto(
        f"{live_server.url}/admin/ingress/rawevent/?signature_status__exact=verified&source=github"
    )
    page.click("#bulk-job-from-filter")
    expect(page.locator("#id_kind")).to_have_value("replay_raw_events")
    # The status list follows the kind: a delivery's "dead" is not offered for raw events.
    offered = page.locator("#id_status").evaluate(
        "select => [...select.querySelectorAll('optgroup:not([disabled]) option')]"
        ".map(option => option.value)"
    )
    assert offered == ["pending", "verified", "rejected", "questioned"], offered
    page.click("#jobs-preview")
    expect(page.locator("#job-total")).to_have_text("9")
    page.click("#job-start")
    job = BulkJob.objects.get()
    bulk_jobs.bulk_job_run(job_id=job.id)
    page.reload()
    expect(page.locator("#job-state")).to_have_attribute("data-state", "done")
    expect(page.locator("#job-started-by")).to_contain_text("started by oncall")

    # 4. The dead deliveries' incident acknowledged and its group re-armed as one job.
    Delivery.objects.filter(raw_event__delivery_id__startswith="crm-").update(
        status="dead",
        last_error="ConnectionError: the CRM refused the connection",
        finished_at=timezone.now(),
    )
    page.goto(f"{live_server.url}/ops/incidents/")
    page.locator("#incidents a.incident-link", has_text="ConnectionError").click()
    expect(page.locator("#incident-state")).to_contain_text("6 dead deliveries")
    page.click("#incident-acknowledge")
    expect(page.locator("#incident-state")).to_have_attribute("data-state", "acknowledged")
    expect(page.locator("#incident-facts")).to_contain_text("by oncall at")
    screenshot(page, "console-incident.png", tmp_path)
    page.click("#incident-rearm")
    expect(page.locator("#job-total")).to_have_text("6")
    page.click("#job-start")
    rearm = BulkJob.objects.latest("id")
    assert (rearm.kind, rearm.state) == ("rearm_deliveries", "queued")
    bulk_jobs.bulk_job_run(job_id=rearm.id)
    deliveries_run_due()
    assert not Delivery.objects.filter(status="dead").exists()
    page.goto(f"{live_server.url}/ops/incidents/?kind=dead_deliveries")
    expect(page.locator("#incidents-none")).to_be_visible()
    assert Incident.objects.get().acknowledged_by == "oncall"
    assert OperatorAction.objects.filter(action="incident_acknowledge").count() == 1

    # 5. Every list's key columns inside a 1,366 px window, sidebar open.
    for path in LISTS:
        assert_key_columns_inside(page, live_server, path)
    page.goto(f"{live_server.url}/admin/ingress/rawevent/")
    screenshot(page, "console-raw-events.png", tmp_path)
