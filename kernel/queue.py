"""The one queue: every row that is claimed and worked on — deliveries (ingress), recap side
effects (outbox) and the inbox's claims of raw events. The rules: docs/queue.md.

A row is `pending` until a worker claims it (`processing`, the attempt charged, stamped
`claimed_at` and `claimed_by`), then its worker records one outcome, fenced on the claim:
done, a retry or a release as kernel/retry.py decides, dead, or the claim given back. A
claim lives as long as its holder: the process that made it, known to PostgreSQL by a
heartbeat row (ClaimHolder). `rearm_orphaned` takes back the claims of holders that stopped
beating, of another region's holders, and (a backstop) claims older than a worst case.

`WorkItem` is the abstract model (the columns), `WorkQuerySet` the state machine (as
Sentry's OutboxBase keeps it on the base); a concrete queue declares its status column and,
in class attributes, what a claim also writes and returns.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, models, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from kernel.db import sql_literal
from kernel.db.json_rows import ENCODER as JSON_ENCODER
from kernel.db.json_rows import json_rows, json_scalar
from kernel.models import ClaimHolder
from kernel.retry import Action, RetryDecision

# A holder's id: its region's number in the bits above these (as the regions' id blocks),
# random below, so that another region's claims are told apart without a lookup.
HOLDER_REGION_SHIFT = 48

PENDING, PROCESSING, DONE, DEAD = "pending", "processing", "done", "dead"
# Our own database failing (connection lost, restart, statement or lock timeout, deadlock):
# never a verdict about a row; claims then go back, or are owed until it answers.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


# --- the holder: this process, as PostgreSQL knows it ---------------------------------------


@dataclass
class Holder:
    """One process that claims rows. Its heartbeat row says it lives; the claims it owes a
    give-back (our database failed under them) are kept here until given back."""

    id: int
    kind: str = ""
    pid: int = field(default_factory=os.getpid)
    owed: dict[str, list[Any]] = field(default_factory=dict)  # ledger -> claims
    # The process's cost decisions between passes (a cool-down, a choice of read), never a
    # verdict about a row: kept with its other state rather than in module globals.
    memo: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    beaten_at: datetime | None = None

    @classmethod
    def new(cls, *, region: int | None = None, kind: str = "") -> Holder:
        number = settings.EVENTDROP_REGION_NUMBER if region is None else region
        return cls(id=(number << HOLDER_REGION_SHIFT) | secrets.randbits(HOLDER_REGION_SHIFT),
                   kind=kind or settings.PROCESS_KIND)

    @property
    def region(self) -> int:
        return self.id >> HOLDER_REGION_SHIFT

    def beat_params(self, now: datetime) -> dict[str, Any]:
        return {
            "holder": self.id,
            "holder_kind": self.kind[:32],
            "holder_host": socket.gethostname()[:255],
            "holder_pid": self.pid,
            "now": now,
        }

    def owe(self, ledger: str, claims: Iterable[Any]) -> None:
        """Claims this process could not finish and could not give back yet (our database
        failed): kept under `ledger` until `pay` gives them back."""
        with self.lock:
            self.owed.setdefault(ledger, []).extend(claims)

    def pay(self, ledger: str, give_back: Callable[[list[Any]], int]) -> int:
        """Give back what `ledger` owes (`give_back`: the fenced statement, how many rows it
        freed; run again on a claim already given back, it frees none). Raises while our
        database is unavailable: the claims stay owed."""
        with self.lock:
            owed = list(self.owed.get(ledger, ()))
        if not owed:
            return 0
        given = give_back(owed)
        with self.lock:
            del self.owed[ledger][: len(owed)]
        return given

    def give_back_or_owe(
        self, ledger: str, claims: Iterable[Any], give_back: Callable[[list[Any]], int]
    ) -> int:
        """Claims this worker lives to see unfinished: given back now with whatever it owes,
        or, our database unavailable, owed to the next pass (which pays before it claims)."""
        self.owe(ledger, claims)
        try:
            return self.pay(ledger, give_back)
        except DATABASE_UNAVAILABLE:
            return 0

    def beat(self, *, now: datetime | None = None) -> None:
        """Say this process lives (one upsert, autocommit). Outside any transaction: a beat
        inside one is seen only at its commit."""
        now = now or timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(statement(BEAT), self.beat_params(now))
        self.beaten_at = now

    def beat_if_due(self) -> None:
        """A beat when the last one is older than CLAIM_HOLDER_BEAT_SECONDS (a wait loop)."""
        now = timezone.now()
        every = timedelta(seconds=settings.CLAIM_HOLDER_BEAT_SECONDS)
        if self.beaten_at is None or now - self.beaten_at >= every:
            self.beat(now=now)


_process_holder: Holder | None = None
_process_holder_lock = threading.Lock()


def this_process() -> Holder:
    """This process's holder; a new one after a fork (django-q2's workers are forked)."""
    global _process_holder
    with _process_holder_lock:
        if _process_holder is None or _process_holder.pid != os.getpid():
            _process_holder = Holder.new()
        return _process_holder


def holder_alive_since(now: datetime) -> datetime:
    """A holder whose last beat is older than this is gone."""
    return now - timedelta(seconds=settings.CLAIM_HOLDER_TTL_SECONDS)


def holders_prune(*, now: datetime | None = None) -> int:
    """Forget holders silent for a day (a process that ended): their claims, if any, are
    orphaned either way. Returns how many."""
    now = now or timezone.now()
    deleted, _ = ClaimHolder.objects.filter(beat_at__lt=now - timedelta(days=1)).delete()
    return deleted


def foreign(holder_id: int) -> bool:
    """Whether a claim's holder is another region's (its claims are taken back here)."""
    return holder_id >> HOLDER_REGION_SHIFT != settings.EVENTDROP_REGION_NUMBER


# --- the statements ------------------------------------------------------------------------
# Named once; {table}, {holders} and the model's own pieces are filled in by statement().

# The holder's heartbeat. Also run as the first CTE of every claim, so that a claim and the
# proof that its holder lives are written together.
BEAT = (
    "INSERT INTO {holders} AS h (id, kind, host, pid, started_at, beat_at)"
    " VALUES (%(holder)s, %(holder_kind)s, %(holder_host)s, %(holder_pid)s, %(now)s, %(now)s)"
    " ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at"
)
# A claim's holder is gone: another region's, or no beat since `alive_since` while the
# server has been up since then (after a restart every holder is silent until it
# reconnects, and a live one gives its claims back itself).
# A claim made before holders existed (claimed_by NULL) has only the backstop.
HOLDER_GONE = (
    "(({claim}.claimed_by >> {shift}) <> %(region)s"
    " OR (pg_postmaster_start_time() < %(alive_since)s AND NOT EXISTS (SELECT 1"
    " FROM {holders} AS h WHERE h.id = {claim}.claimed_by AND h.beat_at >= %(alive_since)s)))"
)
# The claimed prefix of `due` (id, turn, order, worker_deaths[, bytes]), in turns (each
# group's oldest, then each group's second, ...): the first row always, then up to `limit`
# rows while none of them, this one included, has worker deaths (a suspect is claimed
# alone, so a death is about one row) and the running sum of bytes stays in the budget.
CLAIMED_PREFIX = (
    "SELECT id FROM (SELECT id, row_number() OVER w AS n, bool_or(worker_deaths > 0) OVER w"
    " AS suspect, {running_bytes} AS bytes FROM due"
    " WINDOW w AS (ORDER BY turn, {order} ROWS UNBOUNDED PRECEDING)) AS w"
    " WHERE n = 1 OR (NOT suspect AND n <= %(limit)s AND bytes <= %(budget)s)"
)
# Fair claims (docs/queue.md, "Fair shares and limits"): a claim goes round groups (a
# delivery's handler, a raw event's source), the oldest due rows of each, up to the group's
# share, each group's in an index scan of its own, locked (SKIP LOCKED), numbered by `turn`
# within the group. {rows} yields them with their `fair_group`: GROUP_ROWS for groups from a
# CTE (name, share), or one branch per group (group_branches).
TURNS = (
    "due AS (SELECT d.*, row_number() OVER (PARTITION BY d.fair_group ORDER BY {order})"
    " AS turn FROM ({rows}) AS d)"
)
GROUP_ROWS = (
    "SELECT d.* FROM groups AS g CROSS JOIN LATERAL ({due} ORDER BY {inner_order}"
    " LIMIT g.share FOR UPDATE OF {alias} SKIP LOCKED) AS d"
)


def group_branches(
    due: str, *, names: Sequence[str], inner_order: str, alias: str, limit: int
) -> str:
    """TURNS with one CTE per group, its name a literal (`{name}` in `due`): the planner then
    reads each group's statistics, and takes each group's own index even where one group is
    most of a table (a lateral's parameter is planned as any value); `limit` a literal too.
    CTEs, since a UNION's branches may not lock."""
    branches = [
        f"g{n} AS ({due.replace('{name}', sql_literal(name).replace('%', '%%'))}"  # % doubled:
        f" ORDER BY {inner_order} LIMIT {int(limit)} FOR UPDATE OF {alias} SKIP LOCKED)"  # params
        for n, name in enumerate(names)
    ]
    if not branches:
        raise ValueError("a claim in turns needs one group at least")
    rows = " UNION ALL ".join(f"SELECT * FROM g{n}" for n in range(len(names)))  # noqa: S608
    return ", ".join([*branches, TURNS.replace("{rows}", rows)])


# The values of a column among a table's pending rows, by a skip scan of its pending index
# (one descent per value); {pending} is the table's pending condition over t.
PENDING_VALUES = (
    "names AS (SELECT min(t.{column}) AS name FROM {table} AS t WHERE {pending}"
    " UNION ALL SELECT (SELECT min(t.{column}) FROM {table} AS t WHERE {pending}"
    " AND t.{column} > names.name) FROM names WHERE names.name IS NOT NULL)"
)
# A model's groups: the values of its `fair_by` column among pending rows, each with its
# share (`shares`, else `limit`).
GROUPS_OF_COLUMN = (
    PENDING_VALUES.replace("{pending}", "t.status = 'pending'")  # noqa: S608 (constants)
    + ", groups AS (SELECT n.name, coalesce(s.share, %(limit)s) AS share FROM names AS n"
    " LEFT JOIN json_to_recordset(%(shares)s::json) AS s(name text, share integer)"
    " ON s.name = n.name WHERE n.name IS NOT NULL)"
)
ONE_GROUP = "groups AS (SELECT ''::text AS name, %(limit)s::integer AS share)"
MARK_CLAIMED = (
    "UPDATE {table} AS t SET status = 'processing', claimed_at = %(now)s,"
    " claimed_by = %(holder)s, attempts = t.attempts + 1{claim_also} FROM c WHERE t.id = c.id"
    " RETURNING {returning}"
)
# The queue's claim, one statement (as procrastinate's fetch): beat, the oldest due rows of
# each group in turns, locked (SKIP LOCKED: another worker's batch is theirs), the claimed
# prefix, marked.
CLAIM = (
    "WITH RECURSIVE beat AS (" + BEAT + "), {groups}, "  # noqa: S608 (constants)
    + TURNS.replace("{rows}", GROUP_ROWS.replace("{alias}", "t")).replace(
        "{due}",
        "SELECT t.id, t.next_attempt_at, t.worker_deaths, g.name AS fair_group FROM {table} AS t"
        " WHERE t.status = 'pending' AND t.next_attempt_at <= %(now)s{in_group}{eligible}",
    )
    + ", c AS (" + CLAIMED_PREFIX + ") " + MARK_CLAIMED
)
# Rows found and locked elsewhere (an ordering key's head), marked claimed.
CLAIM_IDS = "WITH beat AS (" + BEAT + "), c AS (SELECT unnest(%(ids)s::bigint[]) AS id) " + (
    MARK_CLAIMED
)
# A batch's claims as a row set: the fence of everything recorded for them.
# Its holder is part of the fence: two claims of one row at the same instant (the clocks of
# two processes) with the same attempts, one re-armed between them, still differ.
CLAIMS = (
    "json_to_recordset(%(claims)s::json)"
    " AS c(id bigint, attempts integer, claimed_at timestamptz, holder bigint)"
)
FENCE = (
    "t.id = c.id AND t.attempts = c.attempts AND t.claimed_at = c.claimed_at"
    " AND t.claimed_by = c.holder"
)
FENCED = FENCE + " AND t.status = 'processing'"
# The batch's rows still its claims, locked for the batch's whole run: another worker's
# re-claim is not among them, and rearm_orphaned skips them (SKIP LOCKED) however long the
# batch takes.
LOCK = (
    "SELECT t.id FROM {table} AS t JOIN " + CLAIMS  # noqa: S608 (constants)
    + " ON " + FENCED + " ORDER BY t.id FOR UPDATE OF t"
)
COMPLETE = (
    "UPDATE {table} AS t SET status = 'done', finished_at = %(now)s, claimed_by = NULL,"  # noqa: S608 (constants)
    " last_error = '',"
    " waiting_since = NULL, worker_deaths = 0{touch}{also} FROM " + CLAIMS + " WHERE " + FENCED
)
# Done, for a queue that keeps no finished rows (the inbox's claims: the raw event keeps the
# outcome): the row deleted, fenced.
FORGET = "DELETE FROM {table} AS t USING " + CLAIMS + " WHERE " + FENCED  # noqa: S608 (constants)
# Claims given back by the worker that made them, alive: due at once, the attempt given
# back, no death.
GIVE_BACK = (
    "UPDATE {table} AS t SET status = 'pending', claimed_at = NULL, claimed_by = NULL,"  # noqa: S608 (constants)
    " next_attempt_at = %(now)s, attempts = t.attempts - 1{touch} FROM " + CLAIMS
    + " WHERE " + FENCED
)
# Claims whose holder is gone, or older than the backstop, that no live batch holds
# (SKIP LOCKED): back to `pending`, the attempt given back. A death is counted unless the
# holder was another region's (a takeover, not the row); at `max_deaths` the row is dead.
REARM_ORPHANED = (
    "WITH o AS (SELECT t.id, t.claimed_at, coalesce((t.claimed_by >> {shift}) <> %(region)s,"  # noqa: S608 (constants)
    " false) AS taken_back FROM {table} AS t WHERE t.status = 'processing'"
    " AND (t.claimed_at < %(backstop)s OR t.claimed_by IS NULL AND %(without_holder)s"
    " OR t.claimed_by IS NOT NULL AND "
    + HOLDER_GONE.replace("{claim}", "t") + ")"
    " {only} FOR UPDATE OF t SKIP LOCKED),"
    " d AS (SELECT o.*, NOT o.taken_back AND t.worker_deaths + 1 >= %(max_deaths)s AS dies"
    " FROM o JOIN {table} AS t ON t.id = o.id)"
    " UPDATE {table} AS t SET"
    " status = CASE WHEN d.dies THEN 'dead' ELSE 'pending' END,"
    " finished_at = CASE WHEN d.dies THEN %(now)s END,"
    " last_error = CASE WHEN d.dies THEN format(%(error)s, t.worker_deaths + 1)"
    "  ELSE t.last_error END,"
    " claimed_at = NULL, claimed_by = NULL, next_attempt_at = %(now)s,"
    " attempts = GREATEST(t.attempts - 1, 0),"
    " worker_deaths = t.worker_deaths + CASE WHEN d.taken_back THEN 0 ELSE 1 END{touch}{on_rearm}"
    " FROM d WHERE t.id = d.id"
    " RETURNING t.id, t.status, t.attempts, t.worker_deaths, d.claimed_at, d.taken_back,"
    " t.last_error{extra}"
)


def statement(sql: str, table: str = "", **pieces: str) -> str:
    """A named statement with its identifiers and the model's pieces filled in."""
    quote = connection.ops.quote_name
    # The pieces first: they may hold the names below.
    for name, piece in {
        **pieces,
        "table": quote(table) if table else "",
        "holders": quote(ClaimHolder._meta.db_table),
        "shift": str(HOLDER_REGION_SHIFT),
    }.items():
        sql = sql.replace("{" + name + "}", piece)
    return sql


# --- claims and orphans ----------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A row this worker owns until it records an outcome, fenced on (claimed_at, attempts,
    holder).
    `row`: the columns the model asks a claim to return (WorkItem.claim_returns)."""

    id: int
    attempts: int  # charged since the row was armed, this one included
    claimed_at: datetime
    holder: int
    first_failed_at: datetime | None = None  # the horizon counts from it
    waiting_since: datetime | None = None  # its release backoff grows with this wait
    worker_deaths: int = 0
    row: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Orphan:
    """A claim rearm_orphaned took back."""

    id: int
    status: str  # pending, or dead after its last death
    attempts: int  # charged, the orphaned claim's given back
    worker_deaths: int
    claimed_at: datetime
    taken_back: bool  # its holder was another region's: not counted as a death
    last_error: str
    row: dict[str, Any] = field(default_factory=dict, compare=False)


def claims_json(claims: Iterable[Claim]) -> str:
    """The document CLAIMS reads. A batch's claims share one claimed_at, so its text form is
    made once (per row, it was most of the cost of building the document)."""
    stamps: dict[datetime, str] = {}
    return JSON_ENCODER.encode(
        [
            {
                "id": claim.id,
                "attempts": claim.attempts,
                "claimed_at": stamps.get(claim.claimed_at)
                or stamps.setdefault(claim.claimed_at, json_scalar(claim.claimed_at)),
                "holder": claim.holder,
            }
            for claim in claims
        ]
    )


_Row = TypeVar("_Row", bound="WorkItem")

BASE_RETURNS = (
    "id", "attempts", "first_failed_at", "waiting_since", "worker_deaths", "next_attempt_at"
)


class WorkQuerySet(models.QuerySet[_Row]):
    """The state machine of a WorkItem table. Every write is one statement, every outcome
    fenced on its claim."""

    def _sql(self, sql: str, **pieces: str) -> str:
        model = self.model
        touch = "".join(f", {column} = %(now)s" for column in model.touched_columns)
        return statement(sql, model._meta.db_table, touch=touch, **pieces)

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def due(self, now: datetime) -> WorkQuerySet[_Row]:
        return self.filter(status=PENDING, next_attempt_at__lte=now)

    def claim(
        self,
        *,
        limit: int,
        now: datetime,
        eligible: str = "",
        params: dict[str, Any] | None = None,
        holder: Holder | None = None,
        shares: dict[str, int] | None = None,
    ) -> list[Claim]:
        """Claim up to `limit` due rows in one statement (see CLAIM): oldest due first, and
        for a model with `fair_by` in turns across its groups. `eligible`: a further
        condition on the due rows (SQL over the table's columns); `shares`: a group's most
        rows in this claim, where less than `limit` (a handler's rate or concurrency)."""
        holder = holder or this_process()
        fair_by = self.model.fair_by
        sql = self._sql(
            CLAIM,
            groups=GROUPS_OF_COLUMN.replace("{column}", fair_by) if fair_by else ONE_GROUP,
            in_group=f" AND t.{fair_by} = g.name" if fair_by else "",
            order="next_attempt_at, id",
            inner_order="t.next_attempt_at, t.id",
            running_bytes="0",
            eligible=f" AND ({eligible})" if eligible else "",
            **self._claim_pieces(),
        )
        shares_json = json_rows(("name", "share"), sorted((shares or {}).items()))
        rows = self._execute(
            sql,
            {
                **holder.beat_params(now),
                "limit": limit,
                "budget": 0,
                "shares": shares_json,
                **(params or {}),
            },
        )
        holder.beaten_at = now
        # In the order they were due (RETURNING keeps none), as the claim chose them.
        rows.sort(key=lambda row: (row[5], row[0]))
        return [self._claim(row, now, holder) for row in rows]

    def claim_ids(
        self, ids: Sequence[int], *, now: datetime, holder: Holder | None = None
    ) -> list[Claim]:
        """Mark these rows (found and locked by the caller's transaction) claimed."""
        holder = holder or this_process()
        if not ids:
            return []
        rows = self._execute(
            self._sql(CLAIM_IDS, **self._claim_pieces()),
            {**holder.beat_params(now), "ids": list(ids)},
        )
        holder.beaten_at = now
        return [self._claim(row, now, holder) for row in rows]

    def _claim_pieces(self) -> dict[str, str]:
        model = self.model
        also = "".join(f", {column} = {value}" for column, value in model.claim_also.items())
        also += "".join(f", {column} = %(now)s" for column in model.touched_columns)
        returning = ", ".join(f"t.{column}" for column in (*BASE_RETURNS, *model.claim_returns))
        return {"claim_also": also, "returning": returning}

    def _claim(self, row: tuple, now: datetime, holder: Holder) -> Claim:
        id, attempts, first_failed_at, waiting_since, deaths, _due, *extra = row
        return self.model.claim_class(
            id=id,
            attempts=attempts,
            claimed_at=now,
            holder=holder.id,
            first_failed_at=first_failed_at,
            waiting_since=waiting_since,
            worker_deaths=deaths,
            row=dict(zip(self.model.claim_returns, extra, strict=True)),
        )

    def fenced(self, claim: Claim) -> WorkQuerySet[_Row]:
        """The row, only while it is still this claim: an outcome written through this — a
        success as much as a failure — cannot overwrite a newer claim."""
        return self.filter(
            pk=claim.id,
            status=PROCESSING,
            claimed_at=claim.claimed_at,
            claimed_by=claim.holder,
            attempts=claim.attempts,
        )

    def lock(self, claims: Sequence[Claim]) -> set[int]:
        """Lock the rows still these claims' own, for the caller's transaction (see LOCK)."""
        if not claims:
            return set()
        rows = self._execute(self._sql(LOCK), {"claims": claims_json(claims)})
        return {row[0] for row in rows}

    def complete(self, claims: Sequence[Claim], *, now: datetime, **also: Any) -> int:
        """Done, fenced. `also`: the model's own columns, set to these values. Returns how
        many were still their claims."""
        if not claims:
            return 0
        sets = "".join(f", {column} = %(also_{column})s" for column in also)
        params = {f"also_{column}": value for column, value in also.items()}
        with connection.cursor() as cursor:
            cursor.execute(
                self._sql(COMPLETE, also=sets),
                {"claims": claims_json(claims), "now": now, **params},
            )
            return cursor.rowcount

    def forget(self, claims: Sequence[Claim], *, fence: str = "") -> int:
        """Done, fenced, the rows deleted (see FORGET). `fence`: claims_json(claims), where
        the caller built it already. Returns how many were still their claims."""
        if not claims:
            return 0
        with connection.cursor() as cursor:
            cursor.execute(self._sql(FORGET), {"claims": fence or claims_json(claims)})
            return cursor.rowcount

    def record(
        self,
        claim: Claim,
        decision: RetryDecision,
        *,
        error: str,
        now: datetime,
        **also: Any,
    ) -> int:
        """A failed attempt's outcome as kernel/retry.py decided it, fenced: dead, a charged
        retry, or a release (the attempt given back). `also`: the model's own columns."""
        touched = {column: now for column in self.model.touched_columns}
        if decision.action == Action.GIVE_UP:
            changes: dict[str, Any] = {
                "status": DEAD,
                "finished_at": now,
                "claimed_by": None,
                "last_error": error,
                "waiting_since": None,
                "worker_deaths": 0,
            }
        elif decision.action == Action.RETRY:
            changes = {
                "status": PENDING,
                "next_attempt_at": decision.retry_at,
                "claimed_at": None,
                "claimed_by": None,
                "last_error": error,
                "first_failed_at": Coalesce("first_failed_at", Value(now)),
                "waiting_since": None,
                "worker_deaths": 0,
            }
        else:
            changes = {
                "status": PENDING,
                "next_attempt_at": decision.retry_at,
                "claimed_at": None,
                "claimed_by": None,
                "last_error": error,
                "attempts": F("attempts") - 1,
                "waiting_since": Coalesce("waiting_since", Value(now)),
                "worker_deaths": 0,
            }
        return self.fenced(claim).update(**changes, **touched, **also)

    def give_back(self, claims: Sequence[Claim], *, now: datetime) -> int:
        """Claims this worker cannot finish, given back (see GIVE_BACK). Returns how many
        were still their claims."""
        if not claims:
            return 0
        with connection.cursor() as cursor:
            cursor.execute(self._sql(GIVE_BACK), {"claims": claims_json(claims), "now": now})
            return cursor.rowcount

    def owe(self, claims: Sequence[Claim], holder: Holder | None = None) -> None:
        """Claims this process could not finish and could not give back yet (our database
        failed): given back by pay_owed, first thing on the next pass."""
        (holder or this_process()).owe(self.model._meta.label, claims)

    def pay_owed(self, *, now: datetime | None = None, holder: Holder | None = None) -> int:
        """Give back what this process owes (see owe). Raises while our database is
        unavailable: the claims stay owed."""
        return (holder or this_process()).pay(self.model._meta.label, self._give_back_at(now))

    def give_back_or_owe(self, claims: Sequence[Claim], holder: Holder | None = None) -> int:
        """Claims this worker cannot finish: given back now, or owed (see Holder)."""
        return (holder or this_process()).give_back_or_owe(
            self.model._meta.label, claims, self._give_back_at(None)
        )

    def _give_back_at(self, now: datetime | None) -> Callable[[list[Claim]], int]:
        return lambda owed: self.give_back(owed, now=now or timezone.now())

    def rearm_orphaned(
        self,
        *,
        now: datetime,
        backstop_seconds: float,
        max_deaths: int | None,
        error: str = "",
        ids: Sequence[int] | None = None,
    ) -> list[Orphan]:
        """Take back claims whose holder is gone (see REARM_ORPHANED), in one statement.
        `max_deaths` None: deaths are counted, never a death sentence. `ids`: only these
        rows — an operator's re-arm, which also takes a claim made before holders existed
        (no holder to ask); a claim whose holder lives is never taken."""
        model = self.model
        extra = "".join(f", t.{column}" for column in model.claim_returns)
        sql = self._sql(
            REARM_ORPHANED,
            extra=extra,
            only="AND t.id = ANY(%(ids)s)" if ids is not None else "",
            on_rearm="".join(f", {column} = {value}" for column, value in model.on_rearm.items()),
        )
        with transaction.atomic():
            rows = self._execute(
                sql,
                {
                    "now": now,
                    "backstop": now - timedelta(seconds=backstop_seconds),
                    "region": settings.EVENTDROP_REGION_NUMBER,
                    "alive_since": holder_alive_since(now),
                    "max_deaths": max_deaths if max_deaths is not None else 2**15,
                    "error": error or "%s",
                    "ids": list(ids) if ids is not None else [],
                    "without_holder": ids is not None,
                },
            )
        return [
            Orphan(
                id=id,
                status=status,
                attempts=attempts,
                worker_deaths=deaths,
                claimed_at=claimed_at,
                taken_back=taken_back,
                last_error=last_error,
                row=dict(zip(model.claim_returns, rest, strict=True)),
            )
            for id, status, attempts, deaths, claimed_at, taken_back, last_error, *rest in rows
        ]

    def holders_alive(self, *, now: datetime | None = None) -> set[int]:
        """Of these rows' claims, the holders that live (an operator's view)."""
        now = now or timezone.now()
        ids = set(self.filter(status=PROCESSING).values_list("claimed_by", flat=True))
        return set(
            ClaimHolder.objects.filter(id__in=ids - {None}, beat_at__gte=holder_alive_since(now))
            .exclude(id__in=[i for i in ids if i is not None and foreign(i)])
            .values_list("id", flat=True)
        )


class WorkItem(models.Model):
    """A row that is claimed and worked on (the columns of the one queue). A concrete model
    adds its `status` (pending, processing, done, dead and states of its own)."""

    # Charged attempts since the row was last armed: the backoff and the dead threshold.
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    # The holder (ClaimHolder.id) of the current claim; NULL once it ends.
    claimed_by = models.BigIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # The first charged failure since the row was armed (the horizon counts from it), and
    # since when it has waited on failures not its own (its release backoff grows with it).
    first_failed_at = models.DateTimeField(null=True, blank=True)
    waiting_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Claims of it in a row whose holder died before recording any outcome: claimed alone
    # while above 0; reset by every recorded outcome and by arming afresh. Not Positive…: its
    # CHECK would scan the table under an exclusive lock when added.
    worker_deaths = models.SmallIntegerField(default=0, db_default=0)

    # The column a claim goes round (fair claims: one group's backlog costs the others at most
    # a share of a batch); its pending index must lead with it. "" = one queue, oldest first.
    fair_by: ClassVar[str] = ""
    # What a claim also writes (column -> SQL over t) and returns (columns, into Claim.row).
    claim_also: ClassVar[dict[str, str]] = {}
    claim_returns: ClassVar[tuple[str, ...]] = ()
    # Columns stamped with now on every queue write (an updated_at), and what a re-arm of an
    # orphaned claim also writes (column -> SQL).
    touched_columns: ClassVar[tuple[str, ...]] = ()
    on_rearm: ClassVar[dict[str, str]] = {}
    # What claim() returns: Claim, or a subclass with the model's own properties over `row`.
    claim_class: ClassVar[type[Claim]] = Claim

    objects = WorkQuerySet.as_manager()

    class Meta:
        abstract = True

    @classmethod
    def queue_constraints(cls, prefix: str) -> list[models.BaseConstraint]:
        return [
            models.CheckConstraint(
                condition=~Q(status=PROCESSING) | Q(claimed_at__isnull=False),
                name=f"{prefix}_processing_has_claim",
            ),
        ]
