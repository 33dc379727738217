"""The console's view of the ingress: find any webhook ever received and push it back.

Read-only on purpose: raw events and deliveries change only through the inbox services, which
the actions below reach via console.services (and so are recorded). Bodies and headers are
shown only with `ingress.view_raw_payload`; source secrets are never read here at all.
"""

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import DateFieldListFilter
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.http import urlencode

from console.admin.base import (
    ConfirmSpec,
    ObjectAction,
    OperatorAdmin,
    PayloadAdmin,
    clipped,
    object_actions_context,
    operator_action,
    status_badge,
    status_field,
    time_field,
    tone_badge,
)
from console.jobs.links import raw_events_bulk_job_link
from console.models import OperatorActionKind, PayloadAccessKind
from console.pauses.services import pauses_holding
from console.presentation import (
    EMPTY,
    PAYLOAD_FIELDS,
    body_view,
    error_for_viewer,
    format_seconds,
    format_time,
    headers_rows,
    seconds_between,
    status_tone,
    trace_link,
)
from console.raw_events.selectors import (
    BODY_SEARCH_ENCRYPTED,
    BODY_SEARCH_FORBIDDEN,
    BODY_SEARCHED,
    body_search_window,
    dispatched_as,
    format_time_window,
    raw_event_body_search,
    raw_event_deliveries,
    raw_event_search,
    raw_events_by_status,
    rejected_for,
    sources_of,
)
from ingress.encryption import BodyUndecryptable, bodies_may_be_encrypted
from ingress.models import (
    DeliveryStatus,
    DispatchStatus,
    RawEvent,
    RawEventOrigin,
    ReconciliationRun,
    RejectionReason,
    SignatureQuestion,
    SignatureStatus,
)
from ingress.payloads import raw_event_body, raw_event_headers
from ingress.providers import PROVIDERS, is_content_hash_key
from ingress.sources import all_sources

# A provider's delivery id (a UUID) or a dedup key, cut in the list (whole in its tooltip).
LIST_KEY_CHARS = 20
PAYLOAD_HIDDEN = (
    "Body and headers are hidden: viewing them needs the permission "
    "“Can view raw webhook payloads (body and headers)”."
)
REPLAY_DESCRIPTION = (
    "Each verified event is queued to every handler registered for it now: existing "
    "deliveries are re-armed (attempts reset), handlers added since it arrived get a new "
    "one. Handlers are idempotent, so running them again is safe."
)
REPLAY_WARNING = (
    "Rejected, not-yet-verified and duplicate events are refused and reported: re-verify "
    "rejected events first, replay the original of a duplicate."
)
REVERIFY_DESCRIPTION = (
    "Each rejected event is verified again now, against the secrets configured now and "
    "the timestamp tolerance measured from when it was received. Events that pass are "
    "deduplicated and dispatched to their handlers."
)
REVERIFY_WARNING = "Events that are not rejected are refused and reported."
ACCEPT_REPEAT_DESCRIPTION = (
    "Each questioned event is answered genuine: its provider sent it (the same thing happened "
    "twice). It is verified, deduplicated on its delivery id and handled as any event."
)
REJECT_REPEAT_DESCRIPTION = (
    "Each questioned event is answered a replay: its provider never sent this delivery. It "
    "is rejected replayed_signature and never handled."
)
ANSWER_REPEAT_WARNING = (
    "Answer from evidence about the delivery (the provider's delivery log, its sender); "
    "events that are not questioned are refused and reported."
)


# A body's hash and a dedup key made from it confirm a guessed body: staff who may not read
# payloads see these stand-ins instead (docs/security.md), and may not filter on them.
PAYLOAD_CLUE_STAND_INS = {
    "dedup_key": "dedup_key_without_hash",
    "copies_link": "copies_without_hash",
}
CONTENT_HASH_HIDDEN = "a hash of the body (shown with the permission ingress.view_raw_payload)"


def _payload_clue_lookup(lookup: str, value: object) -> bool:
    """A filter that confirms a guessed body: on its hash, or on a content-hash dedup key
    (an exact dedup key of a provider's event id is not one)."""
    field = lookup.split("__")[0]
    if field == "dedup_key":
        return lookup != "dedup_key" or is_content_hash_key(str(value))
    return field == "body_sha256"


class NamesFilter(admin.SimpleListFilter):
    """An exact filter on the field `parameter_name` names, offering the names the
    configuration knows (names()), not SELECT DISTINCT over the whole (partitioned) store."""

    def names(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request, model_admin):
        return [(name, name) for name in self.names()]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.parameter_name: value}) if value else queryset


