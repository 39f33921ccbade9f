"""The HTML frame of the pages: the document, tables, pagers, number formats.

Everything is inline (CSS, SVG): the API server may have no network, and the pages render inside
the Airflow UI's iframe. Every link is relative, so the pages work wherever Airflow mounts the
app and under any ``[api] base_url`` sub-path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from html import escape
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse

from state_engine.formatting import human_bytes

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5rem; color: #1f2933; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
p.sub { color: #52606d; margin: 0 0 1rem; }
nav.top { margin: 0 0 1rem; display: flex; gap: 1rem; }
a { color: #0967d2; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .4rem .6rem; border-bottom: 1px solid #e4e7eb; }
th { background: #f5f7fa; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.path { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: 0; }
dl.facts dt { color: #52606d; } dl.facts dd { margin: 0; }
.none { color: #9aa5b1; }
.pager { margin: .5rem 0; display: flex; gap: 1rem; align-items: center; color: #52606d; }
.status { font-weight: 600; font-size: 12px; }
.status-COMPLETED, .status-SUCCEEDED { color: #0e7c3a; }
.status-FAILED { color: #cf1124; } .status-PENDING, .status-RUNNING { color: #b44d12; }
.error { border: 1px solid #e12d39; background: #ffe3e3; padding: .75rem 1rem; border-radius: 4px; }
.figure { font-size: 1.6rem; font-weight: 600; }
svg.chart { width: 100%; max-width: 900px; height: auto; display: block; }
svg.chart text { font: 11px system-ui, sans-serif; fill: currentColor; }
svg.chart .axis { stroke: #9aa5b1; stroke-width: 1; }
svg.chart .grid { stroke: #e4e7eb; stroke-width: 1; }
svg.chart .mean { stroke: #cf1124; stroke-dasharray: 4 3; stroke-width: 1.5; }
form.filter { display: flex; gap: .75rem; align-items: end; margin: 0 0 1rem; flex-wrap: wrap; }
form.filter label { display: flex; flex-direction: column; font-size: 12px; color: #52606d; }
td.error-text { color: #cf1124; max-width: 28rem; }
@media (prefers-color-scheme: dark) {
  body { background: #1a202c; color: #e2e8f0; }
  th { background: #2d3748; } th, td { border-color: #4a5568; }
  p.sub, dl.facts dt, .pager { color: #a0aec0; }
  a { color: #63b3ed; }
  .error { background: #63171b; }
  svg.chart .grid { stroke: #4a5568; }
}
"""


def document(title: str, body: str, *, root: str = "") -> str:
    """A whole page; ``root`` is the relative path from this page back to the app's root."""
    nav = (
        f'<nav class="top"><a href="{root or "./"}">Jobs</a>'
        f'<a href="{root}runs">Maintenance runs</a></nav>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{nav}{body}</body></html>"
    )


def page(title: str, body: str, *, root: str = "", status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(document(title, body, root=root), status_code=status_code)


def job_href(root: str, job: str) -> str:
    # safe="": a job name may hold "/" or "?"; the page route takes the whole rest of the path.
    return f"{root}jobs/{quote(job, safe='')}"


def snapshot_href(root: str, snapshot_id: int) -> str:
    return f"{root}snapshots/{snapshot_id}"


def link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


def status_badge(status: str) -> str:
    return f'<span class="status status-{escape(status)}">{escape(status.lower())}</span>'


def human_count(n: int | float) -> str:
    value = float(n)
    for unit in ("", "k", "M", "G"):
        if abs(value) < 1000 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_age(then: datetime, now: datetime) -> str:
    seconds = max(int((now - then).total_seconds()), 0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "running"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


def timestamp(value: datetime | None) -> str:
    if value is None:
        return '<span class="none">-</span>'
    return f'<time datetime="{value.isoformat()}">{value.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>'


def number(value: int | None, *, as_bytes: bool = False) -> str:
    if value is None:
        return '<td class="num none">-</td>'
    shown = human_bytes(value) if as_bytes else f"{value:,}"
    return f'<td class="num" title="{value}">{shown}</td>'


def table(headers: Iterable[tuple[str, bool]], rows: Iterable[str], *, empty: str) -> str:
    """``headers`` are (label, numeric); ``rows`` are ready ``<tr>`` strings."""
    rows = list(rows)
    if not rows:
        return f'<p class="none">{escape(empty)}</p>'
    head = "".join(
        f'<th class="num">{escape(label)}</th>' if numeric else f"<th>{escape(label)}</th>"
        for label, numeric in headers
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


@dataclass(frozen=True)
class Window:
    """Where a paginated table is: ``total`` items, this page from ``offset``, ``limit`` long."""

    total: int
    offset: int
    limit: int
    shown: int


def pager(window: Window, params: Mapping[str, str | int | None], *, noun: str) -> str:
    """'11-20 of 45 snapshots' with previous/next links that keep the other query parameters."""
    if window.total == 0:
        return ""
    kept = {k: v for k, v in params.items() if v not in (None, "")}

    def href(offset: int) -> str:
        query = urlencode({**kept, "offset": offset, "limit": window.limit})
        return f"?{escape(query)}"

    first = window.offset + 1 if window.shown else window.offset
    parts = [
        f"<span>{first}-{window.offset + window.shown} of {window.total} {escape(noun)}</span>"
    ]
    if window.offset > 0:
        parts.append(f'<a href="{href(max(window.offset - window.limit, 0))}">previous</a>')
    if window.offset + window.shown < window.total:
        parts.append(f'<a href="{href(window.offset + window.limit)}">next</a>')
    return f'<div class="pager">{"".join(parts)}</div>'
