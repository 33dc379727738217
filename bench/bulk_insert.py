"""Loading a benchmark's rows with the ORM, in statements PostgreSQL accepts.

A multi-row INSERT sends one parameter per row and column. With the statements bound on the
server (DATABASE_PREPARE_THRESHOLD, eventdrop/settings.py) every value is a parameter of the
wire protocol, which carries at most 65,535 per statement, and Django's bulk_create does not
split its batches for that on PostgreSQL: 5,000 raw events in one call were refused ("number
of parameters must be between 0 and 65535").
"""

from typing import TypeVar

from django.db import models

MAX_PARAMETERS = 65_535

M = TypeVar("M", bound=models.Model)


def bulk_insert(model: type[M], rows: list[M]) -> list[M]:
    """`model.objects.bulk_create(rows)` in batches of at most MAX_PARAMETERS values."""
    batch = MAX_PARAMETERS // len(model._meta.concrete_fields)
    return model._default_manager.bulk_create(rows, batch_size=batch)