class SourceFilter(NamesFilter):
    title = parameter_name = "source"

    def names(self) -> list[str]:
        return sorted(all_sources())

    def lookups(self, request, model_admin):
        # A disabled source answers 404 (the pauses page says why to pause instead).
        sources = all_sources()
        return [
            (name, name if sources[name].enabled else f"{name} (disabled: answers 404)")
            for name in self.names()
        ]


class ProviderFilter(NamesFilter):
    title = parameter_name = "provider"

    def names(self) -> list[str]:
        return sorted(PROVIDERS)

    def queryset(self, request, queryset):
        # The provider's sources, on the (source, received_at) index; the provider column
        # has none of its own.
        value = self.value()
        return queryset.filter(source__in=sources_of(value)) if value else queryset


class ChoicesFilter(admin.SimpleListFilter):
    """A choices field's filter under Django's own parameter (`<field>__exact`), whose
    query adds what lets the database use the field's partial index (filter_rule)."""

    options: list[tuple[str, str]]
    filter_rule: staticmethod

    def lookups(self, request, model_admin):
        return self.options

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(type(self).filter_rule(value)) if value else queryset


class RejectionReasonFilter(ChoicesFilter):
    title = "rejection reason"
    parameter_name = "rejection_reason__exact"
    options = RejectionReason.choices
    filter_rule = staticmethod(rejected_for)


class DispatchStatusFilter(ChoicesFilter):
    title = "dispatch status"
    parameter_name = "dispatch_status__exact"
    options = DispatchStatus.choices
    filter_rule = staticmethod(dispatched_as)


class BodySearchFilter(admin.SimpleListFilter):
    """Body text, asked for explicitly (the form under the search box), for payload readers
    only, and only within one received window of at most BODY_SEARCH_WINDOW: a body search
    reads every body of its window. The page says which window it searched."""

    title = "body text"
    parameter_name = "body"

    def __init__(self, request, params, model, model_admin):
        self.model_admin = model_admin  # the payload rule: PayloadAdmin
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, f"“{value}”")] if value else []

    def queryset(self, request, queryset):
        term = self.value()
        if not term:
            return queryset
        if not self.model_admin.reads_payload(request):
            raise PermissionDenied(BODY_SEARCH_FORBIDDEN)
        if bodies_may_be_encrypted():
            messages.warning(request, BODY_SEARCH_ENCRYPTED)
            return queryset.none()
        start, end = body_search_window(
            after=_admin_time(request.GET.get("received_at__gte")),
            before=_admin_time(request.GET.get("received_at__lt")),
        )
        messages.info(request, BODY_SEARCHED.format(start=format_time_window(start, end)))
        self.model_admin.record_payload_access(request, PayloadAccessKind.SEARCH, search_term=term)
        return raw_event_body_search(queryset=queryset, term=term, start=start, end=end)


def _admin_time(value: str | None) -> datetime | None:
    parsed = parse_datetime(value.replace(" ", "T", 1)) if value else None
    if parsed is not None and timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    return parsed


def _breakdown(*, ids) -> list[tuple[str, int]]:
    return [
        (f"{row['signature_status']} / {row['dispatch_status']}", row["count"])
        for row in raw_events_by_status(ids=ids)
    ]


def raw_event_link(raw_event_id: int | None) -> str:
    if raw_event_id is None:
        return EMPTY
    url = reverse("admin:ingress_rawevent_change", args=[raw_event_id])
    return format_html('<a href="{}">#{}</a>', url, raw_event_id)


# --- What happened, and what to do next -----------------------------------------------------

# Rejections grouped by the one next step that can help.
_SECRET_REASONS = {RejectionReason.BAD_SIGNATURE, RejectionReason.NO_SECRET_CONFIGURED}
_HEADER_REASONS = {
    RejectionReason.MISSING_SIGNATURE,
    RejectionReason.MALFORMED_HEADER,
    RejectionReason.NO_MATCHING_SCHEME,
}
_CLOCK_REASONS = {RejectionReason.STALE_TIMESTAMP, RejectionReason.FUTURE_TIMESTAMP}
_BODY_REASONS = {RejectionReason.UNPARSEABLE_BODY, RejectionReason.UNSTORABLE_TEXT}
_BUG_REASONS = {RejectionReason.VERIFIER_ERROR, RejectionReason.PROCESSING_FAILED}

