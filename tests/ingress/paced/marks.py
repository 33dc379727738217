"""What the tests and the handlers share, importable without registering the handlers."""

PACED = "test.paced"
FRESH = "test.fresh"
RATE, CONCURRENCY = 20.0, 4
PACED_HANDLER = "tests.ingress.paced.handlers.call_the_paced_downstream"
