"""Every admin of the project, registered by the console, the app on top.

The console reads every app below it (ingress, outbox, recaps) and pushes work back through
its own services (console.services), which record who did what. So the ModelAdmins of those
apps live here, one module per feature, not in the apps: an app below imports nothing of the
console. Django's admin autodiscovery imports `console.admin`, which imports them.
"""

from django.contrib import admin

from console.audit import admin as audit
from console.deliveries import admin as deliveries
from console.presentation import EMPTY
from console.raw_events import admin as raw_events
from console.recaps import admin as recaps
from console.side_effects import admin as side_effects

# One empty marker on every page: the admin's own ("-") would differ from the console's.
admin.site.empty_value_display = EMPTY

__all__ = ["audit", "deliveries", "raw_events", "recaps", "side_effects"]
