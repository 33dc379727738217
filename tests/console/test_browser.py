"""The console in a real browser: Playwright driving Debian's chromium against live_server.

An on-call engineer's path: sign in, find an event by a fragment of its body, open it,
replay it, confirm, and watch the delivery appear and then run.

Set EVENTDROP_SCREENSHOTS=1 to refresh the screenshot kept in docs/.
"""

import json
import os
import re
from pathlib import Path

import pytest
from django.db import connections
from django.test import Client

from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from ingress.sources import all_sources
from tests.console.conftest import receive_github
from tests.support.tools import tool

# Playwright's sync API runs an asyncio loop in this thread; Django's ORM calls made here by
# the test itself are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=tool(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()
            # Django keeps connections per async context, and Playwright's sync API gives this
            # thread one of its own: close what the test opened inside it, or the test
            # database cannot be dropped at the end of the session.
            connections.close_all()


@pytest.fixture
def page(browser, live_server, django_user_model):
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "pw-oncall-1")
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/ingress/rawevent/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", "pw-oncall-1")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/ingress/rawevent/")
    yield page
    context.close()


def screenshot(page, name: str, tmp_path: Path) -> Path:
    target = DOCS / name if os.environ.get("EVENTDROP_SCREENSHOTS") == "1" else tmp_path / name
    page.screenshot(path=str(target), full_page=True)
    return target


def test_find_open_and_replay_an_event(page, tmp_path):
    from playwright.sync_api import expect

    # A push arrives while no handler for it is deployed: verified, but nothing to deliver.
    body = {"ref": "refs/heads/main", "pusher": {"name": "ada"}, "head_commit": "c0ffee42beef"}
    event = receive_github(Client(), body, delivery="6a1e2f00-browser", event="push")
    other = receive_github(Client(), {"ref": "refs/heads/other"}, delivery="other")
    inbox_run_once()
    event.refresh_from_db()
    assert (event.signature_status, event.dispatch_status) == ("verified", "no_handler")

    calls: list[int] = []
    detail_url = re.compile(rf"/admin/ingress/rawevent/{event.id}/change/")

    def on_push_deployed_later(raw_event, payload):
        calls.append(raw_event.id)

    webhook_handler(provider="github", event_types=["push"])(on_push_deployed_later)
    try:
        # Search by a fragment of the body: its own form, not the search box (ids and keys).
        page.fill("#body-search-term", "c0ffee42beef")
        page.press("#body-search-term", "Enter")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("6a1e2f00-browser")
        assert str(other.id) not in rows.first.inner_text().split()

        rows.first.locator("th.field-id a").click()
        page.wait_for_url(detail_url)
        expect(page.locator("#raw-event-body")).to_contain_text('"head_commit": "c0ffee42beef"')
        expect(page.locator("#raw-event-no-deliveries")).to_be_visible()

        # Replay, confirm on the page that says how many rows it will touch.
        page.click("#console-replay")
        expect(page.locator("#operator-action-count")).to_contain_text(
            "This will touch 1 raw event."
        )
        page.click("#operator-action-confirm")
        page.wait_for_url(detail_url)
        expect(page.locator("ul.messagelist")).to_contain_text("Replay: 1 succeeded")
        deliveries = page.locator("#raw-event-deliveries")
        expect(deliveries).to_contain_text("on_push_deployed_later")
        expect(deliveries.locator(".delivery-row")).to_contain_text("pending")

        # The worker runs it; the page shows the attempt.
        inbox_run_once()
        page.reload()
        expect(deliveries.locator(".delivery-row")).to_contain_text("done")
        expect(deliveries.locator(".attempt-row")).to_contain_text("attempt 1: done")
        expect(page.locator("#object-operator-actions")).to_contain_text(
            "replay raw events by oncall via admin: ok — 1 deliveries queued"
        )
        assert calls == [event.id]
        assert Delivery.objects.get(raw_event_id=event.id).status == "done"
        assert RawEvent.objects.get(pk=event.id).handled_at is not None
        shot = screenshot(page, "console-event-detail.png", tmp_path)
        assert shot.stat().st_size > 10_000
        assert json.loads(bytes(RawEvent.objects.get(pk=event.id).body)) == body
    finally:
        unregister(f"{on_push_deployed_later.__module__}.{on_push_deployed_later.__qualname__}")