NEXT_FIX_SIGNING_KEY = (
    "Fix the secret: compare the secret configured for source “{source}” with the one in "
    "{provider}'s webhook settings (a rotation adds the new one beside the old), then "
    "Re-verify this event."
)
NEXT_CHECK_SENDER = (
    "The request was not signed the way {provider} signs: if it really came from {provider}, "
    "check the endpoint's signing settings and our source's provider, then Re-verify; a "
    "request from anyone else needs nothing."
)
NEXT_CLOCK = (
    "Re-verify will fail again (the tolerance is measured from when it was received): check "
    "the clocks, then have {provider} send the event again or let reconciliation fetch it."
)
NEXT_BODY = (
    "No handler could use this body, so re-verifying cannot help: if {provider} really sent "
    "it, let reconciliation fetch the event from {provider}'s API."
)
NEXT_UNKNOWN_SOURCE = "Configure source “{source}” again, then Re-verify this event."
NEXT_REPLAYED = (
    "Nothing: its signature was seen before under another delivery id, and {provider}'s "
    "delivery log (or an operator) answered that {provider} never sent this one — a captured "
    "request sent again. The signature question below says what decided it."
)
NEXT_BUG = "A bug on our side (see the processing error): fix and deploy, then Re-verify."
NEXT_WAIT_VERIFY = (
    "Nothing yet: the inbox worker (manage.py process_inbox) verifies it within seconds. If it "
    "stays pending, check that the worker runs (ops page: oldest event waiting)."
)
NEXT_RETRY_SETTLE = (
    "Settling it raised {failures} time(s) ({error}); the worker tries again from {when}."
)
NEXT_DUPLICATE = (
    "Nothing: it is a copy of #{original}, whose deliveries did the work. To run the "
    "handlers again, Replay the original."
)
NEXT_NO_HANDLER = (
    "No handler was registered for “{event_type}” when it arrived. If one should run: "
    "deploy it, then Replay this event."
)
NEXT_DEAD = (
    "{dead} delivery(ies) gave up after their last attempt (error below): fix the cause, then "
    "Replay this event — it re-arms the dead delivery with fresh attempts."
)
NEXT_IN_PROGRESS = "Nothing yet: the worker runs the pending deliveries and retries failures."
NEXT_HELD = (
    "{held} delivery(ies) held: {pauses} paused, so nothing runs and no attempt is charged. "
    "Resume it on the pauses page (/ops/pauses/) once the cause is fixed; the held deliveries "
    "then run in received order."
)
NEXT_NONE = "Nothing: every delivery is done."
NEXT_QUESTIONED = (
    "Its signature covers the body only, and #{repeats} carried the same one under another "
    "delivery id: the same thing happening twice, or a captured request sent again. GitHub's "
    "delivery log answers within minutes where it is configured (answer_signature_questions); "
    "else check the provider's log and Accept as genuine or Reject as a replay, with your "
    "reason."
)


@dataclass(frozen=True)
class RawEventState:
    """One raw event in a sentence: its headline, a tone for the colour, the next step."""

    headline: str
    tone: str  # console.presentation tones: ok, wait, warn, bad, quiet
    next_step: str


def raw_event_state(
    event: RawEvent,
    delivery_statuses: list[str],
    held_by: str = "",
    question: SignatureQuestion | None = None,
) -> RawEventState:
    """`held_by` names the pauses holding the event's held deliveries ("handler x");
    `question` is a questioned event's signature question."""
    provider = event.provider or "the provider"
    what = {"source": event.source, "provider": provider}
    if event.signature_status == SignatureStatus.PENDING:
        if event.processing_failures:
            step = NEXT_RETRY_SETTLE.format(
                failures=event.processing_failures,
                error=event.processing_error or "no error recorded",
                when=format_time(event.retry_not_before, timezone.now()),
            )
        else:
            step = NEXT_WAIT_VERIFY
        return RawEventState("waiting for verification", "wait", step)
    if event.signature_status == SignatureStatus.QUESTIONED:
        repeats = question.repeats_id if question is not None else "?"
        return RawEventState(
            "questioned: signature seen before", "warn", NEXT_QUESTIONED.format(repeats=repeats)
        )
    if event.signature_status == SignatureStatus.REJECTED:
        reason = event.rejection_reason
        if reason in _SECRET_REASONS:
            step = NEXT_FIX_SIGNING_KEY
        elif reason in _HEADER_REASONS:
            step = NEXT_CHECK_SENDER
        elif reason in _CLOCK_REASONS:
            step = NEXT_CLOCK
        elif reason in _BODY_REASONS:
            step = NEXT_BODY
        elif reason == RejectionReason.UNKNOWN_SOURCE:
            step = NEXT_UNKNOWN_SOURCE
        elif reason == RejectionReason.REPLAYED_SIGNATURE:
            step = NEXT_REPLAYED
        else:
            step = NEXT_BUG
        return RawEventState(f"rejected: {reason}", "bad", step.format(**what))
    if event.dispatch_status == DispatchStatus.DUPLICATE:
        return RawEventState(
            f"verified, duplicate of #{event.duplicate_of_id}",
            "quiet",
            NEXT_DUPLICATE.format(original=event.duplicate_of_id),
        )
    if event.dispatch_status == DispatchStatus.NO_HANDLER:
        return RawEventState(
            "verified, no handler",
            "warn",
            NEXT_NO_HANDLER.format(event_type=event.event_type or "(no type)"),
        )
    counts = Counter(delivery_statuses)
    if counts[DeliveryStatus.DEAD]:
        noun = "delivery" if counts[DeliveryStatus.DEAD] == 1 else "deliveries"
        return RawEventState(
            f"verified, {noun} dead", "bad", NEXT_DEAD.format(dead=counts[DeliveryStatus.DEAD])
        )
    if counts[DeliveryStatus.HELD]:
        noun = "delivery" if counts[DeliveryStatus.HELD] == 1 else "deliveries"
        return RawEventState(
            f"verified, {noun} held",
            "warn",
            NEXT_HELD.format(held=counts[DeliveryStatus.HELD], pauses=held_by or "its handler"),
        )
    if counts[DeliveryStatus.PENDING] or counts[DeliveryStatus.PROCESSING]:
        return RawEventState("verified, deliveries running", "wait", NEXT_IN_PROGRESS)
    return RawEventState("verified, handled", "ok", NEXT_NONE)


