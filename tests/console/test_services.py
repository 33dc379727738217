"""console.services: every operator action is recorded, whatever happens to each object."""

import logging

import pytest

from console.models import OperatorAction
from console.services import (
    NOTHING_SELECTED,
    REPLAY_NOTHING_QUEUED,
    UNEXPECTED_ERROR,
    OperatorActionError,
    UnknownObjects,
    raw_events_replay,
    raw_events_reverify,
)
from ingress.inbox import inbox_run_once
from ingress.services import REPLAY_DUPLICATE, REVERIFY_NOT_REJECTED
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db


def test_replay_is_recorded_with_who_what_and_per_object_outcomes(client, push_handler, operator):
    original = receive_github(client, delivery="same")
    copy = receive_github(client, delivery="same")
    inbox_run_once()

    record = raw_events_replay(actor=operator, raw_event_ids=[original.pk, copy.pk], via="api")

    record.refresh_from_db()
    assert record.actor == operator and record.actor_username == "operator"
    assert (record.action, record.via, record.target_model) == (
        "raw_event_replay",
        "api",
        "ingress.rawevent",
    )
    assert record.target_ids == [original.pk, copy.pk]
    assert (record.requested, record.succeeded, record.refused, record.failed) == (2, 1, 1, 0)
    assert record.outcome == "partial" and record.finished_at is not None
    assert record.results[1] == {
        "id": copy.pk,
        "outcome": "refused",
        "detail": REPLAY_DUPLICATE.format(id=copy.pk, original=original.pk),
    }


def test_duplicate_ids_act_once(client, push_handler, operator):
    event = receive_github(client)
    inbox_run_once()
    record = raw_events_replay(actor=operator, raw_event_ids=[event.pk, event.pk], via="api")
    assert record.requested == 1


def test_all_refused_is_recorded_as_refused(client, push_handler, operator):
    event = receive_github(client)
    inbox_run_once()
    record = raw_events_reverify(actor=operator, raw_event_ids=[event.pk], via="admin")
    assert record.outcome == "refused"
    assert record.results[0]["detail"] == REVERIFY_NOT_REJECTED.format(
        id=event.pk, status="verified"
    )


def test_an_unexpected_error_is_recorded_logged_without_payload_and_the_rest_continue(
    client, push_handler, operator, monkeypatch, caplog
):
    first = receive_github(client, {"card": "4242-secret-body"}, delivery="a")
    second = receive_github(client, delivery="b")
    inbox_run_once()
    import console.services

    real = console.services.raw_event_replay

    def explode_on_first(*, raw_event):
        if raw_event.pk == first.pk:
            raise RuntimeError("boom with 4242-secret-body")
        return real(raw_event=raw_event)

    monkeypatch.setattr(console.services, "raw_event_replay", explode_on_first)
    with caplog.at_level(logging.ERROR, logger="console.services"):
        record = raw_events_replay(actor=operator, raw_event_ids=[first.pk, second.pk], via="admin")

    assert (record.succeeded, record.failed, record.outcome) == (1, 1, "partial")
    assert record.results[0]["detail"] == UNEXPECTED_ERROR.format(
        error="RuntimeError", action_id=record.pk
    )
    assert "4242-secret-body" not in str(record.results)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in failures] == ["console.operator_action.item_failed"]
    assert failures[0].object_id == first.pk
    # The traceback is logged (operators need it); the payload is not in our own fields.
    assert "4242-secret-body" not in failures[0].getMessage()


@pytest.mark.parametrize(
    ("ids", "error"),
    [([], NOTHING_SELECTED), (list(range(1, 502)), "501 objects selected; at most 500")],
)
def test_invalid_selections_do_nothing_and_record_nothing(operator, ids, error):
    with pytest.raises(OperatorActionError, match=error):
        raw_events_replay(actor=operator, raw_event_ids=ids, via="api")
    assert not OperatorAction.objects.exists()


def test_unknown_ids_are_named_and_nothing_runs(client, push_handler, operator):
    event = receive_github(client)
    inbox_run_once()
    with pytest.raises(UnknownObjects) as error:
        raw_events_replay(actor=operator, raw_event_ids=[event.pk, 987654], via="api")
    assert error.value.ids == [987654]
    assert str(error.value) == "Unknown raw event ids: 987654."
    assert not OperatorAction.objects.exists()
    assert push_handler.calls == [event.pk]


def test_the_database_refuses_an_inconsistent_record(operator):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        OperatorAction.objects.create(
            actor=operator,
            actor_username="operator",
            action="raw_event_replay",
            via="api",
            target_model="ingress.rawevent",
            requested=2,
            succeeded=1,
            outcome="succeeded",
        )


def test_a_replay_that_queues_nothing_says_so(client, operator):
    event = receive_github(client, event="star")
    inbox_run_once()
    record = raw_events_replay(actor=operator, raw_event_ids=[event.pk], via="api")
    assert record.results[0]["detail"] == REPLAY_NOTHING_QUEUED.format(
        provider="github", event_type="star"
    )
    assert record.results[0]["deliveries_queued"] == 0
