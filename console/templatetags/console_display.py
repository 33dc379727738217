"""What every console page shows the same way, for templates: a stored time to the second
in UTC with its age (`{{ value|when }}`), and a status as the console's badge
(`{{ status|badge }}`). The Python side is console.presentation and console/admin/display.py."""

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString

from console.admin.display import status_badge
from console.presentation import format_time

register = template.Library()


@register.filter
def when(value: datetime | None) -> str:
    return format_time(value, timezone.now())


@register.filter
def badge(status: str, label: str = "") -> SafeString:
    return SafeString(status_badge(status, label))
