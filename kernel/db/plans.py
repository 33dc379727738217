"""Pages plan each statement with its values.

psycopg prepares a statement on its 5th execution (DATABASE_PREPARE_THRESHOLD), and
PostgreSQL may then run it on a generic plan, planned without the values. A generic plan
cannot use a partial index whose predicate names a value the statement takes as a parameter
(`status = $1` proves nothing about `WHERE status = 'dead'`), and every console list and
figure rests on such indexes: measured, a list of pending raw events on 25 million rows went
from milliseconds to a scan of the store at its 6th request. So the processes that serve
pages set plan_cache_mode to force_custom_plan on each new connection: parsing is still
saved, planning is not. The inbox, dispatcher and worker keep their generic plans.
"""

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created


def plan_with_values(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    if connection.vendor != "postgresql" or connection.settings_dict["OPTIONS"].get("pooler"):
        return  # behind the pooler nothing is prepared, and session settings would leak
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")


def serve_pages() -> None:
    """For the processes that serve the console, the admin and the APIs."""
    connection_created.connect(plan_with_values, dispatch_uid="kernel.db.plans")
