"""Small charts for the ops page, drawn on the server as inline SVG.

No JavaScript and no chart library: a page that on-call leaves open on a screen, behind a
strict CSP, must not depend on a CDN. Every value reaches the markup through format_html
(escaped), every chart carries a <title> and an aria-label, every bar and point its value as
a tooltip, and the legend writes each series' name — so nothing is said by colour alone.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH = 440  # two side by side in the admin frame at 1,366 px (with its nav sidebar)
HEIGHT = 180
LEFT = 56  # room for the y axis labels
RIGHT = 8
TOP = 10
BOTTOM = 24  # room for the hour labels

# Distinguishable for the common colour-vision deficiencies (Okabe-Ito), in series order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
RED_LINE = "#c62828"


@dataclass(frozen=True)
class Chart:
    key: str  # the DOM id suffix: chart-<key>
    title: str
    svg: SafeString
    legend: list[tuple[str, str]]  # (series name, colour)
    note: str = ""


def _px(value: float) -> str:
    # format_html escapes its arguments into strings first: numbers are formatted here.
    return f"{value:.1f}"


def _nice_ceiling(value: float) -> float:
    """The next 1, 2 or 5 times 10^n at or above `value` (an axis top people can read)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return float(step * magnitude)
    return float(10 * magnitude)


def _frame(
    key: str, title: str, top: float, hours: Sequence[datetime], fmt: Callable[[float], str]
) -> tuple[list[str], Callable[[float], float], Callable[[int], float], float]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(hours)

    def y(value: float) -> float:
        return TOP + plot_h - plot_h * min(value, top) / top

    def x(index: int) -> float:
        return LEFT + slot * index

    parts: list[str] = [
        format_html(
            '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" width="{}" height="{}" '
            'role="img" aria-label="{}" class="ops-chart-svg" id="chart-{}"><title>{}</title>',
            WIDTH,
            HEIGHT,
            WIDTH,
            HEIGHT,
            title,
            key,
            title,
        )
    ]
    for fraction in (0, 0.5, 1):
        level = top * fraction
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#ccc" stroke-width="1"/>'
                '<text x="{}" y="{}" font-size="10" text-anchor="end" fill="#555">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                _px(y(level)),
                _px(y(level)),
                LEFT - 4,
                _px(y(level) + 3),
                fmt(level),
            )
        )
    for index, hour in enumerate(hours):
        if index % 4 == 0 or index == len(hours) - 1:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" font-size="10" text-anchor="middle" fill="#555">{}</text>',
                    _px(x(index) + slot / 2),
                    HEIGHT - 8,
                    hour.strftime("%H:00"),
                )
            )
    return parts, y, x, slot


def _close(parts: list[str]) -> SafeString:
    parts.append("</svg>")
    # Every part above was built by format_html (escaped); joined, it stays safe.
    return mark_safe("".join(parts))  # noqa: S308


def stacked_bars(
    *,
    key: str,
    title: str,
    hours: Sequence[datetime],
    series: Mapping[str, Sequence[float | None]],
    fmt: Callable[[float], str] = lambda v: f"{v:g}",
    note: str = "",
) -> Chart:
    """One bar per hour, its series stacked bottom-up in the legend's order."""
    totals = [sum(values[i] or 0 for values in series.values()) for i in range(len(hours))]
    top = _nice_ceiling(max(totals, default=0))
    parts, y, x, slot = _frame(key, title, top, hours, fmt)
    legend = []
    base = [0.0] * len(hours)
    for n, (name, values) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        legend.append((name, colour))
        for i, value in enumerate(values):
            if not value:
                continue
            y_top, y_bottom = y(base[i] + value), y(base[i])
            parts.append(
                format_html(
                    '<rect class="ops-bar" x="{}" y="{}" width="{}" height="{}" '
                    'fill="{}"><title>{} {}: {}</title></rect>',
                    _px(x(i) + 1),
                    _px(y_top),
                    _px(max(slot - 2, 1)),
                    _px(max(y_bottom - y_top, 0.5)),
                    colour,
                    hours[i].strftime("%H:00"),
                    name,
                    fmt(value),
                )
            )
            base[i] += value
    return Chart(key=key, title=title, svg=_close(parts), legend=legend, note=note)


def lines(
    *,
    key: str,
    title: str,
    hours: Sequence[datetime],
    series: Mapping[str, Sequence[float | None]],
    fmt: Callable[[float], str],
    red_lines: dict[str, float] | None = None,
    note: str = "",
) -> Chart:
    """One line per series, a gap where an hour has no data; dashed red lines at the SLOs."""
    red_lines = red_lines or {}
    values = [v for values in series.values() for v in values if v is not None]
    top = _nice_ceiling(max([*values, *red_lines.values()], default=0) * 1.05)
    parts, y, x, slot = _frame(key, title, top, hours, fmt)
    for label, level in red_lines.items():
        parts.append(
            format_html(
                '<line class="ops-red-line" x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" '
                'stroke-dasharray="4 3"><title>{}</title></line>',
                LEFT,
                WIDTH - RIGHT,
                _px(y(level)),
                _px(y(level)),
                RED_LINE,
                label,
            )
        )
    legend = []
    for n, (name, points) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        legend.append((name, colour))
        runs: list[list[tuple[float, float]]] = [[]]
        for i, value in enumerate(points):
            if value is None:
                runs.append([])
                continue
            runs[-1].append((x(i) + slot / 2, y(value)))
            parts.append(
                format_html(
                    '<circle class="ops-point" cx="{}" cy="{}" r="2.5" fill="{}">'
                    "<title>{} {}: {}</title></circle>",
                    _px(x(i) + slot / 2),
                    _px(y(value)),
                    colour,
                    hours[i].strftime("%H:00"),
                    name,
                    fmt(value),
                )
            )
        for run in runs:
            if len(run) > 1:
                points_attr = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                parts.append(
                    format_html(
                        '<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>',
                        points_attr,
                        colour,
                    )
                )
    return Chart(key=key, title=title, svg=_close(parts), legend=legend, note=note)


def legend_html(chart: Chart) -> SafeString:
    return format_html_join(
        " ",
        '<span class="ops-legend-item"><span class="ops-swatch" style="background:{}"></span>'
        "{}</span>",
        ((colour, name) for name, colour in chart.legend),
    )