@admin.register(RawEvent)
class RawEventAdmin(PayloadAdmin, OperatorAdmin):
    # What decides the next step comes first and fits 1,366 px (tests/console/test_browser.py):
    # the verdict, why, what happened next, how long ago; then what it is.
    list_display = (
        "id",
        "signature_badge",
        "reason_column",
        "dispatch_badge",
        "age",
        "source",
        "event_type_link",
        "delivery_or_dedup",
        "verify_lag",
        "handle_lag",
    )
    list_filter = (
        "signature_status",
        RejectionReasonFilter,
        DispatchStatusFilter,
        "origin",
        SourceFilter,
        ProviderFilter,
        ("received_at", DateFieldListFilter),
        BodySearchFilter,
    )
    # The real search is get_search_results(); a non-empty search_fields shows the box.
    search_fields = ("delivery_id",)
    # Ids and keys only, each an index lookup; body text has its own form (BodySearchFilter).
    search_help_text = (
        "Event id, delivery id or dedup key (exact). Click an event type to list every event "
        "of that type. Body text: the form below, for payload readers, an hour at a time."
    )
    ordering = ("-received_at", "-id")
    list_per_page = 50
    # COUNT(*) over the unfiltered store on every page view is the one query to avoid.
    show_full_result_count = False
    actions = (
        "replay_selected",
        "reverify_selected",
        "accept_repeat_selected",
        "reject_repeat_selected",
    )
    change_form_template = "console/admin/raw_event_change_form.html"
    change_list_template = "console/admin/change_list.html"

    received_fields = (
        "id",
        "source",
        "provider",
        "method",
        "path",
        "query_string",
        "remote_addr",
        "received_at_display",
        "delivery_id",
        "trace",
        "body_size",
        "payload_dropped_bytes",
        "body_sha256",
    )
    verification_fields = (
        "origin",
        "signature_status",
        "rejection",
        "matched_secret",
        "verdict_at",
        "verify_count",
        "verify_lag",
        "event_type",
        "provider_retry",
        # A row whose settling raised: how often, the error class, when it is tried again.
        "processing_failures",
        "processing_error",
        "retry_not_before_display",
        # A repeated body-only signature: the event it repeats, the answer or why it waits.
        "signature_question",
    )
    dispatch_fields = (
        "dedup_key",
        "duplicate_link",
        "copies_link",
        "dispatch_status",
        "handled_at_display",
        "handle_lag",
    )
    payload_fields = ("headers_table", "body_display")

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*PAYLOAD_FIELDS)

    summary_fields = ("status_summary", "next_step", "deliveries_table", "operator_actions")
    # The verdict's time under the label that says which verdict it was.
    VERDICT_AT_FIELDS: dict[str, str] = {
        SignatureStatus.VERIFIED: "verified_at_display",
        SignatureStatus.REJECTED: "rejected_at",
        SignatureStatus.QUESTIONED: "questioned_at",
    }

    def get_fieldsets(self, request, obj=None):
        # What an on-call engineer asks first comes first: what happened, then why.
        may_read = self.reads_payload(request)
        payload = self.payload_fields if may_read else ("payload_hidden",)
        received: tuple[str, ...] = self.received_fields
        dispatch: tuple[str, ...] = self.dispatch_fields
        if not may_read:
            # The body's hash and a dedup key made from it confirm a guessed body.
            received = tuple(name for name in received if name != "body_sha256")
            dispatch = tuple(PAYLOAD_CLUE_STAND_INS.get(name, name) for name in dispatch)
        # Handler errors may quote the payload: without the permission, their class only.
        summary: tuple[str, ...] = self.summary_fields
        if not may_read:
            summary = tuple(
                "deliveries_table_without_messages" if name == "deliveries_table" else name
                for name in summary
            )
        verdict_at = self.VERDICT_AT_FIELDS.get(obj.signature_status if obj else "", "verdict_at")
        verification = tuple(
            verdict_at if name == "verdict_at" else name for name in self.verification_fields
        )
        return [
            ("What happened", {"fields": summary}),
            ("Verification", {"fields": verification}),
            ("Dedup and dispatch", {"fields": dispatch}),
            ("Received", {"fields": received}),
            ("Payload", {"fields": payload}),
        ]

    def get_readonly_fields(self, request, obj=None):
        return (
            *self.received_fields,
            *self.verification_fields,
            *self.dispatch_fields,
            *self.payload_fields,
            *self.summary_fields,
            "deliveries_table_without_messages",
            "payload_hidden",
            *PAYLOAD_CLUE_STAND_INS.values(),
            *self.VERDICT_AT_FIELDS.values(),
        )

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if request is None:  # Django passes the request; without one, who asks is unknown
            return False
        # Only for those who may read payloads (audited in changelist_view).
        if _payload_clue_lookup(lookup, value) and not self.reads_payload(request):
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        if not search_term:
            return queryset, False
        results = raw_event_search(
            queryset=queryset, query=search_term, may_read_payload=self.reads_payload(request)
        )
        return results, False

    def get_urls(self):
        urls = [
            path(
                "<int:object_id>/raw-body/",
                self.admin_site.admin_view(self.raw_body_view),
                name="ingress_rawevent_raw_body",
            )
        ]
        return urls + super().get_urls()

    def raw_body_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """The exact stored bytes, as a download: for recomputing a signature by hand.

        Served as an attachment of type application/octet-stream (and nosniff), so a body
        that happens to be HTML is saved, never rendered in the admin's origin.
        """
        if not (self.has_view_permission(request) and self.reads_payload(request)):
            raise Http404
        event = get_object_or_404(
            RawEvent.objects.only("id", "body", "body_encryption"), pk=object_id
        )
        self.record_payload_access(request, PayloadAccessKind.DOWNLOAD, raw_event_ids=[event.pk])
        try:
            body = raw_event_body(event)  # as received: decrypted when stored encrypted
        except BodyUndecryptable as exc:
            return HttpResponse(str(exc), status=409, content_type="text/plain; charset=utf-8")
        response = HttpResponse(body, content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="raw-event-{event.id}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def changelist_view(self, request, extra_context=None):
        if self.reads_payload(request):
            # A filter on a payload clue (lookup_allowed lets only payload readers use one)
            # is a search for a payload.
            for lookup, term in request.GET.items():
                if term and _payload_clue_lookup(lookup, term):
                    self.record_payload_access(
                        request, PayloadAccessKind.SEARCH, search_term=f"{lookup}={term}"
                    )
        extra_context = dict(extra_context or {})
        extra_context["bulk_job"] = raw_events_bulk_job_link(request)
        extra_context["body_search"] = self.reads_payload(request)
        extra_context["show_source_disable_link"] = True
        extra_context["disabled_sources"] = sorted(
            name for name, source in all_sources().items() if not source.enabled
        )
        return super().changelist_view(request, extra_context=extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        event = self.get_object(request, object_id) if object_id else None
        if event is not None:
            extra_context.update(object_actions_context(request, self._object_actions(event)))
            # The page's title says what happened (str() of the row knows only the verdict).
            state = self._state(event)
            extra_context["subtitle"] = f"{event.source} #{event.pk}: {state.headline}"
            extra_context["raw_event_state"] = state
        response = super().changeform_view(request, object_id, form_url, extra_context)
        # 200: the page of an existing event is about to render, with its payload.
        if object_id and response.status_code == 200 and self.reads_payload(request):
            self.record_payload_access(
                request, PayloadAccessKind.VIEW, raw_event_ids=[int(object_id)]
            )
        return response

    # --- actions -------------------------------------------------------------------------

    def _object_actions(self, event: RawEvent) -> list[ObjectAction]:
        """Only what can succeed on this event: Replay on a verified original (the service
        refuses rejected, pending and duplicate events), Re-verify on a rejected one."""
        changelist = "admin:ingress_rawevent_changelist"
        actions = []
        if (
            event.signature_status == SignatureStatus.VERIFIED
            and event.dispatch_status != DispatchStatus.DUPLICATE
        ):
            actions.append(
                ObjectAction("console-replay", "Replay", "replay_selected", changelist, event.pk)
            )
        if event.signature_status == SignatureStatus.REJECTED:
            actions.append(
                ObjectAction(
                    "console-reverify", "Re-verify", "reverify_selected", changelist, event.pk
                )
            )
        if event.signature_status == SignatureStatus.QUESTIONED:
            actions += [
                ObjectAction(
                    "console-accept-repeat",
                    "Accept as genuine",
                    "accept_repeat_selected",
                    changelist,
                    event.pk,
                ),
                ObjectAction(
                    "console-reject-repeat",
                    "Reject as a replay",
                    "reject_repeat_selected",
                    changelist,
                    event.pk,
                ),
            ]
        return actions

    replay_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.RAW_EVENT_REPLAY,
            verb="Replay",
            description=REPLAY_DESCRIPTION,
            warnings=(REPLAY_WARNING,),
            breakdown=_breakdown,
        ),
        menu_label="Replay selected events to their handlers",
    )
    reverify_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.RAW_EVENT_REVERIFY,
            verb="Re-verify",
            description=REVERIFY_DESCRIPTION,
            warnings=(REVERIFY_WARNING,),
            breakdown=_breakdown,
        ),
        menu_label="Re-verify selected rejected events",
    )
    accept_repeat_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.RAW_EVENT_ACCEPT_REPEAT,
            verb="Accept as genuine",
            description=ACCEPT_REPEAT_DESCRIPTION,
            warnings=(ANSWER_REPEAT_WARNING,),
            breakdown=_breakdown,
            note_label="What shows that the provider sent it",
        ),
        menu_label="Accept selected questioned events as genuine",
    )
    reject_repeat_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.RAW_EVENT_REJECT_REPEAT,
            verb="Reject as a replay",
            description=REJECT_REPEAT_DESCRIPTION,
            warnings=(ANSWER_REPEAT_WARNING,),
            breakdown=_breakdown,
            note_label="What shows that the provider never sent it",
        ),
        menu_label="Reject selected questioned events as replays",
    )

    # --- columns and detail fields -------------------------------------------------------

    def _state(self, obj: RawEvent) -> RawEventState:
        # Once per page: status_summary and next_step share it.
        cached = getattr(obj, "_console_state", None)
        if cached is None:
            deliveries = raw_event_deliveries(raw_event_id=obj.pk)
            statuses = [d.status for d in deliveries]
            held_by = ""
            if DeliveryStatus.HELD in statuses:
                held = {d.handler for d in deliveries if d.status == DeliveryStatus.HELD}
                held_by = pauses_holding(source=obj.source, handlers=held)
            cached = raw_event_state(obj, statuses, held_by, self._question(obj))
            setattr(obj, "_console_state", cached)  # noqa: B010  (not a field of the model)
        return cached

    @admin.display(description="trace")
    def trace(self, obj: RawEvent) -> str:
        return trace_link(obj.traceparent)

    def _question(self, obj: RawEvent) -> SignatureQuestion | None:
        if obj.signature_status == SignatureStatus.PENDING:
            return None  # no question yet, and the common case on a busy page
        return SignatureQuestion.objects.filter(raw_event_id=obj.pk).first()

    @admin.display(description="signature question")
    def signature_question(self, obj: RawEvent) -> str:
        question = self._question(obj)
        if question is None:
            return EMPTY
        now = timezone.now()
        answer = question.get_answer_display()
        if question.answer:
            answer += f" — by {question.answered_by}, {format_time(question.answered_at, now)}"
        return format_html(
            '<span id="raw-event-question">repeats {} (asked {}); {}<br>{}</span>',
            raw_event_link(question.repeats_id),
            format_time(question.asked_at, now),
            answer,
            question.evidence or "not asked yet",
        )

    @admin.display(description="verdict", ordering="signature_status")
    def signature_badge(self, obj: RawEvent) -> str:
        return status_badge(obj.signature_status)

    @admin.display(description="reason", ordering="rejection_reason")
    def reason_column(self, obj: RawEvent) -> str:
        if not obj.rejection_reason:
            return EMPTY
        return format_html(
            '<span title="{}">{}</span>', obj.get_rejection_reason_display(), obj.rejection_reason
        )

    @admin.display(description="dispatch", ordering="dispatch_status")
    def dispatch_badge(self, obj: RawEvent) -> str:
        return status_badge(obj.dispatch_status, obj.dispatch_status.replace("_", " "))

    # To the second, and how long ago: "7:54 a.m." on every row tells nothing.
    age = time_field("received_at", "received")
    received_at_display = time_field("received_at", "received at")
    verified_at_display = time_field("verified_at", "verified at")
    rejected_at = time_field("verified_at", "rejected at")  # the verdict's time, a rejection
    questioned_at = time_field("verified_at", "questioned at")  # its signature checked
    handled_at_display = time_field("handled_at", "handled at")
    retry_not_before_display = time_field("retry_not_before", "tried again from")

    @admin.display(description="verdict at")
    def verdict_at(self, obj: RawEvent) -> str:
        return "not yet (waiting for verification)"

    @admin.display(description="next step")
    def next_step(self, obj: RawEvent) -> str:
        state = self._state(obj)
        return format_html(
            '<p id="raw-event-next-step" class="console-next-step console-tone-{}">{}</p>',
            state.tone,
            state.next_step,
        )

    @admin.display(description="event type", ordering="event_type")
    def event_type_link(self, obj: RawEvent) -> str:
        if not obj.event_type:
            return EMPTY
        url = (
            reverse("admin:ingress_rawevent_changelist")
            + "?"
            + urlencode({"event_type": obj.event_type})
        )
        return format_html('<a href="{}">{}</a>', url, obj.event_type)

    @admin.display(description="delivery id / dedup key")
    def delivery_or_dedup(self, obj: RawEvent) -> str:
        # A list is not audited: a content-hash key is on the event's page, for payload readers.
        return clipped(obj.delivery_id or self.dedup_key_without_hash(obj), LIST_KEY_CHARS)

    @admin.display(description="dedup key")
    def dedup_key_without_hash(self, obj: RawEvent) -> str:
        return CONTENT_HASH_HIDDEN if is_content_hash_key(obj.dedup_key) else obj.dedup_key

    @admin.display(description="duplicate of")
    def duplicate_link(self, obj: RawEvent) -> str:
        return raw_event_link(obj.duplicate_of_id)

    @admin.display(description="copies")
    def copies_link(self, obj: RawEvent) -> str:
        if not obj.dedup_key:
            return EMPTY
        # Copies share the dedup key (indexed), not a scan of duplicate_of across partitions.
        copies = (
            RawEvent.objects.filter(source=obj.source, dedup_key=obj.dedup_key)
            .exclude(pk=obj.pk)
            .count()
        )
        url = (
            reverse("admin:ingress_rawevent_changelist")
            + "?"
            + urlencode({"dedup_key": obj.dedup_key, "source": obj.source})
        )
        return format_html('<a href="{}">{} other event(s) with this dedup key</a>', url, copies)

    @admin.display(description="copies")
    def copies_without_hash(self, obj: RawEvent) -> str:
        if is_content_hash_key(obj.dedup_key):
            return CONTENT_HASH_HIDDEN
        return self.copies_link(obj)

    @admin.display(description="received → verdict")
    def verify_lag(self, obj: RawEvent) -> str:
        return format_seconds(seconds_between(obj.received_at, obj.verified_at))

    @admin.display(description="verdict → handled")
    def handle_lag(self, obj: RawEvent) -> str:
        return format_seconds(seconds_between(obj.verified_at, obj.handled_at))

    @admin.display(description="rejection reason")
    def rejection(self, obj: RawEvent) -> str:
        if not obj.rejection_reason:
            return EMPTY
        return f"{obj.rejection_reason} — {obj.get_rejection_reason_display()}"

    @admin.display(description="matched secret")
    def matched_secret(self, obj: RawEvent) -> str:
        # How many secrets are configured tells whether a rotation is under way; the secrets
        # themselves are never read here.
        source = all_sources().get(obj.source)
        configured = len(source.secrets) if source else 0
        if obj.origin == RawEventOrigin.BACKFILLED:
            return "none: backfilled from the provider's API (verified by fetch)"
        if obj.matched_secret_index is None:
            return f"none ({configured} configured now)"
        return f"#{obj.matched_secret_index} ({configured} configured now)"

    @admin.display(description="provider retry")
    def provider_retry(self, obj: RawEvent) -> str:
        if obj.provider_retry_num is None:
            return EMPTY
        return f"retry {obj.provider_retry_num} ({obj.provider_retry_reason or 'no reason'})"

    @admin.display(description="body size")
    def body_size(self, obj: RawEvent) -> str:
        return f"{len(obj.body)} bytes"

    @admin.display(description="headers")
    def headers_table(self, obj: RawEvent) -> str:
        try:
            headers = raw_event_headers(obj)  # decrypted when stored encrypted
        except BodyUndecryptable as exc:
            return format_html("<p>{}</p>", str(exc))
        return render_to_string(
            "console/admin/raw_event_headers.html", {"rows": headers_rows(headers)}
        )

    @admin.display(description="body")
    def body_display(self, obj: RawEvent) -> str:
        try:
            body = raw_event_body(obj)
        except BodyUndecryptable as exc:
            return format_html("<p>{}</p>", str(exc))
        return render_to_string(
            "console/admin/raw_event_body.html",
            {
                "body": body_view(body),
                "download_url": reverse("admin:ingress_rawevent_raw_body", args=[obj.pk]),
            },
        )

    @admin.display(description="payload")
    def payload_hidden(self, obj: RawEvent) -> str:
        return PAYLOAD_HIDDEN

    @admin.display(description="status")
    def status_summary(self, obj: RawEvent) -> str:
        state = self._state(obj)
        if obj.signature_status == SignatureStatus.VERIFIED:
            verdict = (
                "verified by fetch (backfilled)"
                if obj.origin == RawEventOrigin.BACKFILLED
                else f"verified (secret #{obj.matched_secret_index})"
            )
        elif obj.signature_status == SignatureStatus.REJECTED:
            verdict = f"rejected: {obj.rejection_reason} ({obj.get_rejection_reason_display()})"
        elif obj.signature_status == SignatureStatus.QUESTIONED:
            verdict = "signature matches, seen before under another delivery id: questioned"
        else:
            verdict = "waiting for verification"
        counts = Counter(d.status for d in raw_event_deliveries(raw_event_id=obj.pk))
        deliveries = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        handled = (
            f"handled {format_seconds(seconds_between(obj.verified_at, obj.handled_at))} "
            "after the verdict"
            if obj.handled_at
            else "not handled"
        )
        steps = (verdict, obj.get_dispatch_status_display(), deliveries or "no deliveries", handled)
        return format_html(
            '<span id="raw-event-status">{} <span class="console-summary">{}</span></span>',
            tone_badge(state.tone, state.headline),
            " → ".join(steps),
        )

    @admin.display(description="deliveries")
    def deliveries_table(self, obj: RawEvent, may_read_payload: bool = True) -> str:
        def shown(error: str) -> str:
            return error_for_viewer(error, may_read_payload=may_read_payload)

        rows = [
            (
                delivery,
                status_tone(delivery.status),
                shown(delivery.last_error),
                [
                    (
                        attempt,
                        format_seconds(seconds_between(attempt.started_at, attempt.finished_at)),
                        shown(attempt.error),
                    )
                    for attempt in delivery.history.all()
                ],
            )
            for delivery in raw_event_deliveries(raw_event_id=obj.pk)
        ]
        return render_to_string(
            "console/admin/raw_event_deliveries.html",
            {"rows": rows, "state": self._state(obj)},
        )

    @admin.display(description="deliveries")
    def deliveries_table_without_messages(self, obj: RawEvent) -> str:
        return self.deliveries_table(obj, may_read_payload=False)


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(OperatorAdmin):
    """Reconciliation runs and their drift: written by ingress/reconcile only, read here."""

    list_display = (
        "id",
        "started",
        "provider",
        "source",
        "scope",
        "status_badge",
        "window_start",
        "window_end",
        "provider_count",
        "pending_count",
        "missing_count",
        "repaired",
        "drift_display",
    )
    list_filter = ("provider", "status", ("started_at", DateFieldListFilter))
    ordering = ("-started_at", "-id")
    show_full_result_count = False
    fields = (
        "provider",
        "source",
        "scope",
        "status",
        "error",
        "notes",
        "window_start",
        "window_end",
        "started_at",
        "finished_at",
        "pages",
        "provider_count",
        "known_count",
        "pending_count",
        "missing_count",
        "backfilled_count",
        "backfilled_link",
        "redelivered_count",
        "drift_display",
        "missing_ids",
    )
    readonly_fields = fields

    started = time_field("started_at", "started")
    status_badge = status_field("status", "status")

    @admin.display(description="backfilled / redelivered")
    def repaired(self, obj: ReconciliationRun) -> int:
        return obj.backfilled_count + obj.redelivered_count

    @admin.display(description="drift", ordering="drift")
    def drift_display(self, obj: ReconciliationRun) -> str:
        if obj.drift is None:
            return EMPTY
        slo = settings.RECONCILE_DRIFT_SLO
        verdict = "over the SLO" if obj.drift > slo else "within the SLO"
        return f"{obj.drift * 100:.4f} % ({verdict} of {slo * 100:.4f} %)"

    @admin.display(description="backfilled events")
    def backfilled_link(self, obj: ReconciliationRun) -> str:
        # Backfilled rows carry origin=backfilled and were stored while the run ran.
        if not obj.backfilled_count:
            return EMPTY
        query = {"origin": RawEventOrigin.BACKFILLED, "source": obj.source}
        query["received_at__gte"] = obj.started_at.isoformat()
        if obj.finished_at:
            query["received_at__lte"] = obj.finished_at.isoformat()
        url = reverse("admin:ingress_rawevent_changelist") + "?" + urlencode(query)
        return format_html('<a href="{}">raw events backfilled by this run</a>', url)
