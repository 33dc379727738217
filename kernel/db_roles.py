"""Database roles per process kind: what each process may do, as GRANTs PostgreSQL enforces.
The rules, the kinds and how to run `manage.py db_roles`: docs/security.md, "Database roles
per process kind"; the regions' functions: docs/multi-region.md, "Database roles".
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.apps import apps
from django.conf import settings
from django.db import connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.fields import AutoFieldMixin

from kernel.db import sql_literal

READ = ("SELECT",)
APPEND = ("SELECT", "INSERT")
WRITE = ("SELECT", "INSERT", "UPDATE")
ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")
# A row's state moves on; no row is created or deleted.
UPDATE = ("SELECT", "UPDATE")


@dataclass(frozen=True)
class Grant:
    """Privileges on the tables of some models ("app_label.Model", or "app_label" for all)."""

    targets: tuple[str, ...]
    privileges: tuple[str, ...]
    # Set: a column privilege (SELECT (id)) instead of one on the whole table.
    columns: tuple[str, ...] = ()
    # SELECT on exactly the columns Django's INSERT … RETURNING reads back (the id and any
    # column with a database default), for a role that must not read the rest.
    returning: bool = False


@dataclass(frozen=True)
class RoleSpec:
    kind: str
    login: bool
    grants: tuple[Grant, ...]
    description: str = ""


INGRESS_PIPELINE = (
    "ingress.DedupKey",
    "ingress.Delivery",
    "ingress.DeliveryAttempt",
    # Asked by the inbox's settle, answered by the scheduled run or an operator.
    "ingress.SignatureQuestion",
)
# The processing gate (regions/services.py): its region's row beats and holds the lease
# (SELECT … FOR UPDATE, then UPDATE; region_setup, as the owner, creates it), decisions read.
PROCESSING_GATE = (
    Grant(("regions.RegionState",), UPDATE),
    Grant(("regions.ProcessingDecision",), READ),
    # The one queue's holders (kernel/queue.py): every claim beats its holder's row, and
    # holders gone a day are pruned.
    Grant(("kernel.ClaimHolder",), ALL),
)
SIDE_EFFECTS = ("outbox.RecapSideEffect", "outbox.RecapSideEffectAttempt")
EVENTS = ("recaps.Event", "recaps.Photo")

# Verify, dedup and fan out (ingress/inbox.py), run and record deliveries
# (ingress/deliveries/).
INBOX_PIPELINE = (
    Grant(("ingress.RawEvent",), UPDATE),
    Grant(INGRESS_PIPELINE, WRITE),
    # The claims of raw events: made, given back, and deleted when their rows settle.
    Grant(("ingress.RawEventClaim",), ALL),
    # Which handlers are paused: their due deliveries are held, not claimed.
    Grant(("ingress.HandlerPause",), READ),
    # The handlers' paces (ingress/deliveries/pace.py): made, locked and spent by the claim,
    # slowed by a downstream's 429.
    Grant(("ingress.HandlerPace",), WRITE),
    # The rejected-payload cap's per-minute accounts, pruned after their rows' retention.
    Grant(("ingress.RejectedPayloadMinute",), ALL),
)
# What webhook handlers write in a delivery's transaction, for the roles that run them (inbox,
# worker): a recap moves on but is never created or deleted; its render row is written, or
# deleted with its attempts while unclaimed (outbox.services.side_effect_withdraw).
HANDLER_WRITES = (
    Grant(EVENTS, READ),
    Grant(("recaps.RecapVideo",), UPDATE),
    Grant(SIDE_EFFECTS, ALL),
)
# The outbox (outbox/dispatcher.py, render_status.py): claims and settles side effects, asks
# the render service, moves the recap to rendering, ready or failed, and keeps the breaker.
DISPATCHER_WRITES = (
    Grant(EVENTS, READ),
    Grant(("recaps.RecapVideo",), UPDATE),
    Grant(SIDE_EFFECTS, WRITE),
    Grant(("outbox.CircuitBreaker",), WRITE),
)

ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(
        kind="web",
        login=True,
        description="receive path: INSERT raw events, read back only the new id",
        grants=(
            Grant(("ingress.RawEvent",), ("INSERT",)),
            # INSERT … RETURNING needs SELECT on the returned columns, and only on them.
            Grant(("ingress.RawEvent",), ("SELECT",), returning=True),
        ),
    ),
    RoleSpec(
        kind="inbox",
        login=True,
        description="verify, dedup, write deliveries, and the handlers' writes",
        grants=(*INBOX_PIPELINE, *HANDLER_WRITES, *PROCESSING_GATE),
    ),
    RoleSpec(
        kind="dispatcher",
        login=True,
        description="outbox: side effects, render requests and checks, the breaker",
        grants=(*DISPATCHER_WRITES, *PROCESSING_GATE),
    ),
    RoleSpec(
        kind="worker",
        login=True,
        description="django-q2: inbox pass, dispatcher, recovery, reconciliation, bulk jobs",
        grants=(
            Grant(("django_q",), ALL),
            *INBOX_PIPELINE,
            *HANDLER_WRITES,
            *DISPATCHER_WRITES,
            Grant(("ingress.RawEvent",), ("INSERT",)),  # backfilled events
            Grant(("ingress.ReconciliationRun",), WRITE),
            # Bulk jobs' batches (console/jobs/services.py): the job, its rows (kept a while for
            # the replay SLO, then deleted) and its operator action's counts.
            Grant(("console.BulkJob",), UPDATE),
            Grant(("console.BulkJobItem",), ALL),
            Grant(("console.OperatorAction",), UPDATE),
            # The minute sweep prunes the figures' roll-ups past their 48 h.
            Grant(
                ("console.AckLatencyHour", "console.AckRollupMark", "console.VolumeBucket"),
                ("SELECT", "DELETE"),
            ),
            *PROCESSING_GATE,
        ),
    ),
    RoleSpec(
        kind="console",
        login=True,
        description="admin, staff API, ops page, buyer API: reads all, writes via services",
        grants=(
            Grant(
                ("ingress", "recaps", "outbox", "console", "regions", "kernel", "django_q", "auth"),
                READ,
            ),
            Grant(("contenttypes",), READ),
            Grant(("sessions", "knox.AuthToken"), ALL),  # sign-in, sign-out, expired tokens
            Grant(("auth.User",), ("UPDATE",), columns=("last_login",)),
            Grant(("admin.LogEntry",), APPEND),
            Grant(("console.OperatorAction",), WRITE),
            Grant(("console.PayloadAccess",), APPEND),
            # The ACK roll-up, written by the reads of /metrics and /ops/ (console/ops/).
            Grant(("console.AckLatencyHour", "console.AckRollupMark"), WRITE),
            # The operator services: replay, re-verify, re-arm, mark dead, retry render,
            # pause and resume; bulk jobs previewed, started and cancelled here, their
            # batches queued for the worker (django-q2's ORM broker).
            Grant(("ingress.RawEvent",), ("UPDATE",)),
            # Re-verifying a `worker_died` event hands it back to the inbox as a suspect.
            Grant(("ingress.RawEventClaim",), WRITE),
            Grant(INGRESS_PIPELINE, WRITE),
            Grant(("ingress.HandlerPause",), WRITE),
            Grant(("console.BulkJob",), WRITE),
            Grant(("django_q.OrmQ",), APPEND),
            # Incidents acknowledged and resolved (console/incidents/services.py).
            Grant(("console.Incident",), WRITE),
            # Recap purchase and redemption (the buyer API) and the operator services.
            Grant(("recaps.RecapVideo",), WRITE),
            # Events and their photos, kept by staff in the admin (console/recaps/admin.py).
            Grant(EVENTS, ALL),
            Grant(SIDE_EFFECTS, WRITE),
            # The processing region, switched as an audited action (console/regions/services.py).
            Grant(("regions.ProcessingDecision",), APPEND),
        ),
    ),
)

# Functions region_setup creates (SECURITY DEFINER, owned by the role that ran it), and the
# kinds that may call them; every other role of ours, and PUBLIC, may not.
FUNCTIONS: dict[str, tuple[str, ...]] = {
    # The gate fills or empties this region's state publications.
    "eventdrop_region_publish_state(boolean)": ("inbox", "dispatcher", "worker"),
    # The takeover re-points the subscription from the lost peer (regions/replication.py).
    "eventdrop_region_subscription_without_state(text)": ("console",),
}


def role_name(kind: str, prefix: str | None = None) -> str:
    return f"{settings.DATABASE_ROLE_PREFIX if prefix is None else prefix}{kind}"


def project_tables() -> list[str]:
    """Every table a role could be granted on (concrete, managed models), sorted."""
    return sorted(
        {
            model._meta.db_table
            for model in apps.get_models(include_auto_created=True)
            if model._meta.managed and not model._meta.proxy
        }
    )


def _models(target: str) -> list[type[models.Model]]:
    if "." in target:
        return [apps.get_model(target)]
    return [
        model
        for model in apps.get_app_config(target).get_models(include_auto_created=True)
        if model._meta.managed and not model._meta.proxy
    ]


@dataclass
class Plan:
    """The SQL one run executes, in order, and what --dry-run prints (passwords masked)."""

    statements: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)

    def add(self, sql: str, shown: str | None = None) -> None:
        self.statements.append(sql)
        self.shown.append(sql if shown is None else shown)


def db_roles_plan(
    *,
    database: str,
    existing_roles: Iterable[str],
    memberships: Iterable[tuple[str, str]] = (),
    passwords: dict[str, str] | None = None,
    prefix: str | None = None,
    quote: Callable[[str], str] | None = None,
) -> Plan:
    """The statements that bring every role to its spec (idempotent: run it again any time).

    `memberships`: (role, member) pairs as the catalog has them; every one whose member is
    one of ours is revoked, so that no role of ours can become another role.
    """
    quote = quote or connections["default"].ops.quote_name
    passwords = passwords or {}
    existing = set(existing_roles)
    ours = {role_name(spec.kind, prefix) for spec in ROLES}
    plan = Plan()
    tables = project_tables()
    for spec in ROLES:
        name = quote(role_name(spec.kind, prefix))
        attributes = [
            "LOGIN" if spec.login else "NOLOGIN",
            # Should anyone make it a member of a role by hand, it still uses none of that
            # role's privileges unless it SETs it (and the next run revokes the membership).
            "NOINHERIT",
            "NOSUPERUSER",
            "NOCREATEDB",
            "NOCREATEROLE",
        ]
        verb = "ALTER" if role_name(spec.kind, prefix) in existing else "CREATE"
        plan.add(f"{verb} ROLE {name} {' '.join(attributes)}")
        if spec.kind in passwords:
            # DDL takes no bind parameters; a literal quoted by the database driver.
            plan.add(
                f"ALTER ROLE {name} PASSWORD {sql_literal(passwords[spec.kind])}",
                shown=f"ALTER ROLE {name} PASSWORD '…'",
            )
        plan.add(f"GRANT CONNECT ON DATABASE {quote(database)} TO {name}")
        plan.add(f"GRANT USAGE ON SCHEMA public TO {name}")
        # Start from nothing on every project table, so a narrowed spec takes effect.
        plan.add(f"REVOKE ALL ON {', '.join(quote(t) for t in tables)} FROM {name}")
        for grant in spec.grants:
            granted = {model for target in grant.targets for model in _models(target)}
            targets = sorted(model._meta.db_table for model in granted)
            on = ", ".join(quote(t) for t in targets)
            column_names = list(grant.columns)
            if grant.returning:
                column_names += sorted(
                    {field.column for model in granted for field in model._meta.db_returning_fields}
                )
            columns = ", ".join(quote(c) for c in column_names)
            columns = f" ({columns})" if columns else ""
            for privilege in grant.privileges:
                plan.add(f"GRANT {privilege}{columns} ON {on} TO {name}")
            if "INSERT" in grant.privileges:
                for model in sorted(granted, key=lambda model: model._meta.db_table):
                    if isinstance(model._meta.pk, AutoFieldMixin):
                        plan.add(_sequence_grant(model, name))
    for signature, kinds in FUNCTIONS.items():
        plan.add(
            _function_grant(
                signature,
                [role_name(spec.kind, prefix) for spec in ROLES],
                [role_name(kind, prefix) for kind in kinds],
                quote,
            )
        )
    # A role of ours is a member of nothing: a membership would let it SET ROLE into
    # another's grants.
    for role, member in sorted(memberships):
        if member in ours:
            plan.add(f"REVOKE {quote(role)} FROM {quote(member)}")
    return plan


def _sequence_grant(model: type[models.Model], role: str) -> str:
    # An INSERT draws an auto id from the table's sequence (identity or serial).
    table, column = model._meta.db_table, model._meta.pk.column
    return (
        "DO $$ DECLARE seq text := pg_get_serial_sequence("
        f"{sql_literal(table)}, {sql_literal(column)}); BEGIN IF seq IS NOT NULL THEN "
        f"EXECUTE format('GRANT USAGE ON SEQUENCE %s TO {role}', seq); END IF; END $$"
    )


def _function_grant(
    signature: str, ours: list[str], allowed: list[str], quote: Callable[[str], str]
) -> str:
    """EXECUTE on a function region_setup creates, for `allowed` only; nothing when the
    function does not exist (one region, or region_setup not run yet)."""
    everyone = ", ".join(["PUBLIC", *(quote(role) for role in ours)])
    granted = ", ".join(quote(role) for role in allowed)
    return (
        f"DO $$ BEGIN IF to_regprocedure({sql_literal(signature)}) IS NOT NULL THEN "
        f"REVOKE ALL ON FUNCTION {signature} FROM {everyone}; "
        f"GRANT EXECUTE ON FUNCTION {signature} TO {granted}; END IF; END $$"
    )


def _plan_now(
    connection: BaseDatabaseWrapper,
    cursor: CursorWrapper,
    passwords: dict[str, str] | None,
    prefix: str | None,
) -> Plan:
    """The plan against the server as it is now: its roles, and who is a member of whom."""
    cursor.execute("SELECT rolname FROM pg_roles")
    existing = [row[0] for row in cursor.fetchall()]
    cursor.execute(
        "SELECT role.rolname, member.rolname FROM pg_auth_members m "
        "JOIN pg_roles role ON role.oid = m.roleid JOIN pg_roles member ON member.oid = m.member"
    )
    return db_roles_plan(
        database=connection.settings_dict["NAME"],
        existing_roles=existing,
        memberships=[(role, member) for role, member in cursor.fetchall()],
        passwords=passwords,
        prefix=prefix,
        quote=connection.ops.quote_name,
    )


def db_roles_dry_run(
    *, using: str = "default", passwords: dict[str, str] | None = None, prefix: str | None = None
) -> Plan:
    """The plan a run would execute now, executing nothing."""
    connection = connections[using]
    with connection.cursor() as cursor:
        return _plan_now(connection, cursor, passwords, prefix)


def db_roles_apply(
    *, using: str = "default", passwords: dict[str, str] | None = None, prefix: str | None = None
) -> Plan:
    """Create or update every role and its grants, in one transaction."""
    from django.db import transaction

    connection = connections[using]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        # Sent as SCRAM verifiers hashed by libpq here, never as the password itself: a
        # server logging DDL (log_statement = 'ddl', common on managed PostgreSQL) logs
        # only the verifier.
        verifiers = {
            kind: connection.connection.pgconn.encrypt_password(
                password.encode(), role_name(kind, prefix).encode(), b"scram-sha-256"
            ).decode()
            for kind, password in (passwords or {}).items()
        }
        plan = _plan_now(connection, cursor, verifiers, prefix)
        for statement in plan.statements:
            cursor.execute(statement)
    return plan


def may_create_roles() -> bool:
    """Whether the role this process connects as may create and grant roles (a superuser,
    or the managed admin with CREATEROLE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        )
        row = cursor.fetchone()
    return bool(row and row[0])
