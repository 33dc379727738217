"""Project-wide system checks (time budgets live with the outbox; see outbox/checks.py)."""
