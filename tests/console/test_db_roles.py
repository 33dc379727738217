"""Database roles per process kind (`manage.py db_roles`): what each one cannot do.

The roles are created on the test database inside the test's transaction (CREATE ROLE and
GRANT are transactional in PostgreSQL, so they vanish with it), and the test connection
becomes each role with SET ROLE: from then on PostgreSQL checks that role's privileges,
exactly as for a process logged in as it. The real code paths run that way too — the
receive view as `web`, the inbox (handlers as `handler`) as `inbox`, the dispatcher as
`worker`, the admin and API as `console`. The last test logs in for real as every role.
"""

import contextlib
import json
import uuid

import psycopg
import pytest
from django.db import ProgrammingError, connection, transaction
from django.utils import timezone

from console.ack_rollup import COLUMNS, ack_rollup_add
from console.models import OperatorAction
from eventdrop.db_roles import ROLES, db_roles_apply, role_name
from ingress.models import Delivery, RawEvent
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.console.conftest import github_signature, receive_github
from tests.console.samples import paid_recap
from tests.support.signing import stripe_event, stripe_headers
from tests.support.sql import scalar

pytestmark = pytest.mark.django_db

PREFIX = f"edtest_{uuid.uuid4().hex[:6]}_"


@pytest.fixture
def roles(settings):
    settings.DATABASE_ROLE_PREFIX = PREFIX
    db_roles_apply()


@contextlib.contextmanager
def acting_as(kind: str):
    with connection.cursor() as cursor:
        cursor.execute(f'SET ROLE "{role_name(kind, PREFIX)}"')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")


def permitted(action) -> bool:
    """Run `action` in a savepoint: True if it ran, False if PostgreSQL refused it."""
    try:
        with transaction.atomic():
            action()
    except ProgrammingError as exc:
        if "permission denied" not in str(exc):
            raise
        return False
    return True


def new_raw_event(**fields) -> RawEvent:
    return RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/webhooks/github/",
        headers={"x-github-event": "push"},
        body=b'{"ref": "refs/heads/main"}',
        body_sha256="0" * 64,
        **fields,
    )


def sql(statement: str):
    def run():
        with connection.cursor() as cursor:
            cursor.execute(statement)

    return run


ACTIONS = {
    "store a raw event": new_raw_event,
    "read raw bodies": lambda: list(RawEvent.objects.values_list("body", flat=True)),
    "read raw headers": lambda: list(RawEvent.objects.values_list("headers", flat=True)),
    "change a raw event": lambda: RawEvent.objects.update(verify_count=7),
    "delete raw events": sql("DELETE FROM ingress_rawevent WHERE id = -1"),
    "write a delivery": lambda: Delivery.objects.filter(id=-1).update(attempts=1),
    "read recaps": lambda: list(RecapVideo.objects.values_list("id", flat=True)),
    "change a recap": lambda: RecapVideo.objects.update(updated_at=timezone.now()),
    "delete recaps": sql("DELETE FROM recap_videos WHERE status = 'x'"),
    "change a side effect": lambda: RecapSideEffect.objects.update(attempts=3),
    "read users": sql("SELECT password FROM auth_user"),
    "make a superuser": sql("UPDATE auth_user SET is_superuser = true"),
    "record an operator action": lambda: OperatorAction.objects.update(note="x"),
    "create a table": sql("CREATE TABLE roles_probe (id int)"),
    "roll up ACK latency": lambda: ack_rollup_add(
        {("github", timezone.now().replace(minute=0, second=0, microsecond=0)): [1] * len(COLUMNS)}
    ),
}

# kind → what it may do; everything else in ACTIONS must be refused.
MAY = {
    "web": {"store a raw event", "roll up ACK latency"},
    "inbox": {"read raw bodies", "read raw headers", "change a raw event", "write a delivery"},
    "handler": {"read recaps", "change a recap", "change a side effect"},
    "worker": {
        "store a raw event",
        "read raw bodies",
        "read raw headers",
        "change a raw event",
        "write a delivery",
        "read recaps",
        "change a recap",
        "change a side effect",
    },
    "console": {
        # It signs staff in: it checks password hashes (it cannot change who is superuser).
        "read users",
        "read raw bodies",
        "read raw headers",
        "change a raw event",
        "write a delivery",
        "read recaps",
        "change a recap",
        "change a side effect",
        "record an operator action",
    },
}
TABLE = [
    pytest.param(kind, action, action in MAY[kind], id=f"{kind}-{action.replace(' ', '_')}")
    for kind in MAY
    for action in ACTIONS
]


