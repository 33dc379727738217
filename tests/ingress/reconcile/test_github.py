"""reconcile_github against a local fake GitHub API, with `requests` and the real ingress."""

from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from fakes.github import github_time
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent, ReconciliationRun
from ingress.reconcile.errors import (
    AUTH_REFUSED,
    BAD_HOOK,
    FOREIGN_NEXT_LINK,
    PERMISSION_DENIED,
    RATE_LIMITED,
    UNAVAILABLE,
)
from ingress.reconcile.github import FAILED_BUT_HERE, REDELIVERY_REFUSED
from tests.ingress.reconcile.conftest import GITHUB_TOKEN, REPO_HOOK, receive_github, run

pytestmark = pytest.mark.django_db

HOOK_ARGS = ("--hook-id", "7", "--repo", "acme/app")


def ago(**delta):
    return timezone.now() - timedelta(**delta)


@pytest.fixture
def deliveries(client, github_api):
    """One guid per case, as GitHub lists them, and our side of each."""
    add = github_api.add_delivery
    cases = {
        "known-ok": add(REPO_HOOK, guid="g-known-ok", delivered_at=ago(hours=5)),
        "failed-unknown": add(
            REPO_HOOK, guid="g-failed-unknown", delivered_at=ago(hours=4), status_code=502
        ),
        "ok-unknown": add(REPO_HOOK, guid="g-ok-unknown", delivered_at=ago(hours=3)),
        "failed-then-redelivered": add(
            REPO_HOOK, guid="g-retried", delivered_at=ago(hours=3, minutes=30), status_code=502
        ),
        "failed-but-here": add(
            REPO_HOOK, guid="g-late-answer", delivered_at=ago(hours=2), status_code=0
        ),
        "pending": add(REPO_HOOK, guid="g-pending", delivered_at=ago(hours=1)),
    }
    add(REPO_HOOK, guid="g-retried", delivered_at=ago(hours=2, minutes=30), redelivery=True)
    for guid in ("g-known-ok", "g-retried", "g-late-answer"):
        receive_github(client, guid)
    inbox_run_once()
    receive_github(client, "g-pending")  # stored, not yet verified
    return cases


def test_failed_and_unknown_deliveries_are_redelivered_once(
    client, github_api, push_handler, deliveries
):
    output = run("reconcile_github", *HOOK_ARGS)

    expected = [
        (REPO_HOOK, deliveries["ok-unknown"]["id"]),
        (REPO_HOOK, deliveries["failed-unknown"]["id"]),
    ]
    assert github_api.redeliveries == expected
    record = ReconciliationRun.objects.get()
    assert (record.provider, record.scope, record.status) == (
        "github",
        "repo acme/app hook 7",
        "complete",
    )
    counts = (
        record.provider_count,
        record.known_count,
        record.pending_count,
        record.missing_count,
        record.redelivered_count,
    )
    assert counts == (6, 3, 1, 2, 2)
    assert record.drift == pytest.approx(2 / 6)
    assert record.missing_ids == ["g-ok-unknown", "g-failed-unknown"]
    assert FAILED_BUT_HERE.format(count=1) in record.notes
    assert "missing: g-failed-unknown delivery" in output
    assert "Invalid HTTP Response: 502 (HTTP 502)" in output
    assert "redelivered 2; drift 33.3333 %" in output
    assert all(r["authorization"] == f"Bearer {GITHUB_TOKEN}" for r in github_api.requests)

    # Straight away again: the redeliveries GitHub just listed are in flight, not asked twice.
    run("reconcile_github", *HOOK_ARGS)
    assert github_api.redeliveries == expected
    assert ReconciliationRun.objects.all()[0].missing_count == 0  # the newest run

    # They arrive, signed, through the normal ingress; once they have settled, a run finds
    # them known.
    receive_github(client, "g-ok-unknown")
    receive_github(client, "g-failed-unknown")
    inbox_run_once()
    for delivery in github_api.deliveries[REPO_HOOK]:
        if delivery["redelivery"] and delivery["guid"] != "g-retried":
            delivery["delivered_at"] = github_time(ago(minutes=20))
    run("reconcile_github", *HOOK_ARGS)
    latest = ReconciliationRun.objects.all()[0]  # the newest run
    assert (latest.provider_count, latest.missing_count, latest.drift) == (6, 0, 0)
    assert github_api.redeliveries == expected
    assert Counter(push_handler.calls) == {
        guid: 1
        for guid in (
            "g-known-ok",
            "g-retried",
            "g-late-answer",
            "g-pending",
            "g-ok-unknown",
            "g-failed-unknown",
        )
    }


