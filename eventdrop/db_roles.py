"""Database roles per process kind: what each process may do, as GRANTs PostgreSQL enforces.

`manage.py db_roles` creates or updates one role per kind below (named DATABASE_ROLE_PREFIX +
kind), revokes whatever else it held on the project's tables, and grants exactly what the
table says. It runs as the owner of the tables (the migrating user; on managed PostgreSQL
the admin user, which has CREATEROLE); run it after every `migrate` (the release phase), since
a new table has no grants. Each process then connects as its role (DATABASE_URL_<KIND>, see
docs/security.md).

Privileges are granted on the partitioned parent `ingress_rawevent` only: PostgreSQL checks
the parent's privileges for every access through it, and no role but the owner touches a
partition directly (partition maintenance is DDL, the owner's job).

The kinds:
- web — the receive path: one INSERT into the raw store, reading back the new id and nothing
  else (not a body, not a recap, not a user); and its own ACK latency roll-up.
- inbox — verify, dedup, write deliveries. It runs handlers as `handler` (SET LOCAL ROLE
  around each call: handler_role() below, used by ingress/inbox.py) and does not inherit
  that role's privileges itself: the verifier cannot change a recap.
- handler — no login: the business tables webhook handlers write (recaps, outbox rows).
- worker — django-q2's cluster: the dispatcher, recovery, reconciliation and the scheduled
  inbox pass (it inherits `inbox` and `handler`); no DDL, so partition maintenance runs as
  the owner.
- console — the admin, the staff API, the ops page and the buyer API: reads everything, and
  writes only what the operator services and sign-in write; never DELETE of pipeline rows.
"""

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from django.apps import apps
from django.conf import settings
from django.db import connections, models
from django.db.models.fields import AutoFieldMixin

READ = ("SELECT",)
APPEND = ("SELECT", "INSERT")
WRITE = ("SELECT", "INSERT", "UPDATE")
ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")


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
    # Roles whose privileges this one has (INHERIT); roles it may only SET ROLE to.
    inherits: tuple[str, ...] = ()
    may_become: tuple[str, ...] = ()
    description: str = ""


