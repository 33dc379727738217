"""Pause and resume handlers from the console and the API, as audited operator actions.

The mechanism is the inbox's (ingress.services.handler_pause / handler_resume): events keep
being received, stored, verified and deduplicated; the paused scope's deliveries are held,
not run and not charged, and a resume releases them in received order, rate-limited. Here
each pause or resume is recorded as one console.OperatorAction (who, when, which scope, how
many deliveries it held or released), written before the change and finished after it, as
console.services records every other action. A refusal (unknown name, already paused, not
paused) is recorded too, as refused.

The ops page colours a pause by its age (HANDLER_PAUSE_YELLOW_SECONDS, _RED_SECONDS): a
pause is an incident tool, and one forgotten for an hour is a backlog growing unseen.
"""

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError
from django.db.models import Q
from django.utils import timezone

from console.models import (
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
)
from console.presentation import format_seconds, format_time
from console.services import NOTE_REQUIRED, OperatorActionError, operator_action_one
from ingress.models import HandlerPause
from ingress.selectors import ActivePause, handler_pauses_active
from ingress.services import PauseRefused, handler_pause, handler_resume
from kernel.processing_region import require_processing_region

# What disabling a source costs, shown wherever sources are (ops page, job form, pauses).
SOURCE_DISABLE_COST = (
    "Disabling a source (enabled=false) makes its endpoint answer 404: nothing is stored, and "
    "the provider treats every delivery as failed. Stripe retries each event for up to three "
    "days and then disables the endpoint in its dashboard (it must be re-enabled there by "
    "hand); GitHub does not retry at all. To stop processing while still accepting events, "
    "pause the source's handlers instead."
)
PAUSED = "Paused {scope}: {count} deliveries held"
# Two operators (or one double click) pausing the same scope at once: both found it not
# paused, the database's one-active-pause constraint let one in.
PAUSED_CONCURRENTLY = "The {scope} was paused by another request at the same moment."
RESUMED = "Resumed {scope}: {count} deliveries released over {seconds}"


@dataclass(frozen=True)
class PauseRow:
    """An active pause as the ops page and the pauses page show it: who paused it and why
    come from its operator action (the inbox's pause row knows only the scope)."""

    pause: ActivePause
    level: str  # green / yellow / red by age
    actor_username: str = ""
    reason: str = ""

    @property
    def age(self) -> str:
        return format_seconds(self.pause.age_seconds)

    @property
    def since(self) -> str:
        return format_time(self.pause.paused_at, timezone.now())

    @property
    def who_since(self) -> str:
        who = f"by {self.actor_username} " if self.actor_username else ""
        return f"{who}since {self.since}"


def pause_level(age_seconds: float) -> str:
    if age_seconds >= settings.HANDLER_PAUSE_RED_SECONDS:
        return "red"
    if age_seconds >= settings.HANDLER_PAUSE_YELLOW_SECONDS:
        return "yellow"
    return "green"


def pauses_active() -> list[PauseRow]:
    active = handler_pauses_active()
    recorded: dict[int, OperatorAction] = {}
    if active:
        # One query for every pause in force (few: an operator's, during an incident).
        matches = Q()
        for pause in active:
            matches |= Q(target_ids__contains=[pause.id])
        for record in OperatorAction.objects.filter(
            matches,
            action=OperatorActionKind.HANDLER_PAUSE,
            outcome=OperatorActionOutcome.SUCCEEDED,
            target_model=HandlerPause._meta.label_lower,
        ):
            recorded.update(dict.fromkeys(record.target_ids, record))
    rows = []
    for pause in active:
        found = recorded.get(pause.id)
        rows.append(
            PauseRow(
                pause=pause,
                level=pause_level(pause.age_seconds),
                actor_username=found.actor_username if found else "",
                reason=found.note if found else "",
            )
        )
    return rows


def pauses_holding(*, source: str, handlers: set[str]) -> str:
    """The pauses in force over an event of `source` whose deliveries to `handlers` are
    held, with who paused and since when: "handler x (by ada since 10:03:12 UTC)"."""
    described = []
    for row in pauses_active():
        pause = row.pause
        if pause.handler in handlers or pause.source == source:
            described.append(f"{pause.scope} ({row.who_since})")
    return ", ".join(described)


def _scope(handler: str, source: str) -> str:
    return f"handler {handler}" if handler else f"source {source}"


def _record(
    *, actor: User, via: str, kind: str, handler: str, source: str, change, note: str = ""
) -> OperatorAction:
    scope = _scope(handler, source)
    # Pauses are processing state: refused in the standby region before anything is
    # recorded (kernel.processing_region.ProcessingWritesRefused).
    require_processing_region()

    def changed() -> tuple[int, str, dict]:
        try:
            result = change()
        except IntegrityError as exc:
            # change() runs in its own transaction: a violated constraint rolled back only it.
            raise PauseRefused(PAUSED_CONCURRENTLY.format(scope=scope)) from exc
        detail = (
            PAUSED.format(scope=scope, count=result.deliveries)
            if kind == OperatorActionKind.HANDLER_PAUSE
            else RESUMED.format(
                scope=scope,
                count=result.deliveries,
                seconds=format_seconds(result.release_seconds),
            )
        )
        return result.pause.id, detail, {"deliveries": result.deliveries}

    return operator_action_one(
        actor=actor,
        via=via,
        action=kind,
        target_model=HandlerPause._meta.label_lower,
        note=note,
        change=changed,
    )


def handlers_pause(
    *, actor: User, via: str, reason: str, handler: str = "", source: str = ""
) -> OperatorAction:
    """Pause one handler or every handler of one source, saying why; recorded whatever the
    outcome (the reason is the operator action's note, shown beside the pause)."""
    reason = reason.strip()
    if not reason:
        raise OperatorActionError(NOTE_REQUIRED)
    return _record(
        actor=actor,
        via=via,
        kind=OperatorActionKind.HANDLER_PAUSE,
        handler=handler,
        source=source,
        change=lambda: handler_pause(handler=handler, source=source),
        note=reason,
    )


def handlers_resume(
    *, actor: User, via: str, handler: str = "", source: str = ""
) -> OperatorAction:
    """Resume the pause of one handler or source, releasing what it held."""
    return _record(
        actor=actor,
        via=via,
        kind=OperatorActionKind.HANDLER_RESUME,
        handler=handler,
        source=source,
        change=lambda: handler_resume(handler=handler, source=source),
    )
