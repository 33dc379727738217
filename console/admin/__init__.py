"""Every admin of the project, registered by the console, the app on top.

The console reads every app below it (ingress, outbox, recaps) and pushes work back through
its own services (console.services), which record who did what. So the ModelAdmins of those
apps live here, not in the apps: an app below imports nothing of the console, and the
import graph between apps has no cycle through it.

Django's admin autodiscovery imports `console.admin`; importing the modules registers them.
"""

from django.contrib import admin

from console.admin import audit, ingress, outbox, recaps
from console.presentation import EMPTY

# One empty marker on every page: the admin's own ("-") would differ from the console's.
admin.site.empty_value_display = EMPTY

__all__ = ["audit", "ingress", "outbox", "recaps"]
