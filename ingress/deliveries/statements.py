"""The deliveries' own SQL, named (the one queue's statements are kernel/queue.py's).
{table} is the deliveries table, {attempt} their history's; kernel.queue.statement fills them.
"""

# Deliveries run at settle (create.py), inserted `done` with their attempts, one statement for
# both tables. Every column named: a test holds the list to the model.
SETTLE_RUN_INSERT = (
    "WITH r AS (SELECT * FROM json_to_recordset(%s::json) AS r(raw_event_id bigint,"
    " handler text, started_at timestamptz, finished_at timestamptz, note text,"
    " traceparent text)),"
    " d AS (INSERT INTO {table} (raw_event_id, handler, status, attempts, total_attempts,"
    "  next_attempt_at, claimed_at, claimed_by, last_error, first_failed_at, waiting_since,"
    "  created_at, finished_at, ordering_key, event_time, superseded_by_id, forced, worker_deaths,"
    "  traceparent)"
    "  SELECT r.raw_event_id, r.handler, %s, 1, 1, %s, %s, NULL, '', NULL, NULL, %s, %s, '',"
    "  NULL, NULL, false, 0, r.traceparent FROM r ON CONFLICT DO NOTHING"
    "  RETURNING id, raw_event_id, handler)"
    " INSERT INTO {attempt} (delivery_id, number, started_at, finished_at, outcome, error, note)"
    " SELECT d.id, 1, r.started_at, r.finished_at, %s, '', r.note FROM d"
    " JOIN r ON r.raw_event_id = d.raw_event_id AND r.handler = d.handler"
)

# A resumed pause's held deliveries back to `pending`, due one after another in the given
# order at `per_second` (holds.py).
RELEASE_HELD = (
    "UPDATE {table} AS d SET status = 'pending',"
    " next_attempt_at = %s + (r.n - 1) * (interval '1 second' / %s)"
    " FROM unnest(%s::bigint[]) WITH ORDINALITY AS r(id, n)"
    " WHERE d.id = r.id AND d.status = 'held'"
)

# --- ordered handlers (ordering.py) --------------------------------------------------------

# The heads of every key: one sorted read of all unfinished ordered deliveries. Its cost
# grows with the deliveries, however few keys they share.
KEY_HEADS = (
    "SELECT id FROM ("
    "  SELECT DISTINCT ON (handler, ordering_key) id, status, next_attempt_at"
    "  FROM {table} WHERE ordering_key <> '' AND status IN ('pending', 'processing', 'held')"
    "  ORDER BY handler, ordering_key, event_time, raw_event_id"
    ") AS heads WHERE status = 'pending' AND next_attempt_at <= %s "
    "ORDER BY next_attempt_at LIMIT %s"
)
# The same heads by a skip scan of the key index: one descent per key, so its cost grows with
# the keys, however many deliveries wait behind them. Walked up to a number of keys, past
# which the sorted read above is the cheaper one (bench/ordered_claim.py measures both).
KEY_HEADS_SKIP_SCAN = (
    "WITH RECURSIVE heads AS ("
    "  (SELECT 1 AS n, handler, ordering_key, id, status, next_attempt_at FROM {table}"
    "   WHERE ordering_key <> '' AND status IN ('pending', 'processing', 'held')"
    "   ORDER BY handler, ordering_key, event_time, raw_event_id LIMIT 1)"
    "  UNION ALL"
    "  SELECT h.n + 1, nxt.* FROM heads AS h CROSS JOIN LATERAL ("
    "   SELECT handler, ordering_key, id, status, next_attempt_at FROM {table} AS d"
    "   WHERE d.ordering_key <> '' AND d.status IN ('pending', 'processing', 'held')"
    "   AND (d.handler, d.ordering_key) > (h.handler, h.ordering_key)"
    "   ORDER BY d.handler, d.ordering_key, d.event_time, d.raw_event_id LIMIT 1"
    "  ) AS nxt WHERE h.n <= %s"
    ") SELECT id, status = 'pending' AND next_attempt_at <= %s, next_attempt_at, n FROM heads"
)
# The keys' transaction-level advisory locks, tried (the SKIP LOCKED of keys).
KEY_LOCKS = (
    "SELECT k.n, pg_try_advisory_xact_lock(%s, hashtext(k.handler || ' ' || k.key)) "
    "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS k(handler, key, n) ORDER BY k.n"
)
# Fresh, after the locks: per key, whether a delivery is running, which pending one is the
# head now, and the newest handled one. Three index probes per key (`ordering_key <> ''` lets
# the planner use the partial indexes), never a scan of the key's history. A held delivery is
# a head too: its key waits for its pause to end, so a pause never reorders a key.
_KEY_PROBE = (
    "SELECT k.handler, k.key, r.status, r.id, r.event_time, r.raw_event_id FROM k"
    " CROSS JOIN LATERAL (SELECT status, id, event_time, raw_event_id FROM {table} AS d"
    "  WHERE d.handler = k.handler AND d.ordering_key = k.key AND d.ordering_key <> ''"
    "  AND d.status IN (%(status)s) ORDER BY d.event_time %(order)s, d.raw_event_id %(order)s"
    "  LIMIT 1) AS r"
)
KEY_STATE = "WITH k AS (SELECT * FROM unnest(%s::text[], %s::text[]) AS k(handler, key)) " + (  # noqa: S608 (constants)
    " UNION ALL ".join(
        _KEY_PROBE.replace("%(status)s", status).replace("%(order)s", order)
        for status, order in (
            ("'processing'", "ASC"),
            ("'pending', 'held'", "ASC"),
            ("'done'", "DESC"),
        )
    )
)
