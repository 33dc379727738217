"""What every console admin page shows the same way: a status as a coloured word, a stored
time to the second in UTC with how long ago (one format, lists and pages alike), a long id or
text cut to fit a list column with the whole of it in the tooltip, and "—" for nothing."""

from collections.abc import Callable

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from console.presentation import EMPTY, format_time_parts, status_tone


def tone_badge(tone: str, label: str) -> str:
    # The word says it; the colour repeats it (console/admin/console_styles.html).
    return format_html('<span class="console-badge console-tone-{}">{}</span>', tone, label)


def status_badge(status: str, label: str = "") -> str:
    return tone_badge(status_tone(status), label or status)


def time_field(field: str, description: str) -> Callable:
    """A ModelAdmin display of the time in `field` (console.presentation.format_time)."""

    @admin.display(description=description, ordering=field)
    def display(modeladmin, obj) -> str:
        value = getattr(obj, field)
        if value is None:
            return EMPTY
        # The same words as format_time; a list stacks the age under the time (narrower).
        stamp, relative = format_time_parts(value, timezone.now())
        return format_html(
            '<span class="console-time">{}</span><span class="console-age"> · {}</span>',
            stamp,
            relative,
        )

    return display


def status_field(field: str, description: str) -> Callable:
    """A ModelAdmin display of the status in `field` as the console's badge."""

    @admin.display(description=description, ordering=field)
    def display(modeladmin, obj) -> str:
        value = getattr(obj, field)
        return status_badge(value) if value else EMPTY

    return display


# A list column shows this much; the tooltip and the row's page all of it.
LIST_TEXT_CHARS = 60
LIST_ID_CHARS = 8


def clipped(text: str, limit: int = LIST_TEXT_CHARS) -> str:
    """`text` cut to `limit` characters for a list column, whole in its tooltip."""
    if not text:
        return EMPTY
    if len(text) <= limit:
        return text
    return format_html('<span title="{}">{}…</span>', text, text[: limit - 1])


class LastErrorColumn:
    """The `short_error` list column of a model with a `last_error` text field."""

    @admin.display(description="last error")
    def short_error(self, obj) -> str:
        return clipped(obj.last_error)
