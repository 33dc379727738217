"""reverify_events --source: a source nobody configured is an error, not "nothing to do"."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ingress.models import RawEvent
from tests.ingress.test_commands import receive

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_an_unknown_source_is_named_not_reported_as_nothing_to_do():
    with pytest.raises(CommandError) as refused:
        run("reverify_events", "--source", "nope")
    message = str(refused.value)
    assert message.startswith("unknown source 'nope'")
    assert "configured: github, renderer, slack, stripe" in message


def test_a_configured_source_without_rejections_has_nothing_to_do():
    assert run("reverify_events", "--source", "slack") == "re-verified 0 event(s) — nothing to do\n"


def test_a_source_no_longer_configured_is_still_reverified_while_its_rows_exist(client, settings):
    event_id = receive(client, secret="rotated-in secret")
    run("process_inbox", "--once")
    # The source is renamed in the configuration; its rejected rows are still there.
    settings.WEBHOOK_SOURCES = {
        name: options for name, options in settings.WEBHOOK_SOURCES.items() if name != "github"
    }
    assert RawEvent.objects.get(pk=event_id).signature_status == "rejected"
    assert (
        run("reverify_events", "--source", "github").strip()
        == "re-verified 1 event(s) — unknown_source: 1"
    )