def test_rearm_a_dead_side_effect_and_see_it_dispatched(
    page, live_server, dead_side_effect, tmp_path
):
    from playwright.sync_api import expect

    from outbox.dispatcher import dispatch_run
    from outbox.models import RecapSideEffect
    from recaps.models import RecapStatus, RecapVideo

    page.goto(f"{live_server.url}/admin/outbox/recapsideeffect/?status__exact=dead")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("http_422")

    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "rearm_selected")
    page.click("button[name=index]")
    expect(page.locator("#operator-action-count")).to_contain_text(
        "This will touch 1 recap side effect."
    )
    expect(page.locator("#operator-action-breakdown")).to_contain_text("dead")
    page.click("#operator-action-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text("Re-arm: 1 succeeded")
    expect(rows).to_have_count(0)  # no longer dead

    # The dispatcher's next run sends it to the (recovered) render service.
    report = dispatch_run()
    assert report.claimed == 1
    page.goto(f"{live_server.url}/admin/outbox/recapsideeffect/{dead_side_effect.pk}/change/")
    expect(page.locator(".field-status")).to_contain_text("done")
    history = page.locator("#history-group")
    expect(history).to_contain_text("re-armed by an operator")
    expect(history).to_contain_text("permanent error")  # the 422, a verdict about it
    expect(history.locator("tr.has_original, tr.form-row").last).to_contain_text("done")
    expect(page.locator("#object-operator-actions")).to_contain_text(
        "re-arm side effects by oncall via admin: ok — re-armed: pending, due now"
    )
    screenshot(page, "console-side-effect.png", tmp_path)
    assert RecapSideEffect.objects.get(pk=dead_side_effect.pk).status == "done"
    assert RecapVideo.objects.get().status == RecapStatus.RENDERING


# --- reading at a glance (issue 11) --------------------------------------------------------

LAPTOP = {"width": 1366, "height": 768}
STATUS_COLUMNS = ("signature_badge", "reason_column", "dispatch_badge", "age")


def test_the_list_at_1366_px_shows_the_status_columns(page, live_server, tmp_path):
    from playwright.sync_api import expect

    # A rejected, an unhandled and a verified-and-handled event, with long delivery ids.
    receive_github(Client(), delivery="a" * 36, secret="a-wrong-secret")
    receive_github(Client(), delivery="b" * 36, event="star")
    receive_github(Client(), {"ref": "refs/heads/main"}, delivery="c" * 36)
    inbox_run_once()

    page.set_viewport_size(LAPTOP)
    page.goto(f"{live_server.url}/admin/ingress/rawevent/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    for column in STATUS_COLUMNS:
        header = page.locator(f"#result_list thead th.column-{column}")
        box = header.bounding_box()
        assert box is not None, column
        assert box["x"] >= 0 and box["x"] + box["width"] <= LAPTOP["width"], (column, box)
    # Coloured words: the word is there, and its badge has a background of its own.
    rejected = page.locator("td.field-signature_badge .console-tone-bad", has_text="rejected")
    expect(rejected).to_have_count(1)
    background = rejected.evaluate("node => getComputedStyle(node).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")
    expect(page.locator("td.field-dispatch_badge", has_text="no handler")).to_have_count(2)
    # Times to the second, with their age.
    expect(rows.first.locator("td.field-age")).to_have_text(
        re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · .+ ago")
    )
    screenshot(page, "console-raw-events.png", tmp_path)


def test_reverify_from_the_event_page_after_fixing_the_secret(page, live_server, monkeypatch):
    from playwright.sync_api import expect

    rejected = receive_github(Client(), delivery="wrong-secret", secret="the-old-secret")
    inbox_run_once()
    page.goto(f"{live_server.url}/admin/ingress/rawevent/{rejected.pk}/change/")
    expect(page.locator("#content h2").first).to_contain_text(
        f"github #{rejected.pk}: rejected: bad_signature"
    )
    expect(page.locator("#raw-event-next-step")).to_contain_text("then Re-verify this event")
    expect(page.locator(".field-rejected_at")).to_contain_text("Rejected at")

    # The fix: the secret the sender used is configured (a rotation adds it beside the old).
    # The live server runs in this process: it reads the sources again after cache_clear().
    monkeypatch.setenv(
        "GITHUB_WEBHOOK_SECRET", f"{os.environ['GITHUB_WEBHOOK_SECRET']},the-old-secret"
    )
    all_sources.cache_clear()
    try:
        page.click("#console-reverify")
        expect(page.locator("#operator-action-count")).to_contain_text("1 raw event")
        page.click("#operator-action-confirm")
        page.wait_for_url(re.compile(rf"/admin/ingress/rawevent/{rejected.pk}/change/"))
        expect(page.locator("ul.messagelist")).to_contain_text("Re-verify: 1 succeeded")
        expect(page.locator("#raw-event-status")).to_contain_text("verified, no handler")
        expect(page.locator(".field-verified_at_display")).to_contain_text("Verified at")
        expect(page.locator("#console-reverify")).to_have_count(0)
    finally:
        monkeypatch.undo()
        all_sources.cache_clear()
    assert RawEvent.objects.get(pk=rejected.pk).signature_status == "verified"


def test_rearm_from_the_side_effect_page(page, live_server, dead_side_effect, tmp_path):
    from playwright.sync_api import expect

    from outbox.models import RecapSideEffect

    detail = f"{live_server.url}/admin/outbox/recapsideeffect/{dead_side_effect.pk}/change/"
    page.goto(detail)
    expect(page.locator(".field-next_attempt")).to_contain_text("none: dead")
    expect(page.locator("#console-mark-dead")).to_have_count(0)
    expect(page.locator("#console-retry-render")).to_be_visible()
    page.click("#console-rearm")
    expect(page.locator("#operator-action-count")).to_contain_text("1 recap side effect")
    page.click("#operator-action-confirm")
    page.wait_for_url(detail)
    expect(page.locator("ul.messagelist")).to_contain_text("Re-arm: 1 succeeded")
    expect(page.locator(".field-status")).to_contain_text("pending")
    expect(page.locator(".field-next_attempt")).to_contain_text(re.compile(r"\d\d:\d\d:\d\d UTC"))
    expect(page.locator("#console-mark-dead")).to_be_visible()
    assert RecapSideEffect.objects.get(pk=dead_side_effect.pk).status == "pending"


def test_the_ops_charts_render(page, live_server, tmp_path):
    from playwright.sync_api import expect

    for n in range(3):
        receive_github(Client(), delivery=f"ops-{n}", event="star")
    receive_github(Client(), delivery="ops-bad", secret="a-wrong-secret")
    inbox_run_once()
    page.set_viewport_size(LAPTOP)
    page.goto(f"{live_server.url}/ops/")
    for key in ("volume", "rejected", "lags", "dead"):
        chart = page.locator(f"svg#chart-{key}")
        expect(chart).to_be_visible()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, (key, box)
    expect(page.locator("svg#chart-volume rect.ops-bar")).to_have_count(1)
    expect(page.locator("svg#chart-volume rect.ops-bar title")).to_have_text(
        re.compile(r"\d\d:00 github: 4")
    )
    expect(page.locator("svg#chart-lags .ops-red-line")).to_have_count(2)
    expect(page.locator("#ops-rejections a").first).to_have_css("text-decoration-line", "underline")
    expect(page.locator("body")).not_to_contain_text("DESIGN.md")
    screenshot(page, "ops-page.png", tmp_path)