def test_dry_run_lists_and_touches_nothing(github_api, deliveries):
    before = RawEvent.objects.count()

    output = run("reconcile_github", *HOOK_ARGS, "--dry-run")

    assert "github reconciliation (dry run, nothing changed) [repo acme/app hook 7] complete" in (
        output
    )
    assert "missing 2, would redeliver 2" in output
    assert "missing: g-ok-unknown" in output and "missing: g-failed-unknown" in output
    assert not [r for r in github_api.requests if r["method"] == "POST"]
    assert not ReconciliationRun.objects.exists()
    assert RawEvent.objects.count() == before


def test_pagination_follows_the_link_header(github_api, deliveries):
    run("reconcile_github", *HOOK_ARGS, "--dry-run")

    listed = github_api.list_requests()
    assert [r["query"].get("cursor") for r in listed] == [None, "v1_3", "v1_6"]
    assert listed[0]["query"]["per_page"] == "100"
    assert all(r["path"] == f"{REPO_HOOK}/deliveries" for r in listed)


def test_in_flight_and_too_old_deliveries_are_left_alone(github_api):
    github_api.add_delivery(
        REPO_HOOK, guid="g-ancient", delivered_at=ago(hours=60), status_code=502
    )
    github_api.add_delivery(REPO_HOOK, guid="g-old", delivered_at=ago(hours=50))
    github_api.add_delivery(REPO_HOOK, guid="g-lost", delivered_at=ago(hours=10), status_code=500)
    github_api.add_delivery(
        REPO_HOOK, guid="g-just-now", delivered_at=ago(minutes=1), status_code=502
    )
    for n in range(3):  # a full page of recent ones, so the old ones are on later pages
        github_api.add_delivery(REPO_HOOK, guid=f"g-flight-{n}", delivered_at=ago(seconds=n))

    run("reconcile_github", *HOOK_ARGS)

    record = ReconciliationRun.objects.get()
    assert (record.provider_count, record.missing_ids) == (1, ["g-lost"])
    assert [guid for _, guid in _redelivered_guids(github_api)] == ["g-lost"]
    # Paging stopped at the first page reaching past the window's start.
    assert len(github_api.list_requests()) == 2


def _redelivered_guids(github_api):
    by_id = {d["id"]: d["guid"] for d in github_api.listed(REPO_HOOK)}
    return [(hook, by_id[delivery_id]) for hook, delivery_id in github_api.redeliveries]


def test_an_organization_hook_uses_the_org_endpoints(github_api):
    hook = "/orgs/acme/hooks/9"
    github_api.add_delivery(hook, guid="g-org", delivered_at=ago(hours=1), status_code=502)

    run("reconcile_github", "--hook-id", "9", "--org", "acme")

    assert github_api.list_requests()[0]["path"] == f"{hook}/deliveries"
    assert [h for h, _ in github_api.redeliveries] == [hook]
    assert ReconciliationRun.objects.get().scope == "org acme hook 9"


