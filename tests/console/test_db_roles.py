"""Database roles per process kind (`manage.py db_roles`): what each one cannot do.

The roles are created on the test database inside the test's transaction (CREATE ROLE and
GRANT are transactional in PostgreSQL, so they vanish with it), and the test connection
becomes each role with SET ROLE (as the superuser it is): from then on PostgreSQL checks that
role's privileges, exactly as for a process logged in as it. The real code paths run that
way too — the receive view as `web`, the inbox and its handlers as `inbox`, the dispatcher
as `dispatcher` and `worker`, bulk jobs as `console` and `worker`, the admin and API as
`console`. No role can become another. The last tests log in for real as every role.
"""

import contextlib
import json
import uuid

import psycopg
import pytest
from django.db import ProgrammingError, connection, transaction
from django.utils import timezone

from console.models import OperatorAction
from console.ops.ack_rollup import COLUMNS, ack_rollup_add
from ingress.models import Delivery, RawEvent
from kernel.db_roles import ROLES, db_roles_apply, role_name
from kernel.process_kinds import KINDS
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.console.conftest import github_signature
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
    # Privileges are checked when a statement starts, whatever rows it would touch.
    "create a recap": sql("INSERT INTO recap_videos SELECT * FROM recap_videos WHERE false"),
    "add an event": sql("INSERT INTO recaps_event SELECT * FROM recaps_event WHERE false"),
    "delete a photo": sql("DELETE FROM recaps_photo WHERE id = -1"),
    "delete recaps": sql("DELETE FROM recap_videos WHERE status = 'x'"),
    "change a side effect": lambda: RecapSideEffect.objects.update(attempts=3),
    "delete a side effect": sql("DELETE FROM recap_side_effects WHERE id = -1"),
    "trip the render breaker": sql("UPDATE outbox_circuit_breakers SET name = name WHERE false"),
    "read users": sql("SELECT password FROM auth_user"),
    "make a superuser": sql("UPDATE auth_user SET is_superuser = true"),
    "record an operator action": lambda: OperatorAction.objects.update(note="x"),
    "acknowledge an incident": sql("UPDATE console_incident SET id = id WHERE false"),
    "queue a task": sql("INSERT INTO django_q_ormq SELECT * FROM django_q_ormq WHERE false"),
    "create a table": sql("CREATE TABLE roles_probe (id int)"),
    "roll up ACK latency": lambda: ack_rollup_add(
        {("github", timezone.now().replace(minute=0, second=0, microsecond=0)): [1] * len(COLUMNS)}
    ),
}

