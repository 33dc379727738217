"""Writes about regions: the heartbeat and processing gate every inbox and dispatcher pass goes
through, and the processing decision, the operator's audited action (docs/multi-region.md)."""

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from kernel.errors import EventDropError
from regions import replication
from regions.configuration import multi_region, peers, region_name
from regions.fingerprints import secret_fingerprints
from regions.models import ProcessingDecision, RegionState
from regions.selectors import ProcessingVerdict, effective_decision, processing_verdict

logger = logging.getLogger(__name__)

# Held shared by every pass (session-level: a pass spans transactions) and exclusively to
# acknowledge a decision that moves processing away, so the other region starts only once no
# pass here runs under the old decision.
PASS_LOCK_KEY = 0x7265_6769_6F6E_7061  # b"regionpa"
# Beats closer together than this are skipped: every beat is a row change that crosses.
HEARTBEAT_INTERVAL = timedelta(seconds=1)

ONE_REGION = "This deployment runs one region (EVENTDROP_REGION_PEERS is empty): no switch."
UNKNOWN_REGION = "Region {region!r} is neither this region nor one of its peers."
TAKEOVER_ELSEWHERE = "A region can be declared lost only from the region taking over."
LEASE_STILL_RUNNING = (
    "Region {holder!r} holds the processing lease until {until} (as replicated here); a "
    "takeover before then could process twice. Wait, or switch without declaring it lost."
)
ALREADY_PROCESSING = "Region {region!r} is already the processing region (epoch {epoch})."


class RegionError(EventDropError):
    pass


@contextlib.contextmanager
def region_processing_pass() -> Iterator[bool]:
    """Whether this process may run a pass of processing now; held for the pass.

    One region: always. Several: the rule of regions.selectors.processing_verdict, asked
    after taking the pass lock shared and after this region's heartbeat."""
    if not multi_region():
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s)", [PASS_LOCK_KEY])
    try:
        verdict = region_heartbeat()
        yield verdict.may_process
    finally:
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_shared(%s)", [PASS_LOCK_KEY])


def region_heartbeat() -> ProcessingVerdict:
    """Beat, acknowledge what may be acknowledged, renew the lease, say whether to process."""
    now = timezone.now()
    exclusive = False
    try:
        with transaction.atomic():
            me = RegionState.objects.select_for_update().filter(name=region_name()).first()
            if me is None:
                return ProcessingVerdict(False, "region_setup has not run in this region")
            decision = effective_decision()
            others = list(RegionState.objects.exclude(name=me.name))
            verdict = processing_verdict(me=me, others=others, decision=decision, now=now)
            changed: set[str] = set()
            if decision is not None and decision.epoch > me.seen_epoch:
                # A decision naming this region is acknowledged at once; one naming another
                # only when no pass of this region runs under the old one.
                exclusive = not verdict.may_process and _try_pass_lock_exclusive()
                if verdict.may_process or exclusive:
                    me.seen_epoch = decision.epoch
                    changed.add("seen_epoch")
                if exclusive:
                    # Stop publishing state in the transaction that acknowledges: every state
                    # change of this region before it reaches the others, none after it.
                    replication.publish_state(False)
            if verdict.may_process:
                if replication.publish_state(True):
                    logger.info("regions.processing.started", extra={"epoch": verdict.epoch})
                lease = timedelta(seconds=settings.EVENTDROP_REGION_LEASE_SECONDS)
                me.lease_until = now + lease
                me.lease_epoch = verdict.epoch
                changed |= {"lease_until", "lease_epoch"}
            if changed or me.heartbeat_at is None or now - me.heartbeat_at >= HEARTBEAT_INTERVAL:
                me.heartbeat_at = me.updated_at = now
                changed |= {"heartbeat_at", "updated_at"}
                RegionState.objects.filter(name=me.name).update(
                    **{field: getattr(me, field) for field in changed}
                )
            return verdict
    finally:
        if exclusive:
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])


def _try_pass_lock_exclusive() -> bool:
    """The pass lock, exclusively, without waiting. This process holds it shared itself, which
    never conflicts with its own request; any other process's running pass does."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK_KEY])
        return bool(cursor.fetchone()[0])


@transaction.atomic
def processing_region_set(
    *, region: str, peer_lost: bool = False, actor: User | None = None, reason: str = ""
) -> ProcessingDecision:
    """Name the processing region: a new decision, one epoch above the highest seen here.

    `peer_lost`: the operator declares the other regions lost and this region takes over
    at once; refused unless it is this region, and while the current holder's lease (as
    replicated here) still runs."""
    me = region_name()
    if not multi_region():
        raise RegionError(ONE_REGION)
    if region not in {me, *(peer.name for peer in peers())}:
        raise RegionError(UNKNOWN_REGION.format(region=region))
    current = effective_decision()
    if current is not None and current.processing_region == region and not peer_lost:
        raise RegionError(ALREADY_PROCESSING.format(region=region, epoch=current.epoch))
    if peer_lost:
        if region != me:
            raise RegionError(TAKEOVER_ELSEWHERE)
        if current is not None and current.processing_region != me:
            holder = RegionState.objects.filter(name=current.processing_region).first()
            now = timezone.now()
            if holder and holder.lease_until and holder.lease_until > now:
                raise RegionError(
                    LEASE_STILL_RUNNING.format(holder=holder.name, until=holder.lease_until)
                )
    epoch = (ProcessingDecision.objects.aggregate(top=Max("epoch"))["top"] or 0) + 1
    decision = ProcessingDecision.objects.create(
        epoch=epoch,
        decided_in=me,
        processing_region=region,
        peer_lost=peer_lost,
        actor_username=actor.get_username() if actor else "",
        reason=reason,
    )
    if peer_lost:
        for peer in peers():
            replication.subscription_without_state(me, peer.name, direct_if_no_function=True)
    logger.info(
        "regions.processing.decided",
        extra={"epoch": epoch, "region": region, "peer_lost": peer_lost},
    )
    return decision


def region_state_write(*, number: int) -> RegionState:
    """This region's own row: its number and secrets' fingerprints (region_setup)."""
    state, _ = RegionState.objects.update_or_create(
        name=region_name(),
        defaults={
            "number": number,
            "secret_fingerprints": secret_fingerprints(),
            "updated_at": timezone.now(),
        },
    )
    return state
