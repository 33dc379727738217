"""Answer questioned events (ingress/signature_replays.py) from GitHub's delivery logs.

A questioned event carries a body-only signature an earlier event of another delivery id
carried too: genuine (the same thing happened twice) or a captured request sent again. What
tells them apart is evidence about that one delivery: GitHub lists every delivery of a hook
with its GUID (the X-GitHub-Delivery header) for MAX_AGE (3 days). So for the open questions
of the `github` source, the hooks of RECONCILE_GITHUB_HOOKS are listed newest first (the
reconciliation's own client, time budget and page limit, ingress/reconcile/github.py), and
for each question:

- a hook lists its GUID -> genuine: verified, deduplicated on its delivery id, handled;
- no hook lists it, every hook's listing reached back to before the event was received
  (less DELIVERED_BEFORE_RECEIVED for the clocks), and the event is older than
  SIGNATURE_QUESTION_LISTING_LAG_SECONDS -> a replay: rejected `replayed_signature`;
- otherwise it waits, with what was found on the question, and is asked again next run:
  younger than the lag (GitHub may not list it yet), a listing stopped early (rate limit,
  page limit, budget, GitHub down), no GUID on the request, or older than GitHub keeps
  deliveries (less a margin, so that no listing races their deletion) — the last two can
  only be answered by an operator, and the alert on waiting rows says so.

Without GITHUB_API_TOKEN or hooks nothing is asked: the questions wait for an operator
(console action "accept/reject repeated signature", or the API). Every answer goes through
ingress.services.signature_question_answer, fenced on the event still being questioned.
Scheduled every 5 minutes (kernel/schedules.py) and `manage.py answer_signature_questions`.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from ingress.models import SignatureAnswer, SignatureQuestion
from ingress.reconcile.config import reconcile_source
from ingress.reconcile.errors import NOT_CONFIGURED, ReconcileFailed, ReconcileStopped
from ingress.reconcile.github import (
    MAX_AGE,
    GitHubAPI,
    GitHubHook,
    HookListing,
    github_hook_listing,
)
from ingress.reconcile.window import iso
from ingress.services import AnswerRefused, signature_question_answer
from kernel.budgets import BudgetClock, reconcile_budget_problem
from kernel.processing_region import require_processing_region

logger = logging.getLogger(__name__)

# GitHub's `delivered_at` of an attempt precedes our receipt of it by the attempt itself (at
# most GitHub's 10 s timeout) and whatever the two clocks differ by: 5 minutes covers both.
DELIVERED_BEFORE_RECEIVED = timedelta(minutes=5)
# A listing this close to GitHub's retention could miss a delivery GitHub deletes meanwhile.
RETENTION_MARGIN = timedelta(hours=1)
# Open questions answered per run, oldest first; the next run takes the rest.
QUESTIONS_PER_RUN = 500
ANSWERED_BY = "github"

LISTED = "GitHub lists it: delivery {delivery_id} of {scope}, made {delivered_at}{again}."
NOT_LISTED = (
    "GitHub does not list it: the deliveries of {scopes} down to {oldest} hold no GUID "
    "{guid}, {age} after it was received."
)
WAIT_TOO_YOUNG = (
    "{at}: not listed yet, and younger than SIGNATURE_QUESTION_LISTING_LAG_SECONDS ({lag} s): "
    "asked again."
)
WAIT_NOT_COVERED = "{at}: not listed on the pages read ({why}): asked again."
WAIT_NO_GUID = (
    "{at}: no delivery id on the request, so GitHub cannot be asked: an operator decides."
)
WAIT_TOO_OLD = (
    "{at}: older than the {days} days GitHub lists deliveries for, so its absence proves "
    "nothing: an operator decides."
)
NO_HOOKS = "RECONCILE_GITHUB_HOOKS is empty: no GitHub delivery log to ask"
ONLY_GITHUB_SOURCE = (
    "RECONCILE_GITHUB_HOOKS lists the `github` source's hooks: the questions of {source!r} "
    "wait for an operator."
)


@dataclass
class QuestionsOutcome:
    source: str
    asked: int = 0
    genuine: int = 0
    replayed: int = 0
    waiting: int = 0
    lines: list[str] = field(default_factory=list)
    error: str = ""

    def summary(self) -> str:
        text = (
            f"signature questions of {self.source}: {self.asked} asked, {self.genuine} genuine, "
            f"{self.replayed} replayed, {self.waiting} waiting"
        )
        return f"{text} ({self.error})" if self.error else text


def _open_questions(source: str) -> list[SignatureQuestion]:
    return list(
        SignatureQuestion.objects.filter(source=source, answer=SignatureAnswer.OPEN).order_by(
            "received_at", "raw_event_id"
        )[:QUESTIONS_PER_RUN]
    )


def _hooks(source: str) -> list[GitHubHook]:
    if source != "github":
        raise ReconcileFailed(ONLY_GITHUB_SOURCE.format(source=source))
    if not settings.GITHUB_API_TOKEN:
        raise ReconcileFailed(NOT_CONFIGURED.format(setting="GITHUB_API_TOKEN", provider="GitHub"))
    if not settings.RECONCILE_GITHUB_HOOKS:
        raise ReconcileFailed(NO_HOOKS)
    return [GitHubHook.parse(spec) for spec in settings.RECONCILE_GITHUB_HOOKS]


def signature_questions_ask(
    *, source: str = "github", scheduled: bool = False, now: datetime | None = None
) -> QuestionsOutcome:
    """Ask GitHub about the open questions of `source` and answer those it settles (module
    docstring). Refused in the standby region (ProcessingWritesRefused); a configuration or
    credentials problem is the outcome's error, with every question left waiting."""
    require_processing_region()
    reconcile_source(name=source, provider="github")
    outcome = QuestionsOutcome(source=source)
    questions = _open_questions(source)
    outcome.asked = len(questions)
    if not questions:
        return outcome
    now = now or timezone.now()
    try:
        hooks = _hooks(source)
        if problem := reconcile_budget_problem(provider="github", scheduled=scheduled):
            raise ReconcileFailed(problem)
        listings = _listings(questions, hooks, now=now)
    except ReconcileFailed as exc:
        outcome.error = str(exc)
        outcome.waiting = len(questions)
        # Said on each question too (the console shows it): an operator decides meanwhile.
        SignatureQuestion.objects.filter(
            pk__in=[question.pk for question in questions], answer=SignatureAnswer.OPEN
        ).update(checked_at=now, evidence=f"{iso(now)}: GitHub not asked: {outcome.error}")
        logger.warning(
            "ingress.signature_questions.not_asked",
            extra={"source": source, "questions": len(questions), "error": outcome.error},
        )
        return outcome
    for question in questions:
        _settle(question, listings, now=now, outcome=outcome)
    logger.info(
        "ingress.signature_questions.asked",
        extra={
            "source": source,
            "asked": outcome.asked,
            "genuine": outcome.genuine,
            "replayed": outcome.replayed,
            "waiting": outcome.waiting,
        },
    )
    return outcome


