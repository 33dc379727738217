"""The kernel every app may use: errors, the retry decision, time budgets, the database
backend and its bounds, the worker loop, logging, schedules, process kinds, the JSON APIs'
error shape and doors. It imports no app and nothing of the project's wiring (eventdrop/);
the layers are in docs/architecture.md."""
