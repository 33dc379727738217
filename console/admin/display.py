"""What every console admin page shows the same way: a status as a coloured word, a stored
time to the second with how long ago, and a row's last error cut to fit a list column."""

from collections.abc import Callable

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from console.presentation import format_time, shortened, status_tone


def tone_badge(tone: str, label: str) -> str:
    # The word says it; the colour repeats it (console/admin/console_styles.html).
    return format_html('<span class="console-badge console-tone-{}">{}</span>', tone, label)


def status_badge(status: str, label: str = "") -> str:
    return tone_badge(status_tone(status), label or status)


def time_field(field: str, description: str) -> Callable:
    """A ModelAdmin display of the time in `field` (console.presentation.format_time)."""

    @admin.display(description=description, ordering=field)
    def display(modeladmin, obj) -> str:
        return format_time(getattr(obj, field), timezone.now())

    return display


class LastErrorColumn:
    """The `short_error` list column of a model with a `last_error` text field."""

    @admin.display(description="last error")
    def short_error(self, obj) -> str:
        return shortened(obj.last_error)