INGRESS_PIPELINE = ("ingress.DedupKey", "ingress.Delivery", "ingress.DeliveryAttempt")
RECAP_BUSINESS = (
    "recaps.RecapVideo",
    "outbox.RecapSideEffect",
    "outbox.RecapSideEffectAttempt",
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
            # The ACK roll-up its flusher thread adds to and prunes (console/ack_rollup.py).
            Grant(("console.AckLatencyHour",), ALL),
        ),
    ),
    RoleSpec(
        kind="handler",
        login=False,
        description="webhook handlers: the recap and outbox tables they write",
        grants=(
            Grant(("recaps.Event", "recaps.Photo"), READ),
            Grant(RECAP_BUSINESS, WRITE),
        ),
    ),
    RoleSpec(
        kind="inbox",
        login=True,
        description="verify, dedup, write deliveries; handlers run as handler",
        grants=(
            Grant(("ingress.RawEvent",), ("SELECT", "UPDATE")),
            Grant(INGRESS_PIPELINE, WRITE),
            # Which handlers are paused: their due deliveries are held, not claimed.
            Grant(("ingress.HandlerPause",), READ),
        ),
        may_become=("handler",),
    ),
    RoleSpec(
        kind="worker",
        login=True,
        description="django-q2: dispatcher, recovery, reconciliation, scheduled inbox pass",
        grants=(
            Grant(("django_q",), ALL),
            Grant(("ingress.RawEvent",), ("INSERT",)),  # backfilled events
            Grant(("ingress.ReconciliationRun",), WRITE),
            Grant(("recaps.Event", "recaps.Photo"), READ),
            Grant(("outbox.CircuitBreaker",), WRITE),
        ),
        inherits=("inbox", "handler"),
    ),
    RoleSpec(
        kind="console",
        login=True,
        description="admin, staff API, ops page, buyer API: reads all, writes via services",
        grants=(
            Grant(("ingress", "recaps", "outbox", "console", "django_q", "auth"), READ),
            Grant(("contenttypes",), READ),
            Grant(("sessions", "knox.AuthToken"), ALL),  # sign-in, sign-out, expired tokens
            Grant(("auth.User",), ("UPDATE",), columns=("last_login",)),
            Grant(("admin.LogEntry",), APPEND),
            Grant(("console.OperatorAction",), WRITE),
            Grant(("console.PayloadAccess",), APPEND),
            # The operator services: replay, re-verify, re-arm, mark dead, retry render,
            # pause and resume.
            Grant(("ingress.RawEvent",), ("UPDATE",)),
            Grant(INGRESS_PIPELINE, WRITE),
            Grant(("ingress.HandlerPause",), WRITE),
            # Recap purchase and redemption (the buyer API) and the operator services.
            Grant(("recaps.RecapVideo",), WRITE),
            Grant(RECAP_BUSINESS[1:], WRITE),
        ),
    ),
)


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
    passwords: dict[str, str] | None = None,
    prefix: str | None = None,
    quote: Callable[[str], str] | None = None,
) -> Plan:
    """The statements that bring every role to its spec (idempotent: run it again any time)."""
    quote = quote or connections["default"].ops.quote_name
    passwords = passwords or {}
    existing = set(existing_roles)
    plan = Plan()
    tables = project_tables()
    for spec in ROLES:
        name = quote(role_name(spec.kind, prefix))
        # Privileges of inherited roles are the member's; roles it may only become are not.
        attributes = [
            "LOGIN" if spec.login else "NOLOGIN",
            "INHERIT" if spec.inherits or not spec.may_become else "NOINHERIT",
            "NOSUPERUSER",
            "NOCREATEDB",
            "NOCREATEROLE",
        ]
        verb = "ALTER" if role_name(spec.kind, prefix) in existing else "CREATE"
        plan.add(f"{verb} ROLE {name} {' '.join(attributes)}")
        if spec.kind in passwords:
            # DDL takes no bind parameters; a literal quoted by the database driver.
            plan.add(
                f"ALTER ROLE {name} PASSWORD {_literal(passwords[spec.kind])}",
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
        for other in (*spec.inherits, *spec.may_become):
            plan.add(f"GRANT {quote(role_name(other, prefix))} TO {name}")
    return plan


def _sequence_grant(model: type[models.Model], role: str) -> str:
    # An INSERT draws an auto id from the table's sequence (identity or serial).
    table, column = model._meta.db_table, model._meta.pk.column
    return (
        "DO $$ DECLARE seq text := pg_get_serial_sequence("
        f"{_literal(table)}, {_literal(column)}); BEGIN IF seq IS NOT NULL THEN "
        f"EXECUTE format('GRANT USAGE ON SEQUENCE %s TO {role}', seq); END IF; END $$"
    )


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def db_roles_apply(
    *, using: str = "default", passwords: dict[str, str] | None = None, prefix: str | None = None
) -> Plan:
    """Create or update every role and its grants, in one transaction."""
    from django.db import transaction

    connection = connections[using]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SELECT rolname FROM pg_roles")
        existing = [row[0] for row in cursor.fetchall()]
        # Sent as SCRAM verifiers hashed by libpq here, never as the password itself: a
        # server logging DDL (log_statement = 'ddl', common on managed PostgreSQL) logs
        # only the verifier.
        verifiers = {
            kind: connection.connection.pgconn.encrypt_password(
                password.encode(), role_name(kind, prefix).encode(), b"scram-sha-256"
            ).decode()
            for kind, password in (passwords or {}).items()
        }
        plan = db_roles_plan(
            database=connection.settings_dict["NAME"],
            existing_roles=existing,
            passwords=verifiers,
            prefix=prefix,
            quote=connection.ops.quote_name,
        )
        for statement in plan.statements:
            cursor.execute(statement)
    return plan


def role_names(kinds: Sequence[str] | None = None, prefix: str | None = None) -> list[str]:
    return [role_name(spec.kind, prefix) for spec in ROLES if kinds is None or spec.kind in kinds]


@contextlib.contextmanager
def handler_role(using: str = "default") -> Iterator[None]:
    """Run webhook handlers as DATABASE_HANDLER_ROLE, inside the caller's savepoint or
    transaction: one handler, or a whole batch of them (ingress/deliveries.py).

    SET LOCAL lasts to the end of the transaction unless undone: handlers that raise have
    their savepoint (or transaction) rolled back, which undoes the SET with it; once they
    return the role is switched back here, so the deliveries' own bookkeeping runs as the
    inbox role again. One query and two SETs per use, only when the setting is on. Unset
    (one role for everything, `make run`): nothing happens.
    """
    role = settings.DATABASE_HANDLER_ROLE
    if not role:
        yield
        return
    quote = connections[using].ops.quote_name
    with connections[using].cursor() as cursor:
        # Back to this role afterwards, not to the session's login role (which `NONE` means):
        # a process may itself run as a role it SET.
        cursor.execute("SELECT current_user")
        previous = cursor.fetchone()[0]
        cursor.execute(f"SET LOCAL ROLE {quote(role)}")
    yield
    with connections[using].cursor() as cursor:
        cursor.execute(f"SET LOCAL ROLE {quote(previous)}")
