"""What every console page shows the same way, for templates: a stored time to the second
in UTC with its age (`{{ value|when }}`), and a status as the console's badge
(`{{ status|badge }}`). The Python side is console.presentation and console/admin/base.py."""

from datetime import datetime

from django import template
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.utils import timezone
from django.utils.safestring import SafeString

from console.admin.base import status_badge
from console.presentation import format_time

register = template.Library()


@register.filter
def when(value: datetime | None) -> str:
    return format_time(value, timezone.now())


@register.filter
def badge(status: str, label: str = "") -> SafeString:
    return SafeString(status_badge(status, label))


@register.simple_tag
def console_pager(cl: ChangeList) -> dict:
    """A list's way to the page before and after (console.admin.base.UncountedPaginator)."""
    previous = cl.get_query_string({PAGE_VAR: cl.page_num - 1}) if cl.page_num > 1 else ""
    has_more = getattr(cl.paginator, "has_more", cl.page_num < cl.paginator.num_pages)
    following = cl.get_query_string({PAGE_VAR: cl.page_num + 1}) if has_more else ""
    return {"previous": previous, "next": following}
