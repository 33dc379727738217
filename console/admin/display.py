"""What every console admin page shows the same way: a status as a coloured word, and a
row's last error cut to fit a list column."""

from django.contrib import admin
from django.utils.html import format_html

from console.presentation import shortened, status_tone


def tone_badge(tone: str, label: str) -> str:
    # The word says it; the colour repeats it (console/admin/console_styles.html).
    return format_html('<span class="console-badge console-tone-{}">{}</span>', tone, label)


def status_badge(status: str, label: str = "") -> str:
    return tone_badge(status_tone(status), label or status)


class LastErrorColumn:
    """The `short_error` list column of a model with a `last_error` text field."""

    @admin.display(description="last error")
    def short_error(self, obj) -> str:
        return shortened(obj.last_error)
