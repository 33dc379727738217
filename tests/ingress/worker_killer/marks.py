"""The marks the worker-death tests put on events (no Django imports: the tests read them)."""

KILL_IN_HANDLER = "test.worker_killer.kill_in_handler"
ORDINARY = "test.worker_killer.ordinary"
# Handled once the advisory lock below is free (shared): a test holding it exclusively
# holds the worker inside a batch, for a restart or a SIGTERM to land in.
GATED = "test.worker_killer.gated"
GATE_LOCK = 2929
KILL_IN_SETTLE_MARK = b"kill-the-worker-while-settling"
