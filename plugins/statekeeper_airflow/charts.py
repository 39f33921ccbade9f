"""Hand-written SVG charts: state size over time (lines) and rows per key group (bars).

No JavaScript and no chart library: the pages must render offline and inside an iframe. Each
point and bar carries a ``<title>``, which browsers show as a tooltip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

WIDTH, HEIGHT = 900, 280
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 14, 44
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
COLORS = ("#0967d2", "#0e7c3a", "#b44d12", "#7a0ecc", "#cf1124", "#2d3a8c")
# A key-group axis can be 32768 wide; past this many bars each bar stands for a range of key
# groups and shows the range's busiest one, so a hot key group stays visible.
MAX_BARS = 256


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[datetime, float]]
    # points that are savepoints: drawn as squares, so a user-owned snapshot stands out
    savepoints: frozenset[datetime] = frozenset()
    # a summary line is drawn wide and translucent under the others: a line equal to it (one
    # operator holding all the state) still shows on top instead of hiding it
    halo: bool = False


def nice_ceiling(value: float, *, binary: bool = False) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= value (an axis top).

    ``binary``: in KiB, MiB, ... so that byte ticks read 250 KiB rather than 244.1 KiB.
    """
    if value <= 0:
        return 1.0
    if binary:
        unit = 1.0
        while value / unit >= 1000:
            unit *= 1024
        return nice_ceiling(value / unit) * unit
    magnitude = 10 ** (len(str(int(value))) - 1) if value >= 1 else 1.0
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    raise AssertionError("unreachable")


def _y_axis(top: float, label: Callable[[float], str], ticks: int = 4) -> str:
    parts = []
    for i in range(ticks + 1):
        value = top * i / ticks
        y = TOP + PLOT_H - PLOT_H * i / ticks
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label(value))}</text>'
        )
    return "".join(parts)


def _frame(element_id: str, title: str, inner: str) -> str:
    return (
        f'<svg id="{escape(element_id)}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>{inner}"
        f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + PLOT_H}"/>'
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{TOP + PLOT_H}" '
        f'y2="{TOP + PLOT_H}"/></svg>'
    )


def time_format(span_seconds: float) -> str:
    """How the time axis spells a tick over a span of ``span_seconds``: fine enough that ticks
    a fifth of the span apart read differently (seconds for snapshots minutes apart)."""
    if span_seconds >= 5 * 86_400:
        return "%m-%d"
    if span_seconds >= 5 * 60:
        return "%m-%d %H:%M"
    return "%H:%M:%S"