@pytest.fixture
def rows(client, admin_user):
    new_raw_event()
    return paid_recap(client, admin_user)


@pytest.mark.parametrize(("kind", "action", "allowed"), TABLE)
def test_what_each_role_may_do(roles, rows, kind, action, allowed):
    with acting_as(kind):
        assert permitted(ACTIONS[action]) is allowed


def test_every_kind_is_in_the_table():
    assert {spec.kind for spec in ROLES} == set(MAY)


# --- the real code paths, as their roles -----------------------------------------------------


def test_the_receive_path_runs_as_web(roles, client):
    body = b'{"ref": "refs/heads/main"}'
    with acting_as("web"):
        response = client.generic(
            "POST",
            "/webhooks/github/",
            body,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256=github_signature(body),
            HTTP_X_GITHUB_EVENT="push",
            HTTP_X_GITHUB_DELIVERY="as-web",
        )
        assert response.status_code == 202, response.content
        event_id = response.json()["id"]
        # …and cannot read back what it stored.
        assert not permitted(lambda: RawEvent.objects.get(pk=event_id).body)
    assert bytes(RawEvent.objects.get(pk=event_id).body) == body


def test_the_inbox_runs_handlers_as_handler(roles, settings, client, admin_user):
    """A Stripe payment through the inbox: verified as `inbox`, the recap paid as `handler`."""
    from ingress.inbox import inbox_run_once

    settings.DATABASE_HANDLER_ROLE = role_name("handler", PREFIX)
    recap = RecapVideo.objects.create(event=paid_recap(client, admin_user).event, buyer=admin_user)
    body = stripe_event(
        "evt_roles_1",
        "checkout.session.completed",
        {
            "id": "cs_roles",
            "object": "checkout.session",
            "payment_status": "paid",
            "payment_intent": "pi_roles",
            "metadata": {"recap_id": str(recap.id)},
        },
    )
    with acting_as("web"):
        response = client.generic(
            "POST",
            "/webhooks/stripe/",
            body,
            content_type="application/json",
            **stripe_headers(body),
        )
        assert response.status_code == 202, response.content
    with acting_as("inbox"):
        inbox_run_once()
        assert current_user() == role_name("inbox", PREFIX)
        # The inbox itself still cannot touch the recap it just had paid.
        assert not permitted(lambda: RecapVideo.objects.update(updated_at=timezone.now()))
    [delivery] = Delivery.objects.filter(raw_event_id=response.json()["id"])
    assert delivery.status == "done", delivery.last_error
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    assert RecapSideEffect.objects.filter(recap=recap, status="pending").exists()


def current_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def test_a_failing_handler_hands_the_inbox_its_role_back(roles, settings, client, push_handler):
    from ingress.inbox import inbox_run_once

    settings.DATABASE_HANDLER_ROLE = role_name("handler", PREFIX)
    push_handler.fail_with = ValueError("boom")
    event = receive_github(client, {"ref": "refs/heads/main"}, delivery="fails")
    with acting_as("inbox"):
        inbox_run_once()
        # The savepoint's rollback undid the handler's SET LOCAL ROLE with it.
        assert current_user() == role_name("inbox", PREFIX)
    [delivery] = Delivery.objects.filter(raw_event=event)
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error == "ValueError: boom"


def test_the_dispatcher_runs_as_worker(roles, client, admin_user, fake_renderer):
    from outbox.dispatcher import dispatch_run

    recap = paid_recap(client, admin_user)
    with acting_as("worker"):
        dispatch_run(now=timezone.now())
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING
    assert RecapSideEffect.objects.get(recap=recap).status == "done"


