"""Operator actions: every replay, re-verify, re-arm, mark-dead and retry goes through here.

Each action wraps one domain service (ingress.services, outbox.services, recaps.services),
runs it once per selected object and records the whole action — who, when, what, on which
objects, and each object's outcome — as one console.OperatorAction row. OPERATOR_ACTIONS is
the one table of them: the admin (console/admin/base.py) and the API (console/apis.py)
both run an action from it by its kind.

Transaction boundaries, on purpose:
- The audit row is committed *before* the first object is touched, so a worker killed half-way
  leaves a `running` row naming who started what, instead of no trace.
- Each object runs in the domain service's own transaction. One refused or failing object
  neither rolls back the others nor hides them from the audit trail.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, Group, Permission, User
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.utils import timezone
from knox.models import AuthToken
from knox.settings import CONSTANTS

from console.models import (
    ItemOutcome,
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
    PayloadAccess,
)
from console.presentation import PAYLOAD_FIELDS
from ingress.models import Delivery, RawEvent, SignatureStatus
from ingress.services import (
    deliveries_rearm_batch,
    raw_event_replay,
    raw_event_reverify,
    signature_question_answer,
)
from kernel.errors import EventDropError
from kernel.processing_region import require_processing_region
from outbox.models import RecapSideEffect
from outbox.services import recap_retry_render, side_effect_mark_dead, side_effect_rearm
from recaps.models import RecapVideo

logger = logging.getLogger(__name__)

# One request runs the whole selection synchronously; 500 objects of a few milliseconds each
# stay well inside a web request's budget. Larger selections are narrowed with filters first.
BULK_LIMIT = 500

NOTHING_SELECTED = "Select at least one object."
TOO_MANY_SELECTED = "{count} objects selected; at most {limit} can be acted on at once."
UNKNOWN_OBJECTS = "Unknown {model} ids: {ids}."
NOTE_REQUIRED = "Give a reason: it is recorded with the action."
UNEXPECTED_ERROR = "Unexpected {error}; see the logs for operator action #{action_id}."

REPLAY_QUEUED = "{count} deliveries queued"
REPLAY_NOTHING_QUEUED = "nothing queued: no handler is registered for {provider} {event_type!r}"
REVERIFY_VERIFIED = "verified with secret #{index}; {dispatch}"
REVERIFY_STILL_REJECTED = "still rejected: {reason}"
# A `worker_died` event is not settled in the console's process: the inbox worker takes it.
REVERIFY_HANDED_BACK = "handed back to the inbox worker, to be settled alone (its worker died)"
REPEAT_GENUINE = "genuine: handed to the inbox worker, which handles it as any event"
REPEAT_REPLAYED = "a replay: {status} {reason}, never handled"
# Who answered, on the question; the operator action beside it names the person.
OPERATOR = "operator"
DELIVERY_REARMED = "re-armed: pending, due now"
DELIVERY_RUNNING = "running under a worker that lives: left to it"
DELIVERY_NOT_REARMABLE = "neither dead nor held by a worker that is gone: left as it is"
SIDE_EFFECT_REARMED = "re-armed: {status}, due now"
SIDE_EFFECT_MARKED_DEAD = "marked {status}; the recap is failed with the reason"
RECAP_RENDER_QUEUED = "render queued; recap is {status}"


class OperatorActionError(EventDropError):
    """The request as a whole is invalid; nothing was done and nothing recorded."""


class UnknownObjects(OperatorActionError):
    def __init__(self, message: str, ids: Sequence[object]):
        super().__init__(message)
        self.ids = list(ids)


def acting_user(user: User | AnonymousUser) -> User:
    """The user a console request acts as. The admin and the API admit staff only, so this
    is a signed-in user; an anonymous one here is refused (403), never recorded."""
    if isinstance(user, AnonymousUser):
        raise PermissionDenied
    return user


@dataclass(frozen=True)
class ItemResult:
    outcome: str
    detail: str
    data: dict


def _json_pk(pk: object) -> int | str:
    # Raw events and side effects have integer keys, recaps UUIDs: keep both JSON-friendly.
    return pk if isinstance(pk, int) else str(pk)


def _load(queryset: models.QuerySet, ids: Sequence[object]) -> list[models.Model]:
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise OperatorActionError(NOTHING_SELECTED)
    if len(ids) > BULK_LIMIT:
        raise OperatorActionError(TOO_MANY_SELECTED.format(count=len(ids), limit=BULK_LIMIT))
    found = queryset.in_bulk(ids)
    missing = [pk for pk in ids if pk not in found]
    if missing:
        label = queryset.model._meta.verbose_name
        raise UnknownObjects(
            UNKNOWN_OBJECTS.format(model=label, ids=", ".join(map(str, missing))), missing
        )
    return [found[pk] for pk in ids]


def _outcome(succeeded: int, refused: int, failed: int) -> str:
    if succeeded and not (refused or failed):
        return OperatorActionOutcome.SUCCEEDED
    if succeeded:
        return OperatorActionOutcome.PARTIAL
    if failed:
        return OperatorActionOutcome.FAILED
    return OperatorActionOutcome.REFUSED


def _run(
    *,
    actor: User,
    via: str,
    action: str,
    objects: Sequence[models.Model],
    perform: Callable[[models.Model], ItemResult],
    note: str = "",
) -> OperatorAction:
    record = OperatorAction.objects.create(
        actor=actor,
        actor_username=actor.get_username(),
        action=action,
        via=via,
        target_model=objects[0]._meta.label_lower,
        target_ids=[_json_pk(obj.pk) for obj in objects],
        requested=len(objects),
        note=note,
    )
    results: list[dict] = []
    for obj in objects:
        try:
            result = perform(obj)
        except EventDropError as exc:
            # Domain refusals carry constant, payload-free messages: safe to show and store.
            result = ItemResult(outcome=ItemOutcome.REFUSED, detail=str(exc), data={})
        except Exception as exc:
            # Anything else may quote data; the operator gets the class name and where to look.
            logger.exception(
                "console.operator_action.item_failed",
                extra={
                    "operator_action_id": record.id,
                    "action": action,
                    "object_id": _json_pk(obj.pk),
                },
            )
            detail = UNEXPECTED_ERROR.format(error=type(exc).__name__, action_id=record.id)
            result = ItemResult(outcome=ItemOutcome.ERROR, detail=detail, data={})
        results.append(
            {
                "id": _json_pk(obj.pk),
                "outcome": result.outcome,
                "detail": result.detail,
                **result.data,
            }
        )

    record.results = results
    record.succeeded = sum(1 for item in results if item["outcome"] == ItemOutcome.OK)
    record.refused = sum(1 for item in results if item["outcome"] == ItemOutcome.REFUSED)
    record.failed = sum(1 for item in results if item["outcome"] == ItemOutcome.ERROR)
    record.outcome = _outcome(record.succeeded, record.refused, record.failed)
    return _finished(record)


def _finished(record: OperatorAction) -> OperatorAction:
    record.finished_at = timezone.now()
    record.save(
        update_fields=[
            "target_ids",
            "results",
            "succeeded",
            "refused",
            "failed",
            "outcome",
            "finished_at",
        ]
    )
    logger.info(
        "console.operator_action",
        extra={
            "operator_action_id": record.id,
            "action": record.action,
            "via": record.via,
            "actor": record.actor_username,
            "requested": record.requested,
            "succeeded": record.succeeded,
            "refused": record.refused,
            "failed": record.failed,
        },
    )
    return record


def operator_action_one(
    *,
    actor: User,
    via: str,
    action: str,
    target_model: str,
    note: str,
    change: Callable[[], tuple[int, str, dict]],
) -> OperatorAction:
    """One change of one object (a pause, an incident's state), recorded as every action is:
    written before `change()` runs, finished after it. `change` returns (the object's id,
    the detail, extra result fields); a domain refusal (EventDropError) is recorded as
    refused, with its constant message."""
    record = OperatorAction.objects.create(
        actor=actor,
        actor_username=actor.get_username(),
        action=action,
        via=via,
        target_model=target_model,
        target_ids=[],
        requested=1,
        note=note,
    )
    try:
        target_id, detail, data = change()
    except EventDropError as exc:
        record.refused = 1
        record.outcome = OperatorActionOutcome.REFUSED
        record.results = [{"outcome": ItemOutcome.REFUSED, "detail": str(exc)}]
    else:
        record.succeeded = 1
        record.outcome = OperatorActionOutcome.SUCCEEDED
        record.target_ids = [target_id]
        record.results = [{"id": target_id, "outcome": ItemOutcome.OK, "detail": detail, **data}]
    return _finished(record)


# --- raw events ----------------------------------------------------------------------------


def _raw_events() -> models.QuerySet[RawEvent]:
    # The domain services lock and re-read each row; the payload is not needed up front.
    return RawEvent.objects.defer(*PAYLOAD_FIELDS)


def _replay(raw_event: RawEvent, note: str) -> ItemResult:
    queued = raw_event_replay(raw_event=raw_event)
    # Not a refusal (a handler deployed later makes the same replay useful), but the
    # operator must not read "succeeded" as "something will run".
    detail = (
        REPLAY_QUEUED.format(count=queued)
        if queued
        else REPLAY_NOTHING_QUEUED.format(
            provider=raw_event.provider, event_type=raw_event.event_type
        )
    )
    return ItemResult(outcome=ItemOutcome.OK, detail=detail, data={"deliveries_queued": queued})


def _reverify(raw_event: RawEvent, note: str) -> ItemResult:
    event = raw_event_reverify(raw_event=raw_event)
    if event.signature_status == SignatureStatus.VERIFIED:
        detail = REVERIFY_VERIFIED.format(
            index=event.matched_secret_index, dispatch=event.get_dispatch_status_display()
        )
    elif event.signature_status == SignatureStatus.PENDING:
        detail = REVERIFY_HANDED_BACK
    else:
        detail = REVERIFY_STILL_REJECTED.format(reason=event.rejection_reason)
    return ItemResult(
        outcome=ItemOutcome.OK,
        detail=detail,
        data={
            "signature_status": event.signature_status,
            "rejection_reason": event.rejection_reason,
            "matched_secret_index": event.matched_secret_index,
            "dispatch_status": event.dispatch_status,
        },
    )


def _answer_repeat(*, genuine: bool) -> Callable[[RawEvent, str], ItemResult]:
    """Answer a questioned event's signature question (the operator's reason is the
    evidence) and settle it by the answer: handled as any event, or rejected as a replay."""

    def perform(raw_event: RawEvent, note: str) -> ItemResult:
        event = signature_question_answer(
            raw_event_id=raw_event.pk, genuine=genuine, answered_by=OPERATOR, evidence=note
        )
        detail = (
            REPEAT_GENUINE
            if genuine
            else REPEAT_REPLAYED.format(
                status=event.signature_status, reason=event.rejection_reason
            )
        )
        return ItemResult(
            outcome=ItemOutcome.OK,
            detail=detail,
            data={
                "signature_status": event.signature_status,
                "rejection_reason": event.rejection_reason,
                "dispatch_status": event.dispatch_status,
            },
        )

    return perform


# --- deliveries ------------------------------------------------------------------------------


class DeliveryNotRearmed(EventDropError):
    """Refused: the delivery is running under a live worker, or neither dead nor orphaned."""


def _rearm_delivery(delivery: Delivery, note: str) -> ItemResult:
    """A dead delivery armed afresh, or a claim whose worker is gone taken back (the
    operator's way out: ingress.services.deliveries_rearm_batch)."""
    counts = deliveries_rearm_batch(delivery_ids=[delivery.pk])
    if not counts.rearmed:
        raise DeliveryNotRearmed(DELIVERY_RUNNING if counts.running else DELIVERY_NOT_REARMABLE)
    return ItemResult(outcome=ItemOutcome.OK, detail=DELIVERY_REARMED, data={"status": "pending"})


# --- recap side effects and recaps -----------------------------------------------------------


def _side_effect_result(row: RecapSideEffect, detail: str) -> ItemResult:
    return ItemResult(
        outcome=ItemOutcome.OK,
        detail=detail.format(status=row.status),
        data={"status": row.status, "recap_id": str(row.recap_id)},
    )


def _rearm(row: RecapSideEffect, note: str) -> ItemResult:
    return _side_effect_result(side_effect_rearm(side_effect=row), SIDE_EFFECT_REARMED)


def _mark_dead(row: RecapSideEffect, reason: str) -> ItemResult:
    return _side_effect_result(
        side_effect_mark_dead(side_effect=row, reason=reason), SIDE_EFFECT_MARKED_DEAD
    )


def _retry_render(recap: RecapVideo, note: str) -> ItemResult:
    recap = recap_retry_render(recap=recap)
    return ItemResult(
        outcome=ItemOutcome.OK,
        detail=RECAP_RENDER_QUEUED.format(status=recap.status),
        data={"status": recap.status},
    )


# --- the table the admin and the API both run from ------------------------------------------


@dataclass(frozen=True)
class OperatorActionService:
    """One operator action: which rows it loads, what it does to each, whether it needs a
    note. The admin's confirmation page and the API's endpoint both call it, so an action
    one of them offers is the same action, with the same audit record, in the other."""

    kind: str  # OperatorActionKind
    objects: Callable[[], models.QuerySet]
    # (row, the operator's note): the note is recorded with every action; mark dead also
    # gives it to the domain service, as the recap's failure reason.
    perform: Callable[[Any, str], ItemResult]
    note_required: bool = False

    def __call__(
        self, *, actor: User, ids: Sequence[Any], via: str, note: str = ""
    ) -> OperatorAction:
        note = note.strip()
        if self.note_required and not note:
            raise OperatorActionError(NOTE_REQUIRED)
        # Every action of this table writes processing state: refused as a whole in the
        # standby region, before its audit row (kernel.processing_region.ProcessingWritesRefused).
        require_processing_region()
        return _run(
            actor=actor,
            via=via,
            action=self.kind,
            objects=_load(self.objects(), ids),
            perform=lambda obj: self.perform(obj, note),
            note=note,
        )


OPERATOR_ACTIONS = {
    service.kind: service
    for service in (
        OperatorActionService(OperatorActionKind.RAW_EVENT_REPLAY, _raw_events, _replay),
        OperatorActionService(OperatorActionKind.RAW_EVENT_REVERIFY, _raw_events, _reverify),
        OperatorActionService(
            OperatorActionKind.RAW_EVENT_ACCEPT_REPEAT,
            _raw_events,
            _answer_repeat(genuine=True),
            note_required=True,
        ),
        OperatorActionService(
            OperatorActionKind.RAW_EVENT_REJECT_REPEAT,
            _raw_events,
            _answer_repeat(genuine=False),
            note_required=True,
        ),
        OperatorActionService(
            OperatorActionKind.DELIVERY_REARM, Delivery.objects.all, _rearm_delivery
        ),
        OperatorActionService(
            OperatorActionKind.SIDE_EFFECT_REARM, RecapSideEffect.objects.all, _rearm
        ),
        OperatorActionService(
            OperatorActionKind.SIDE_EFFECT_MARK_DEAD,
            RecapSideEffect.objects.all,
            _mark_dead,
            note_required=True,
        ),
        OperatorActionService(
            OperatorActionKind.RECAP_RETRY_RENDER, RecapVideo.objects.all, _retry_render
        ),
    )
}


def raw_events_replay(*, actor: User, raw_event_ids: Sequence[int], via: str) -> OperatorAction:
    """Queue each event to its handlers again; rejected, pending and duplicates are refused."""
    service = OPERATOR_ACTIONS[OperatorActionKind.RAW_EVENT_REPLAY]
    return service(actor=actor, ids=raw_event_ids, via=via)


def raw_events_reverify(*, actor: User, raw_event_ids: Sequence[int], via: str) -> OperatorAction:
    """Verify rejected events again now (after a secret fix); others are refused."""
    service = OPERATOR_ACTIONS[OperatorActionKind.RAW_EVENT_REVERIFY]
    return service(actor=actor, ids=raw_event_ids, via=via)


# --- API tokens for scripts ------------------------------------------------------------------

ISSUE_REFUSED_NOT_STAFF = "{username} is not staff: the console API answers staff only."
ISSUE_REFUSED_INACTIVE = "{username} is not active."
ISSUE_REFUSED_TTL = "A token lives at least one day."


def api_token_issue(*, user: User, ttl_days: int) -> tuple[AuthToken, str]:
    """A new token for `user`; the returned string is shown once and stored only hashed."""
    if not user.is_active:
        raise OperatorActionError(ISSUE_REFUSED_INACTIVE.format(username=user.get_username()))
    if not user.is_staff:
        raise OperatorActionError(ISSUE_REFUSED_NOT_STAFF.format(username=user.get_username()))
    if ttl_days < 1:
        raise OperatorActionError(ISSUE_REFUSED_TTL)
    record, token = AuthToken.objects.create(user, expiry=timedelta(days=ttl_days))
    logger.info(
        "console.api_token.issued",
        extra={"username": user.get_username(), "expiry": record.expiry.isoformat()},
    )
    return record, token


def api_token_revoke(*, user: User, token_key: str = "") -> int:
    """Delete the user's tokens (or only the one starting with `token_key`); returns how many."""
    tokens = AuthToken.objects.filter(user=user)
    if token_key:
        tokens = tokens.filter(token_key=token_key[: CONSTANTS.TOKEN_KEY_LENGTH])
    deleted, _ = tokens.delete()
    logger.info(
        "console.api_token.revoked", extra={"username": user.get_username(), "count": deleted}
    )
    return deleted


# --- payload access audit ------------------------------------------------------------------


def payload_access_record(
    *,
    actor: User,
    kind: str,
    via: str,
    raw_event_ids: Sequence[int] = (),
    search_term: str = "",
) -> PayloadAccess:
    """Record that `actor` is being shown payloads (or searching them), before they are.

    The search term goes into the row only: the log line says that a search happened and by
    whom, never what was searched for.
    """
    record = PayloadAccess.objects.create(
        actor=actor,
        actor_username=actor.get_username(),
        kind=kind,
        via=via,
        raw_event_ids=list(raw_event_ids),
        search_term=search_term,
    )
    logger.info(
        "console.payload_access",
        extra={
            "payload_access_id": record.id,
            "kind": kind,
            "via": via,
            "actor": record.actor_username,
            "raw_events": len(record.raw_event_ids),
        },
    )
    return record


# --- staff users by role (manage.py console_user) -------------------------------------------

VIEWING = (
    "ingress.view_rawevent",
    "ingress.view_delivery",
    "ingress.view_reconciliationrun",
    "outbox.view_recapsideeffect",
    "outbox.view_circuitbreaker",
    "recaps.view_recapvideo",
    "console.view_operatoraction",
    "console.view_ops",
)


@dataclass(frozen=True)
class Role:
    group: str
    permissions: tuple[str, ...]


ROLES = {
    "viewer": Role("console viewers", VIEWING),
    "operator": Role("console operators", (*VIEWING, "console.operate")),
    "payload-reader": Role(
        "console payload readers", (*VIEWING, "console.operate", "ingress.view_raw_payload")
    ),
}
UNKNOWN_ROLE = "No role {role!r}: one of {roles}."


def _permissions(names: Sequence[str]) -> list[Permission]:
    found = []
    for name in names:
        app_label, codename = name.split(".")
        found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return found


@transaction.atomic
def staff_user_set_role(
    *, username: str, role: str, password: str | None = None
) -> tuple[User, bool]:
    """The user (made when missing), staff, in the role's group only of the console's three;
    each group holds exactly its role's permissions."""
    if role not in ROLES:
        raise OperatorActionError(UNKNOWN_ROLE.format(role=role, roles=", ".join(ROLES)))
    groups = {}
    for name, spec in ROLES.items():
        group, _ = Group.objects.get_or_create(name=spec.group)
        group.permissions.set(_permissions(spec.permissions))
        groups[name] = group
    user, created = User.objects.get_or_create(username=username)
    user.is_staff = True
    if password is not None:
        user.set_password(password)
    elif created:
        user.set_unusable_password()
    user.save()
    user.groups.remove(*groups.values())
    user.groups.add(groups[role])
    logger.info("console.staff_user", extra={"username": username, "role": role})
    return user, created
