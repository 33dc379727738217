"""Reconciliation: compare what providers say they sent with what we hold, and repair it.

Webhooks are best effort; the seed's section 8 asks for nightly scans against the
providers' own lists, with the drift recorded and held to < 0.01 %. Two providers list
their side:

- Stripe's Events API (30 days): missing events are fetched and stored as `backfilled` raw
  events, which the inbox verifies by fetch instead of by signature (verdict.py) and then
  routes like any other (stripe.py).
- GitHub's hook deliveries API (3 days): GitHub is asked to redeliver what we lack, and the
  redelivery arrives signed through the normal ingress (github.py).

Each run is a ReconciliationRun row (runs.py, services.py); `manage.py reconcile_stripe` /
`reconcile_github` and the nightly django-q2 schedules (tasks.py) start them. Every call a
run makes has explicit timeouts and bounded retries, and the run stops within its time
budget (kernel/budgets.py: BudgetClock). See docs/reconciliation.md.

This module imports nothing: the inbox imports verdict.py, and the rest must not load with it.
"""