def test_the_console_runs_as_console(roles, client, payload_operator):
    from rest_framework.test import APIClient

    event = new_raw_event()
    client.force_login(payload_operator)
    api = APIClient()
    api.force_authenticate(payload_operator)
    with acting_as("console"):
        page = client.get(f"/admin/ingress/rawevent/{event.pk}/change/")
        assert page.status_code == 200 and b"refs/heads/main" in page.content
        response = api.post("/api/raw-events/reverify/", {"ids": [event.pk]}, format="json")
        assert response.status_code == 200, response.content
        assert json.loads(response.content)["via"] == "api"
        # An operator's session cannot delete the pipeline's rows, whatever the code does.
        assert not permitted(sql("DELETE FROM ingress_rawevent WHERE id > 0"))


# --- logging in for real -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_login_role_connects_and_is_refused_what_it_may_not(settings):
    prefix = f"edlogin_{uuid.uuid4().hex[:6]}_"
    settings.DATABASE_ROLE_PREFIX = prefix
    db_roles_apply(passwords={spec.kind: "pw-unused-with-trust" for spec in ROLES})
    params = connection.get_connection_params()
    refused = {
        "web": "SELECT body FROM ingress_rawevent",
        "inbox": "UPDATE recap_videos SET status = 'failed'",
        "worker": "SELECT password FROM auth_user",
        "console": "DELETE FROM ingress_rawevent",
    }
    try:
        for kind, statement in refused.items():
            with psycopg.connect(
                host=params.get("host", "127.0.0.1"),
                port=params.get("port", 5432),
                dbname=connection.settings_dict["NAME"],
                user=role_name(kind, prefix),
                password="pw-unused-with-trust",
                connect_timeout=5,
            ) as conn:
                assert scalar(conn, "SELECT current_user") == role_name(kind, prefix)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [f"{prefix}handler"]
            )
            assert cursor.fetchone() == (False,)
            # The server got a SCRAM verifier, never the password.
            cursor.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [f"{prefix}web"])
            assert cursor.fetchone()[0].startswith("SCRAM-SHA-256$4096:")
    finally:
        with connection.cursor() as cursor:
            for spec in reversed(ROLES):
                name = role_name(spec.kind, prefix)
                cursor.execute(f'DROP OWNED BY "{name}"')
                cursor.execute(f'DROP ROLE "{name}"')


def test_the_command_prints_its_sql_with_passwords_masked(settings, monkeypatch):
    import io

    from django.core.management import call_command

    settings.DATABASE_ROLE_PREFIX = PREFIX
    monkeypatch.setenv("DATABASE_ROLE_PASSWORD_WEB", "s3cret-web-password")
    out = io.StringIO()
    call_command("db_roles", "--dry-run", stdout=out)
    printed = out.getvalue()
    assert f'CREATE ROLE "{PREFIX}web" LOGIN' in printed
    assert f'CREATE ROLE "{PREFIX}handler" NOLOGIN' in printed
    assert f'CREATE ROLE "{PREFIX}inbox" LOGIN NOINHERIT' in printed
    assert f"ALTER ROLE \"{PREFIX}web\" PASSWORD '…'" in printed
    assert "s3cret-web-password" not in printed
    # Dry: nothing was created.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_roles WHERE rolname LIKE %s", [f"{PREFIX}%"])
        assert cursor.fetchone() == (0,)
    call_command("db_roles", stdout=out)
    assert "up to date" in out.getvalue()
    # Run again: the roles exist now and are updated in place.
    call_command("db_roles", stdout=out)


