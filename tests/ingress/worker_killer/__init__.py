"""A Django app for the worker-death tests only (tests/ingress/test_inbox_worker_deaths.py):
installed by its own settings module (`settings.py` here) in the `process_inbox` processes
those tests start, never in the project's settings.

It kills the process that runs it, as a segfault, the out-of-memory killer or a C extension
gone wrong would, for marked events only:

- `handlers.py`: a handler that SIGKILLs its own worker (event type KILL_IN_HANDLER), and an
  ordinary one beside it (ORDINARY), whose deliveries must all end `done`;
- `apps.py`: the Stripe verifier wrapped so that a body carrying KILL_IN_SETTLE_MARK kills
  the worker while its raw event is being settled (verify, dedup, fan-out), before any
  handler runs.
"""