def test_a_refused_redelivery_is_noted_and_the_run_goes_on(github_api, deliveries):
    github_api.refused_redeliveries = {deliveries["ok-unknown"]["id"]}

    run("reconcile_github", *HOOK_ARGS)

    record = ReconciliationRun.objects.get()
    assert (record.status, record.missing_count, record.redelivered_count) == ("complete", 2, 1)
    assert (
        REDELIVERY_REFUSED.format(
            guid="g-ok-unknown",
            delivery_id=deliveries["ok-unknown"]["id"],
            detail="HTTP 422 Delivery is too old to be redelivered",
        )
        in record.notes
    )


def test_bad_credentials_fail_the_run_without_a_traceback(github_api, deliveries, settings):
    settings.GITHUB_API_TOKEN = "ghp_wrong"

    with pytest.raises(CommandError) as failed:
        run("reconcile_github", *HOOK_ARGS)

    message = AUTH_REFUSED.format(provider="GitHub", status=401, setting="GITHUB_API_TOKEN")
    assert str(failed.value) == message
    record = ReconciliationRun.objects.get()
    assert (record.status, record.error, record.drift) == ("failed", message, None)
    assert "ghp_" not in record.error
    assert not github_api.redeliveries


def test_a_token_without_permission_fails_the_run(github_api, deliveries):
    github_api.forbidden = True

    with pytest.raises(CommandError):
        run("reconcile_github", *HOOK_ARGS)

    assert ReconciliationRun.objects.get().error == PERMISSION_DENIED.format(
        provider="GitHub",
        status=403,
        setting="GITHUB_API_TOKEN",
        needed="to read and redeliver the hook's deliveries (webhooks: write)",
    )


@pytest.mark.parametrize(
    ("kind", "status", "wait"),
    [
        ("primary", 403, ", limit resets 2030-01-01T00:00:00Z"),
        ("secondary", 429, ", Retry-After 60 s"),
    ],
)
def test_a_rate_limit_stops_the_run_incomplete(github_api, deliveries, kind, status, wait):
    github_api.rate_limited = kind
    # Two pages are listed; the first redelivery (found on the second page) is refused.
    github_api.rate_limit_from_request = 3

    output = run("reconcile_github", *HOOK_ARGS)

    record = ReconciliationRun.objects.get()
    expected = RATE_LIMITED.format(provider="GitHub", status=status, wait=wait, pages=2)
    assert (record.status, record.error) == ("incomplete", expected)
    # g-known-ok is on the third page, which was never listed.
    assert (record.pages, record.provider_count, record.redelivered_count) == (2, 5, 0)
    assert record.missing_ids == ["g-ok-unknown", "g-failed-unknown"]
    assert expected in output


def test_server_errors_are_retried_a_bounded_number_of_times(github_api, deliveries, settings):
    settings.GITHUB_MAX_RETRIES = 1
    github_api.server_errors = 1
    run("reconcile_github", *HOOK_ARGS, "--dry-run")
    assert len(github_api.list_requests()) == 4  # one retried page + two more pages

    github_api.server_errors = 2
    run("reconcile_github", *HOOK_ARGS)
    record = ReconciliationRun.objects.get()
    assert record.status == "incomplete"
    assert record.error == UNAVAILABLE.format(provider="GitHub", detail="HTTP 502", pages=0)


def test_a_next_link_to_another_host_is_not_followed(github_api, deliveries):
    github_api.next_link_base = "https://collector.example"

    with pytest.raises(CommandError):
        run("reconcile_github", *HOOK_ARGS)

    record = ReconciliationRun.objects.get()
    assert record.error == FOREIGN_NEXT_LINK.format(base=github_api.url)
    assert len(github_api.list_requests()) == 1


def test_the_hook_must_be_named_properly(github_api):
    with pytest.raises(CommandError) as refused:
        run("reconcile_github", "--hook-id", "7", "--repo", "acme/../../users")
    assert str(refused.value) == BAD_HOOK.format(spec="acme/../../users:7")
    with pytest.raises(CommandError):
        run("reconcile_github", "--hook-id", "7", "--repo", "acme/app", "--org", "acme")
    with pytest.raises(CommandError):
        run("reconcile_github", "--hook-id", "7")
    assert not github_api.requests