def line_chart(
    series: Sequence[Series],
    *,
    element_id: str,
    title: str,
    y_label: Callable[[float], str],
    binary: bool = False,
) -> str:
    """Lines over a time axis; a single point is drawn as a dot in the middle."""
    points = [p for s in series for p in s.points]
    if not points:
        return '<p class="none">No completed snapshot yet, so no size history.</p>'
    start = min(t for t, _ in points).timestamp()
    end = max(t for t, _ in points).timestamp()
    top = nice_ceiling(max(v for _, v in points), binary=binary)

    def x(t: datetime) -> float:
        if end == start:
            return LEFT + PLOT_W / 2
        return LEFT + PLOT_W * (t.timestamp() - start) / (end - start)

    def y(v: float) -> float:
        return TOP + PLOT_H - PLOT_H * v / top

    parts = [_y_axis(top, y_label)]
    ticks = 1 if end == start else 5
    spelling = time_format(end - start)
    shown: set[str] = set()
    for i in range(ticks):
        at = start + (end - start) * (i / (ticks - 1) if ticks > 1 else 0)
        when = datetime.fromtimestamp(at, tz=points[0][0].tzinfo)
        text = when.strftime(spelling)
        if text in shown:
            continue  # a span too short for five distinct labels: each label once
        shown.add(text)
        tx = LEFT + PLOT_W / 2 if end == start else LEFT + PLOT_W * i / (ticks - 1)
        anchor = "start" if i == 0 and ticks > 1 else "end" if i == ticks - 1 and ticks > 1 else ""
        anchor = anchor or "middle"
        parts.append(
            f'<text x="{tx:.1f}" y="{TOP + PLOT_H + 18}" text-anchor="{anchor}">{text}</text>'
        )
    for n, s in enumerate(series):
        color = COLORS[n % len(COLORS)]
        ordered = sorted(s.points, key=lambda p: p[0])
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in ordered)
        width = 'stroke-width="6" stroke-opacity="0.35"' if s.halo else 'stroke-width="2"'
        parts.append(
            f'<polyline class="series" fill="none" stroke="{color}" {width} '
            f'points="{coords}"><title>{escape(s.label)}</title></polyline>'
        )
        for t, v in ordered:
            tip = f"<title>{escape(s.label)}: {escape(y_label(v))} at {t.isoformat()}"
            if t in s.savepoints:
                parts.append(
                    f'<rect class="savepoint" x="{x(t) - 4:.1f}" y="{y(v) - 4:.1f}" width="8" '
                    f'height="8" fill="{color}">{tip} (savepoint)</title></rect>'
                )
            else:
                parts.append(
                    f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                    f"{tip}</title></circle>"
                )
    legend = [(COLORS[n % len(COLORS)], s.label[:22]) for n, s in enumerate(series)]
    if any(s.savepoints for s in series):
        legend.append(("currentColor", "■ savepoint  ● checkpoint"))
    if len(legend) > 1:
        step = (WIDTH - LEFT - RIGHT) / max(len(legend), 4)
        for n, (color, label) in enumerate(legend):
            lx = LEFT + 8 + step * n
            swatch = (
                ""
                if color == "currentColor"
                else f'<rect x="{lx:.1f}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>'
            )
            parts.append(
                f'{swatch}<text x="{lx + (0 if not swatch else 14):.1f}" y="{HEIGHT - 5}">'
                f"{escape(label)}</text>"
            )
    return _frame(element_id, title, "".join(parts))


def bins(rows: Sequence[int], max_bars: int = MAX_BARS) -> list[tuple[int, int, int]]:
    """(first key group, last key group, busiest key group's rows) per bar."""
    width = -(-len(rows) // max_bars) if rows else 1
    return [
        (start, min(start + width, len(rows)) - 1, max(rows[start : start + width]))
        for start in range(0, len(rows), width)
    ]


def histogram(
    rows: Sequence[int], *, mean: float, element_id: str, title: str, unit: str = "rows"
) -> str:
    """Rows (or another ``unit``) per key group, ``rows[k]`` for key group k; a dashed line
    marks the mean."""
    if not rows or max(rows) == 0:
        return '<p class="none">No key-group statistics recorded for this operator.</p>'
    bars = bins(rows)
    top = nice_ceiling(max(r for _, _, r in bars))
    slot = PLOT_W / len(bars)
    parts = [_y_axis(top, lambda v: f"{v:,.0f}")]
    for n, (first, last, value) in enumerate(bars):
        height = PLOT_H * value / top
        span = f"key group {first}" if first == last else f"key groups {first}-{last} (busiest)"
        parts.append(
            f'<rect class="bar" x="{LEFT + n * slot + slot * 0.1:.2f}" '
            f'y="{TOP + PLOT_H - height:.2f}" width="{max(slot * 0.8, 0.5):.2f}" '
            f'height="{height:.2f}" fill="{COLORS[0]}">'
            f"<title>{span}: {value:,} {unit}</title></rect>"
        )
    mean_y = TOP + PLOT_H - PLOT_H * mean / top
    parts.append(
        f'<line class="mean" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{mean_y:.1f}" y2="{mean_y:.1f}">'
        f"<title>mean {mean:,.1f} {unit} per key group</title></line>"
    )
    parts.append(
        f'<text x="{LEFT}" y="{TOP + PLOT_H + 18}">0</text>'
        f'<text x="{LEFT + PLOT_W}" y="{TOP + PLOT_H + 18}" text-anchor="end">'
        f"{len(rows) - 1}</text>"
        f'<text x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H + 34}" text-anchor="middle">key group'
        "</text>"
    )
    return _frame(element_id, title, "".join(parts))