@pytest.fixture
def committed_roles(settings):
    """The roles for real, committed (so other processes can log in), dropped afterwards."""
    prefix = f"edproc_{uuid.uuid4().hex[:6]}_"
    settings.DATABASE_ROLE_PREFIX = prefix
    db_roles_apply()
    yield prefix
    with connection.cursor() as cursor:
        for spec in reversed(ROLES):
            name = role_name(spec.kind, prefix)
            cursor.execute(f'DROP OWNED BY "{name}"')
            cursor.execute(f'DROP ROLE "{name}"')


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_processes_run_as_their_roles(committed_roles, tmp_path):
    """The Procfile's web process as `web`, `process_inbox` as `inbox` (handlers as
    `handler`): a webhook is stored and verified. About 10 s."""
    import http.client

    from tests.support.processes import app_env, free_port, manage, start_procfile

    params = connection.get_connection_params()
    host, port, name = params.get("host", "127.0.0.1"), params.get("port", 5432), params["dbname"]

    def url(kind: str) -> str:
        return f"postgres://{role_name(kind, committed_roles)}@{host}:{port}/{name}"

    # Every process gets the owner's DATABASE_URL too, as on a platform whose config is
    # shared: EVENTDROP_PROCESS picks the role's URL over it.
    owner = f"postgres://postgres@{host}:{port}/{name}"
    roles_env = {"DATABASE_ROLE_PREFIX": committed_roles}
    web_env = app_env(
        owner,
        EVENTDROP_PROCESS="web",
        DATABASE_URL_WEB=url("web"),
        WEB_CONCURRENCY="1",
        **roles_env,
    )
    web_port = free_port()
    web = start_procfile("web", web_env, port=web_port, log=tmp_path / "web.log")
    try:
        web.wait_listening(web_port, timeout=30)
        body = b'{"ref": "refs/heads/main"}'
        conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
        conn.request(
            "POST",
            "/webhooks/github/",
            body=body,
            headers={
                "Content-Type": "application/json",
                "X-Hub-Signature-256": github_signature(body),
                "X-GitHub-Event": "push",
                "X-GitHub-Delivery": "as-roles",
            },
        )
        response = conn.getresponse()
        answer = response.read()
        assert response.status == 202, answer + web.output().encode()
        # The same process cannot serve the console: its role reads no sessions or users.
        conn.request("GET", "/admin/", headers={"Cookie": "sessionid=made-up-session"})
        assert conn.getresponse().status == 500
        conn.close()
    finally:
        web.stop()
    inbox_env = app_env(
        owner, EVENTDROP_PROCESS="inbox", DATABASE_URL_INBOX=url("inbox"), **roles_env
    )
    manage("process_inbox", "--once", env=inbox_env)
    event = RawEvent.objects.get(delivery_id="as-roles")
    assert event.signature_status == "verified" and bytes(event.body) == body


@pytest.mark.slow
@pytest.mark.parametrize(
    ("environment", "user", "handler_role"),
    [
        ({}, "owner", ""),
        ({"EVENTDROP_PROCESS": "web"}, "owner", ""),  # no DATABASE_URL_WEB: one URL for all
        ({"EVENTDROP_PROCESS": "web", "DATABASE_URL_WEB": "x_web"}, "x_web", ""),
        ({"EVENTDROP_PROCESS": "inbox", "DATABASE_URL_INBOX": "x_inbox"}, "x_inbox", "x_handler"),
        ({"EVENTDROP_PROCESS": "worker", "DATABASE_URL_WORKER": "x_w"}, "x_w", "x_handler"),
        (
            {
                "EVENTDROP_PROCESS": "inbox",
                "DATABASE_URL_INBOX": "x_inbox",
                "DATABASE_HANDLER_ROLE": "custom",
            },
            "x_inbox",
            "custom",
        ),
    ],
    ids=["make-run", "web-no-url", "web", "inbox", "worker", "inbox-own-handler-role"],
)
def test_each_process_kind_picks_its_url(environment, user, handler_role):
    """The settings, in a subprocess as a process would load them (about 2 s each)."""
    from tests.support.processes import app_env, manage

    def pg(name: str) -> str:
        return f"postgres://{name}@127.0.0.1:5432/eventdrop"

    env = app_env(pg("owner"), DATABASE_ROLE_PREFIX="x_")
    env.update({k: pg(v) if k.startswith("DATABASE_URL_") else v for k, v in environment.items()})
    shown = manage(
        "shell",
        "-c",
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['USER'], repr(s.DATABASE_HANDLER_ROLE))",
        env=env,
    ).stdout.split()
    assert shown[-2:] == [user, repr(handler_role)]
