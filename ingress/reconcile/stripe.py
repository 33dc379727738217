"""Stripe: list Events through the SDK, compare them with the dedup index, backfill the missing.

Stripe keeps 30 days of Events and lists them newest first (`GET /v1/events`, `created[gte]`
/ `created[lt]`, cursor `starting_after`, 100 per page). Each page is compared with our
store: an event whose id is in the dedup index was received and verified; one whose body
sits in a raw event still waiting for verification was received and is not missing; the
rest are missing. Missing events are stored as `backfilled` raw events — the event object
exactly as the API returned it, re-serialised as JSON — and from there take the normal path
(verification by fetch, dedup, deliveries, handlers). See verdict.py for why a backfilled
event is trusted without a signature, and why the API base must be TLS.

Only the event types our webhook endpoint receives are compared: the account's Event list
holds every event of every kind, and the ones the endpoint was never subscribed to are not
missing. RECONCILE_STRIPE_EVENT_TYPES names them; unset, the types our Stripe handlers are
registered for are used (all types if one takes "*").

Caveats worth knowing:
- An event's `data` is rendered in the API version of its creation (its `api_version`),
  which may differ from the version the webhook endpoint is pinned to.
- Events of connected accounts are not listed (no `Stripe-Account` header is sent).
"""

import json
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import stripe
from django.conf import settings
from django.utils import timezone

if TYPE_CHECKING:  # the SDK's parameter types (stripe.params exists at runtime from v13)
    from stripe.params import EventListParams

from ingress.handlers import all_handlers
from ingress.reconcile.config import reconcile_source, require_tls
from ingress.reconcile.errors import (
    AUTH_REFUSED,
    NOT_CONFIGURED,
    PAGE_LIMIT,
    PERMISSION_DENIED,
    RATE_LIMITED,
    REQUEST_REFUSED,
    TOO_MANY_TYPES,
    UNAVAILABLE,
    ReconcileError,
    ReconcileFailed,
    ReconcileStopped,
)
from ingress.reconcile.runs import ReconcileOutcome, RunState, reconcile_run
from ingress.reconcile.selectors import pending_body_ids, provider_ids_classify
from ingress.reconcile.services import FetchedEvent, raw_events_backfill
from ingress.reconcile.window import Window, iso, window_clamp
from ingress.sources import Source
from kernel.budgets import BudgetClock, reconcile_budget_problem, reconcile_call_worst_case
from kernel.stripe_api import stripe_client

logger = logging.getLogger(__name__)

MAX_AGE = timedelta(days=30)
PAGE_SIZE = 100  # Stripe's maximum
TYPES_FILTER_MAX = 20  # Stripe's limit on `types`
# A webhook may be stored a little before its event's `created` by our clock (clock skew),
# and a pending row committed a little after its received_at; pending rows are looked for
# with this much slack on both counts.
PENDING_SLACK = timedelta(minutes=5)


def stripe_event_types() -> list[str] | None:
    """The event types to compare, or None for all of them."""
    types = list(settings.RECONCILE_STRIPE_EVENT_TYPES) or sorted(
        {t for spec in all_handlers() if spec.provider == "stripe" for t in spec.event_types}
    )
    if not types or "*" in types:
        return None
    if len(types) > TYPES_FILTER_MAX:
        raise ReconcileFailed(TOO_MANY_TYPES.format(count=len(types)))
    return types


def _stripe_client_checked() -> AbstractContextManager[stripe.StripeClient]:
    if not settings.STRIPE_API_KEY:
        raise ReconcileFailed(NOT_CONFIGURED.format(setting="STRIPE_API_KEY", provider="Stripe"))
    require_tls(
        settings.STRIPE_API_BASE,
        setting="STRIPE_API_BASE",
        purpose="fetch events that will be trusted without a signature",
    )
    return stripe_client()


@dataclass(frozen=True)
class _Page:
    events: list[dict[str, Any]]  # as the API returned them
    request_id: str


def _event_pages(
    client: stripe.StripeClient, window: Window, types: list[str] | None, clock: BudgetClock
) -> Iterator[_Page]:
    params: EventListParams = {
        "limit": PAGE_SIZE,
        "created": {"gte": int(window.since.timestamp()), "lt": int(window.until.timestamp())},
    }
    if types:
        params["types"] = types
    pages = 0
    while True:
        if pages >= settings.RECONCILE_MAX_PAGES:
            raise ReconcileStopped(PAGE_LIMIT.format(pages=pages))
        clock.require("stripe", reconcile_call_worst_case("stripe"))
        try:
            listing = client.v1.events.list(params=params)
        except stripe.StripeError as exc:
            raise _stripe_error(exc, pages) from exc
        pages += 1
        # The raw JSON of the page rather than the SDK's objects: the body we store is what
        # Stripe sent, not what the SDK made of it.
        response = listing.last_response
        page = response.data if response else None
        events = list(page.get("data") or []) if isinstance(page, dict) else []
        yield _Page(events=events, request_id=(response.request_id or "") if response else "")
        if not listing.has_more or not events:
            return
        params["starting_after"] = events[-1]["id"]


