"""The time window a run compares, clamped to what the provider can still list.

Defaults: the window ends RECONCILE_SETTLE_SECONDS before now — an event created a moment
ago may simply not have been delivered yet, and counting it as missing would be false drift
— and starts RECONCILE_LOOKBACK_HOURS before its end, so a nightly run that failed once is
covered by the next. A start older than the provider keeps (Stripe lists 30 days of events,
GitHub 3 days of deliveries) is clamped, and the run says so. Bounds are whole seconds:
Stripe's `created` filter is in Unix seconds, so the window compared is exactly the one
recorded.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from ingress.reconcile.errors import WINDOW_EMPTY, ReconcileInvalid

CLAMPED_START = (
    "--since {requested} is older than the {days} days {provider} keeps: clamped to {clamped}."
)
CLAMPED_END = "--until {requested} is in the future: clamped to now ({clamped})."


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{iso(self.since)} → {iso(self.until)}"


def window_clamp(
    *,
    provider: str,
    max_age: timedelta,
    now: datetime,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Window:
    now = now.replace(microsecond=0)
    notes: list[str] = []
    if until is None:
        until = now - timedelta(seconds=settings.RECONCILE_SETTLE_SECONDS)
    elif until > now:
        notes.append(CLAMPED_END.format(requested=iso(until), clamped=iso(now)))
        until = now
    if since is None:
        since = until - timedelta(hours=settings.RECONCILE_LOOKBACK_HOURS)
    oldest = now - max_age
    if since < oldest:
        notes.append(
            CLAMPED_START.format(
                requested=iso(since), days=max_age.days, provider=provider, clamped=iso(oldest)
            )
        )
        since = oldest
    since, until = since.replace(microsecond=0), until.replace(microsecond=0)
    if since >= until:
        raise ReconcileInvalid(WINDOW_EMPTY.format(since=iso(since), until=iso(until)))
    return Window(since=since, until=until, notes=tuple(notes))
