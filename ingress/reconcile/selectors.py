"""Reads for reconciliation: which provider ids we already hold, and the latest runs."""

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import OuterRef, QuerySet, Subquery

from ingress.encryption import BodyUndecryptable
from ingress.models import (
    DedupKey,
    RawEvent,
    ReconciliationRun,
    ReconciliationStatus,
    SignatureStatus,
)
from ingress.payloads import UnparseablePayload, parse_payload, raw_event_body
from ingress.providers import dedup_key_for
from ingress.sources import all_sources
from ingress.verifiers import Verdict


def _dedup_key(source: str, provider_event_id: str) -> str:
    # The very rule the inbox keys verified events with (the provider table's), so the two
    # cannot disagree.
    event = RawEvent(source=source, provider=all_sources()[source].provider)
    return dedup_key_for(event, Verdict(provider_event_id=provider_event_id))


def dedup_known_ids(*, source: str, provider_ids: Collection[str]) -> set[str]:
    """The provider ids among `provider_ids` that the dedup index holds for `source`."""
    keys = {_dedup_key(source, provider_id): provider_id for provider_id in provider_ids}
    found = DedupKey.objects.filter(source=source, key__in=list(keys)).values_list("key", flat=True)
    return {keys[key] for key in found}


def pending_delivery_ids(*, source: str, delivery_ids: Collection[str]) -> set[str]:
    """Delivery ids (e.g. X-GitHub-Delivery) of stored events still waiting for verification,
    or for the answer to their signature question (stored too: asking for a redelivery
    would only add a copy).

    Uses the (source, delivery_id) index: the receive path stores the header on the row.
    """
    return set(
        RawEvent.objects.filter(
            source=source,
            delivery_id__in=list(delivery_ids),
            signature_status__in=[SignatureStatus.PENDING, SignatureStatus.QUESTIONED],
        ).values_list("delivery_id", flat=True)
    )


def pending_body_ids(*, source: str, received_since: datetime) -> set[str]:
    """Provider event ids in the bodies of stored events still waiting for verification.

    For providers whose event id is only in the body (Stripe). Bodies are parsed here, in
    Python, because a pending body is unverified input: SQL that casts it to JSON would fail
    on the first one that is not. The `rawevent_pending_source` partial index finds the rows;
    normally there are a handful, and the caller only asks when something looks missing.
    """
    bodies = (
        RawEvent.objects.filter(
            source=source,
            signature_status=SignatureStatus.PENDING,
            received_at__gte=received_since,
        )
        .only("id", "body", "body_encryption")
        .iterator(chunk_size=100)
    )
    ids = set()
    for event in bodies:
        try:
            payload = parse_payload({}, raw_event_body(event))
        except (UnparseablePayload, BodyUndecryptable):
            continue
        if isinstance(payload.get("id"), str):
            ids.add(payload["id"])
    return ids


@dataclass(frozen=True)
class Classified:
    known: set[str]
    pending: set[str]
    missing: list[str]  # in the provider's order


def provider_ids_classify(
    *,
    source: str,
    provider_ids: Sequence[str],
    pending_among: Callable[[list[str]], set[str]],
) -> Classified:
    """Sort a page of provider ids into known (dedup index), pending and missing.

    Dedup index first, then pending, then the dedup index again for what is left: an event
    verified between the first two looks has left `pending` for the index, and without the
    second look it would count as missing and be repaired needlessly.
    """
    known = dedup_known_ids(source=source, provider_ids=provider_ids)
    candidates = [pid for pid in provider_ids if pid not in known]
    pending = pending_among(candidates) & set(candidates) if candidates else set()
    rest = [pid for pid in candidates if pid not in pending]
    if rest:
        known |= dedup_known_ids(source=source, provider_ids=rest)
    return Classified(
        known=known, pending=pending, missing=[pid for pid in rest if pid not in known]
    )


def reconciliation_runs_latest() -> QuerySet[ReconciliationRun]:
    """The newest finished run of every (provider, source, scope): what the drift is now."""
    newest = (
        ReconciliationRun.objects.filter(
            provider=OuterRef("provider"), source=OuterRef("source"), scope=OuterRef("scope")
        )
        .exclude(status=ReconciliationStatus.RUNNING)
        .order_by("-started_at", "-id")
        .values("id")[:1]
    )
    return ReconciliationRun.objects.filter(id=Subquery(newest)).order_by(
        "provider", "source", "scope"
    )