# What webhook handlers write, held by the roles that run them (inbox, worker).
HANDLER_WRITES = {"read recaps", "change a recap", "change a side effect", "delete a side effect"}
# kind → what it may do; everything else in ACTIONS must be refused.
MAY = {
    "web": {"store a raw event"},
    "inbox": {
        "read raw bodies",
        "read raw headers",
        "change a raw event",
        "write a delivery",
        *HANDLER_WRITES,
    },
    "dispatcher": {
        "read recaps",
        "change a recap",
        "change a side effect",
        "trip the render breaker",
    },
    "worker": {
        "store a raw event",
        "read raw bodies",
        "read raw headers",
        "change a raw event",
        "write a delivery",
        *HANDLER_WRITES,
        "trip the render breaker",
        "record an operator action",  # a bulk job's counts
        "queue a task",
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
        # A purchase (the buyer API) creates its recap.
        "create a recap",
        # Staff keep events and their photos in the admin (console/recaps/admin.py).
        "add an event",
        "delete a photo",
        "change a side effect",
        "record an operator action",
        "acknowledge an incident",
        # The ACK histogram is rolled up by the reads of /metrics and /ops/.
        "roll up ACK latency",
        # A bulk job started here is queued for the worker (django-q2's ORM broker).
        "queue a task",
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
    # Every process kind but the release phase (the owner, which migrates) has its role.
    assert set(MAY) == set(KINDS) - {"release"}


def test_a_membership_left_from_an_earlier_spec_is_revoked(settings):
    """The inbox was a member of `handler`, which it switched to for handlers: gone."""
    settings.DATABASE_ROLE_PREFIX = PREFIX
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{PREFIX}handler" NOLOGIN')
        cursor.execute(f'CREATE ROLE "{PREFIX}inbox" LOGIN')
        cursor.execute(f'GRANT "{PREFIX}handler" TO "{PREFIX}inbox"')
    plan = db_roles_apply()
    assert f'REVOKE "{PREFIX}handler" FROM "{PREFIX}inbox"' in plan.statements
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            "WHERE r.rolname LIKE %s",
            [f"{PREFIX}%"],
        )
        assert cursor.fetchone() == (0,)


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


def test_the_inbox_runs_handlers_as_itself(roles, client, admin_user):
    """A Stripe payment through the inbox, as `inbox`: verified, and the recap paid by the
    handler with the writes db_roles grants the inbox on its handlers' behalf."""
    from ingress.inbox import inbox_run_once

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
        # What no handler does, the inbox cannot do either: create or delete a recap.
        assert not permitted(ACTIONS["create a recap"])
        assert not permitted(ACTIONS["delete recaps"])
    [delivery] = Delivery.objects.filter(raw_event_id=response.json()["id"])
    assert delivery.status == "done", delivery.last_error
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    assert RecapSideEffect.objects.filter(recap=recap, status="pending").exists()


def current_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        return cursor.fetchone()[0]


def test_a_withdrawn_payment_deletes_its_render_row_as_inbox(roles):
    """The one DELETE a handler makes: a failed asynchronous payment withdraws the render
    row no dispatcher has claimed (outbox.services.side_effect_withdraw)."""
    from recaps.handlers import record_checkout_session
    from tests.recaps.factories import RecapFactory
    from tests.recaps.test_checkout_event_orders import CREATED, checkout_event
    from tests.recaps.test_handlers import STRIPE

    recap = RecapFactory.create(checkout_session_id="cs_test_roles")
    with acting_as("inbox"):
        for event_type, created in (
            ("checkout.session.async_payment_succeeded", CREATED + 10),
            ("checkout.session.async_payment_failed", CREATED + 20),
        ):
            event = checkout_event(recap, event_type, session="cs_test_roles", created=created)
            record_checkout_session(STRIPE, event.to_dict())
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PENDING_PAYMENT
    assert not RecapSideEffect.objects.filter(recap=recap).exists()


@pytest.mark.parametrize("kind", ["dispatcher", "worker"])
def test_the_dispatcher_runs_as_its_role(roles, client, admin_user, fake_renderer, kind):
    from outbox.dispatcher import dispatch_run

    recap = paid_recap(client, admin_user)
    with acting_as(kind):
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


def test_a_bulk_job_is_started_as_console_and_run_as_worker(
    roles, operator, monkeypatch, django_capture_on_commit_callbacks
):
    from django_q.models import OrmQ
    from rest_framework.test import APIClient

    from console.jobs import services as bulk_jobs
    from console.models import BulkJob

    events = [new_raw_event(delivery_id=f"bulk-{n}") for n in range(3)]
    RawEvent.objects.filter(pk__in=[e.pk for e in events]).update(
        signature_status="verified", dispatch_status="no_handler", verified_at=timezone.now()
    )
    queued: list[int] = []
    # Queued as django-q2's ORM broker queues it (the test settings run tasks inline).
    monkeypatch.setattr(
        bulk_jobs, "_enqueue", lambda job_id: queued.append(OrmQ.objects.create(key="t").pk)
    )
    api = APIClient()
    api.force_authenticate(operator)
    with acting_as("console"):
        preview = api.post(
            "/api/jobs/",
            {"kind": "replay_raw_events", "ids": [e.pk for e in events]},
            format="json",
        )
        assert preview.status_code == 201, preview.content
        job_id = preview.json()["id"]
        with django_capture_on_commit_callbacks(execute=True):
            started = api.post(f"/api/jobs/{job_id}/start/", {}, format="json")
        assert started.status_code == 202, started.content
    assert len(queued) == 1
    with acting_as("worker"):
        bulk_jobs.bulk_job_run(job_id=job_id, batch_size=2)
    job = BulkJob.objects.get(pk=job_id)
    assert (job.state, job.processed) == ("done", 3)


# --- logging in for real -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_login_role_connects_and_is_refused_what_it_may_not(settings):
    """Logged in for real, as a process is: each role is refused a write it must not make,
    and `SET ROLE` to every other role — the inbox to `handler` too, of which an earlier
    version made it a member (PostgreSQL 15 checks the session's login role, so only a real
    login shows this)."""
    prefix = f"edlogin_{uuid.uuid4().hex[:6]}_"
    settings.DATABASE_ROLE_PREFIX = prefix
    retired = f"{prefix}handler"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{retired}" NOLOGIN')
        cursor.execute(f'CREATE ROLE "{prefix}inbox" LOGIN')
        cursor.execute(f'GRANT "{retired}" TO "{prefix}inbox"')
    db_roles_apply(passwords={spec.kind: "pw-unused-with-trust" for spec in ROLES})
    params = connection.get_connection_params()
    refused = {
        "web": "SELECT body FROM ingress_rawevent",
        "inbox": "INSERT INTO recap_videos SELECT * FROM recap_videos WHERE false",
        "dispatcher": "SELECT body FROM ingress_rawevent",
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
                conn.rollback()
                others = [role_name(other, prefix) for other in refused if other != kind]
                for other in [*others, retired]:
                    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="set role"):
                        conn.execute(f'SET ROLE "{other}"')
                    conn.rollback()
        with connection.cursor() as cursor:
            # The server got a SCRAM verifier, never the password.
            cursor.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [f"{prefix}web"])
            assert cursor.fetchone()[0].startswith("SCRAM-SHA-256$4096:")
    finally:
        with connection.cursor() as cursor:
            for name in [*(role_name(spec.kind, prefix) for spec in reversed(ROLES)), retired]:
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
    assert f'CREATE ROLE "{PREFIX}web" LOGIN NOINHERIT' in printed
    assert f'CREATE ROLE "{PREFIX}inbox" LOGIN NOINHERIT' in printed
    assert f"{PREFIX}handler" not in printed
    assert 'GRANT "' not in printed  # no role is granted another
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
    ("environment", "user"),
    [
        ({}, "owner"),
        ({"EVENTDROP_PROCESS": "web"}, "owner"),  # no DATABASE_URL_WEB: one URL for all
        ({"EVENTDROP_PROCESS": "web", "DATABASE_URL_WEB": "x_web"}, "x_web"),
        ({"EVENTDROP_PROCESS": "inbox", "DATABASE_URL_INBOX": "x_inbox"}, "x_inbox"),
        ({"EVENTDROP_PROCESS": "dispatcher", "DATABASE_URL_DISPATCHER": "x_d"}, "x_d"),
        ({"EVENTDROP_PROCESS": "worker", "DATABASE_URL_WORKER": "x_w"}, "x_w"),
        ({"EVENTDROP_PROCESS": "console", "DATABASE_URL_CONSOLE": "x_c"}, "x_c"),
    ],
    ids=["make-run", "web-no-url", "web", "inbox", "dispatcher", "worker", "console"],
)
def test_each_process_kind_picks_its_url(environment, user):
    """The settings, in a subprocess as a process would load them (about 2 s each)."""
    from tests.support.processes import app_env, manage

    def pg(name: str) -> str:
        return f"postgres://{name}@127.0.0.1:5432/eventdrop"

    env = app_env(pg("owner"), DATABASE_ROLE_PREFIX="x_")
    env.update({k: pg(v) if k.startswith("DATABASE_URL_") else v for k, v in environment.items()})
    shown = manage(
        "shell",
        "-c",
        "from django.conf import settings as s; print(s.DATABASES['default']['USER'])",
        env=env,
    ).stdout.split()
    assert shown[-1] == user