def _answerable(question: SignatureQuestion, now: datetime) -> bool:
    # Inside what GitHub still lists, with a GUID to look for.
    return bool(question.delivery_id) and question.received_at >= now - MAX_AGE + RETENTION_MARGIN


def _listings(
    questions: list[SignatureQuestion], hooks: list[GitHubHook], *, now: datetime
) -> list[HookListing]:
    answerable = [question for question in questions if _answerable(question, now)]
    if not answerable:
        return []
    guids = {question.delivery_id for question in answerable}
    back_to = min(question.received_at for question in answerable) - DELIVERED_BEFORE_RECEIVED
    clock = BudgetClock(
        settings.RECONCILE_RUN_BUDGET_SECONDS,
        setting="RECONCILE_RUN_BUDGET_SECONDS",
        exhausted=ReconcileStopped,
    )
    api = GitHubAPI(clock=clock)
    listings: list[HookListing] = []
    try:
        for hook in hooks:
            # A GUID found on one hook needs no other: the next hook looks for the rest.
            missing = guids - {guid for listing in listings for guid in listing.listed}
            listings.append(github_hook_listing(api, hook, guids=missing, back_to=back_to))
    finally:
        api.close()
    return listings


def _settle(
    question: SignatureQuestion,
    listings: list[HookListing],
    *,
    now: datetime,
    outcome: QuestionsOutcome,
) -> None:
    at = iso(now)
    guid = question.delivery_id
    found = next((listing for listing in listings if guid and guid in listing.listed), None)
    if found is not None:
        attempt = found.listed[guid]
        again = ", a redelivery" if attempt.raw.get("redelivery") else ""
        evidence = LISTED.format(
            delivery_id=attempt.delivery_id,
            scope=found.hook.scope,
            delivered_at=iso(attempt.delivered_at),
            again=again,
        )
        _answer(question, genuine=True, evidence=evidence, outcome=outcome)
        return
    lag = settings.SIGNATURE_QUESTION_LISTING_LAG_SECONDS
    if not guid:
        waiting = WAIT_NO_GUID.format(at=at)
    elif not _answerable(question, now):
        waiting = WAIT_TOO_OLD.format(at=at, days=MAX_AGE.days)
    elif question.received_at > now - timedelta(seconds=lag):
        waiting = WAIT_TOO_YOUNG.format(at=at, lag=lag)
    elif listings and all(
        listing.covers(question.received_at - DELIVERED_BEFORE_RECEIVED) for listing in listings
    ):
        oldest = min(
            (listing.oldest_seen for listing in listings if listing.oldest_seen is not None),
            default=None,
        )
        evidence = NOT_LISTED.format(
            scopes=", ".join(listing.hook.scope for listing in listings),
            oldest=iso(oldest) if oldest else "the first delivery",
            guid=guid,
            age=f"{(now - question.received_at).total_seconds():.0f} s",
        )
        _answer(question, genuine=False, evidence=evidence, outcome=outcome)
        return
    else:
        why = "; ".join(listing.stopped for listing in listings if listing.stopped)
        waiting = WAIT_NOT_COVERED.format(at=at, why=why or "they did not reach back far enough")
    SignatureQuestion.objects.filter(pk=question.pk, answer=SignatureAnswer.OPEN).update(
        checked_at=now, evidence=waiting
    )
    outcome.waiting += 1
    outcome.lines.append(f"#{question.raw_event_id} {guid or '(no GUID)'}: waiting, {waiting}")


def _answer(
    question: SignatureQuestion, *, genuine: bool, evidence: str, outcome: QuestionsOutcome
) -> None:
    try:
        event = signature_question_answer(
            raw_event_id=question.raw_event_id,
            genuine=genuine,
            answered_by=ANSWERED_BY,
            evidence=evidence,
        )
    except AnswerRefused:
        return  # answered meanwhile (an operator, another host): settled once, by them
    if genuine:
        outcome.genuine += 1
    else:
        outcome.replayed += 1
    verdict = "genuine" if genuine else "replayed"
    outcome.lines.append(
        f"#{event.id} {question.delivery_id}: {verdict} ({event.signature_status}"
        f"{' ' + event.rejection_reason if event.rejection_reason else ''}); {evidence}"
    )
