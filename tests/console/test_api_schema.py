"""The console API's OpenAPI schema: the committed docs/openapi.json is what the code
generates (regenerate: `manage.py spectacular --file docs/openapi.json --format
openapi-json`), it is valid OpenAPI, and schemathesis, sending requests generated from it to
the real Django app, finds no 500 and no status the schema does not document."""

import json
from io import StringIO
from pathlib import Path

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knox.models import AuthToken
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from tests.console.samples import side_effect, verified_event

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
REGENERATE = "manage.py spectacular --file docs/openapi.json --format openapi-json"


def generated() -> dict:
    out = StringIO()
    call_command(
        "spectacular", "--format", "openapi-json", "--validate", "--fail-on-warn", stdout=out
    )
    return json.loads(out.getvalue())


def test_the_committed_schema_is_the_generated_one():
    assert generated() == json.loads(COMMITTED.read_text()), f"stale: run {REGENERATE}"


def test_every_console_endpoint_is_in_the_schema():
    from tests.console.test_api_access import ENDPOINTS

    paths = json.loads(COMMITTED.read_text())["paths"]
    for spec in ENDPOINTS.values():
        path = spec[1].split("?")[0]
        for name in ("event", "delivery", "side_effect", "recap"):
            path = path.replace(f"{{{name}}}", "{id}")
        if path != "/api/schema/":
            assert path in paths, path


# --- schemathesis against the real app --------------------------------------------------------

schema = schemathesis.openapi.from_dict(json.loads(COMMITTED.read_text()))
# Valid requests and invalid ones (wrong types, missing fields, values out of range).
MODES = list(GenerationMode)


@pytest.fixture
def superuser_headers(django_user_model, client):
    user = django_user_model.objects.create_superuser("fuzzer", "f@example.com", "pw-fuzzer")
    # Something to find: an event with its deliveries, a side effect and its recap.
    verified_event(client, user)
    side_effect(client, user)
    _, token = AuthToken.objects.create(user)
    return {"Authorization": f"Token {token}"}


@pytest.fixture
def app():
    """Django's WSGI application in this thread, on the test's connection: as Django's test
    client does, without closing the connection when a request ends."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


# One test per operation (its own node id, so pytest-xdist spreads them and reports each).
OPERATIONS = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]


@pytest.mark.django_db
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda operation: operation.label)
@given(data=st.data())
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_500_and_no_undocumented_status(operation, data, superuser_headers, app):
    # Valid requests and invalid ones; a list's `cursor` and `limit` fuzzed as any other field.
    case = data.draw(operation.as_strategy(generation_mode=data.draw(st.sampled_from(MODES))))
    # `app` last: the fixtures before it make requests through Django's test client, which
    # reconnects the connection-closing receivers when each of its requests ends.
    response = case.call(app=app, headers=superuser_headers)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance])


@pytest.mark.django_db
def test_sequences_of_calls_find_no_500(superuser_headers, app):
    """Stateful: schemathesis chains the operations by the links it infers from the schema
    (a list's ids into the detail and the actions, a job created into its start and cancel),
    valid and fuzzed requests mixed, and no sequence of them answers a 500 or a status the
    schema does not document."""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case):
            return {"app": app, "headers": superuser_headers}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance])

    assert Workflow.bundles, "no links inferred: the stateful test would call nothing"
    Workflow.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