def _stripe_error(exc: stripe.StripeError, pages: int) -> ReconcileError:
    status = exc.http_status
    logger.warning(
        "ingress.reconcile.stripe_error",
        extra={"error_class": type(exc).__name__, "status": status, "pages": pages},
    )
    if isinstance(exc, stripe.AuthenticationError):
        return ReconcileFailed(
            AUTH_REFUSED.format(provider="Stripe", status=status, setting="STRIPE_API_KEY")
        )
    if isinstance(exc, stripe.PermissionError):
        return ReconcileFailed(
            PERMISSION_DENIED.format(
                provider="Stripe",
                status=status,
                setting="STRIPE_API_KEY",
                needed="to read Events (a restricted key needs Events: read)",
            )
        )
    if isinstance(exc, stripe.RateLimitError):
        return ReconcileStopped(
            RATE_LIMITED.format(provider="Stripe", status=status, wait="", pages=pages)
        )
    if isinstance(exc, stripe.APIConnectionError | stripe.APIError) or (status or 0) >= 500:
        detail = f"HTTP {status}" if status else type(exc).__name__
        return ReconcileStopped(UNAVAILABLE.format(provider="Stripe", detail=detail, pages=pages))
    # Stripe masks keys in its messages; the message still goes through a length cap.
    detail = (exc.code or exc.user_message or type(exc).__name__)[:200]
    return ReconcileFailed(REQUEST_REFUSED.format(provider="Stripe", status=status, detail=detail))


class _PendingBodies:
    """Ids in bodies of pending raw events, re-read incrementally as pages come in."""

    def __init__(self, source: str, since: datetime) -> None:
        self.source = source
        self.ids: set[str] = set()
        self._next_since = since - PENDING_SLACK

    def among(self, candidates: list[str]) -> set[str]:
        scanned_at = timezone.now()
        self.ids |= pending_body_ids(source=self.source, received_since=self._next_since)
        # Rows read once stay in the set (verified since, they are in the dedup index
        # anyway); later reads only need rows stored since, give or take a commit's delay.
        self._next_since = scanned_at - PENDING_SLACK
        return self.ids & set(candidates)


def _fetched(event: dict[str, Any], request_id: str) -> FetchedEvent:
    body = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    headers = {"content-type": "application/json"}
    if request_id:
        headers["request-id"] = request_id
    return FetchedEvent(
        provider_event_id=event["id"], body=body, path=f"/v1/events/{event['id']}", headers=headers
    )


def _describe(event: dict[str, Any]) -> str:
    created = event.get("created")
    when = iso(datetime.fromtimestamp(created, tz=UTC)) if isinstance(created, int) else "?"
    return f"{event['id']} {event.get('type', '?')} created {when}"


def _compare(state: RunState, *, source: Source, window: Window, scheduled: bool) -> None:
    if problem := reconcile_budget_problem(provider="stripe", scheduled=scheduled):
        raise ReconcileFailed(problem)
    types = stripe_event_types()
    with _stripe_client_checked() as client:
        _compare_pages(state, client=client, source=source, window=window, types=types)


def _compare_pages(
    state: RunState,
    *,
    client: stripe.StripeClient,
    source: Source,
    window: Window,
    types: list[str] | None,
) -> None:
    clock = BudgetClock(
        settings.RECONCILE_RUN_BUDGET_SECONDS,
        setting="RECONCILE_RUN_BUDGET_SECONDS",
        exhausted=ReconcileStopped,
    )
    pending = _PendingBodies(source.name, window.since)
    tally = state.tally
    for page in _event_pages(client, window, types, clock):
        tally.pages += 1
        by_id = {e["id"]: e for e in page.events if isinstance(e.get("id"), str)}
        classified = provider_ids_classify(
            source=source.name, provider_ids=list(by_id), pending_among=pending.among
        )
        tally.add(
            known=len(classified.known),
            pending=len(classified.pending),
            missing=classified.missing,
        )
        for event_id in classified.missing:
            state.list_missing(_describe(by_id[event_id]))
        if classified.missing and not state.dry_run:
            rows = raw_events_backfill(
                source=source,
                events=[_fetched(by_id[i], page.request_id) for i in classified.missing],
            )
            tally.backfilled_count += len(rows)
        state.progress()


def stripe_reconcile(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    dry_run: bool = False,
    source: str = "stripe",
    scheduled: bool = False,
) -> ReconcileOutcome:
    """Compare Stripe's Events in the window with our store, and backfill what is missing."""
    window = window_clamp(
        provider="Stripe", max_age=MAX_AGE, now=timezone.now(), since=since, until=until
    )
    configured = reconcile_source(name=source, provider="stripe")
    return reconcile_run(
        provider="stripe",
        label="Stripe",
        source=configured.name,
        scope="",
        window=window,
        dry_run=dry_run,
        compare=lambda state: _compare(
            state, source=configured, window=window, scheduled=scheduled
        ),
    )
