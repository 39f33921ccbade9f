"""The HTML frame of the pages: the document, tables, pagers, number formats.

Everything is inline (CSS, SVG): the API server may have no network, and the pages render inside
the Airflow UI's iframe. Every link is relative, so the pages work wherever Airflow mounts the
app and under any ``[api] base_url`` sub-path.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from html import escape
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse

from state_engine.formatting import human_bytes

# Airflow 3's own look: its font stack and its gray/brand palette (oklch, as its Chakra theme).
LIGHT = {
    "--fg": "oklch(0.18 0.03 251)",
    "--bg": "#fff",
    "--muted": "oklch(0.45 0.055 251)",
    "--faint": "oklch(0.63 0.042 252)",
    "--line": "oklch(0.915 0.01 253)",
    "--head": "oklch(0.985 0.004 253)",
    "--link": "oklch(0.469 0.084 257.657)",
    "--ok": "#0e7c3a",
    "--bad": "#cf1124",
    "--busy": "#b44d12",
    "--bad-bg": "#ffe3e3",
    "--est": "#8a6d00",
}
DARK = {
    "--fg": "oklch(0.955 0.006 253)",
    "--bg": "oklch(0.18 0.03 251)",
    "--muted": "oklch(0.75 0.025 252)",
    "--faint": "oklch(0.63 0.042 252)",
    "--line": "oklch(0.35 0.045 251)",
    "--head": "oklch(0.28 0.035 251)",
    "--link": "oklch(0.705 0.066 256.378)",
    "--ok": "#56d37f",
    "--bad": "#ff8a8a",
    "--busy": "#f0a060",
    "--bad-bg": "#63171b",
    "--est": "#e0c060",
}


def _vars(values: Mapping[str, str]) -> str:
    return " ".join(f"{k}: {v};" for k, v in values.items())


STYLE = (
    f":root {{ {_vars(LIGHT)} color-scheme: light; }}\n"
    # Airflow's own light/dark choice (the theme script sets the class) wins over the OS's
    f"html.dark {{ {_vars(DARK)} color-scheme: dark; }}\n"
    f"@media (prefers-color-scheme: dark) {{ html:not(.light) {{ {_vars(DARK)} "
    "color-scheme: dark; } }\n"
    """
body { font: 14px/1.45 Inter, -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial,
  sans-serif; margin: 1.5rem; color: var(--fg); background: var(--bg); }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; overflow-wrap: anywhere; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
p.sub { color: var(--muted); margin: 0 0 1rem; }
nav.top { margin: 0 0 1rem; display: flex; gap: 1rem; }
a { color: var(--link); text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .4rem .5rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { background: var(--head); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
td.path { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; }
td.wrap { overflow-wrap: anywhere; min-width: 6rem; }
td.flow { white-space: normal; } td.flow span { white-space: nowrap; }
th.num { white-space: normal; }
td small { color: var(--muted); }
time { white-space: nowrap; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.none { color: var(--faint); }
.pager { margin: .5rem 0; display: flex; gap: 1rem; align-items: center; color: var(--muted); }
.status { font-weight: 600; font-size: 12px; }
.status-COMPLETED, .status-SUCCEEDED { color: var(--ok); }
.status-FAILED { color: var(--bad); } .status-PENDING, .status-RUNNING { color: var(--busy); }
.error { border: 1px solid var(--bad); background: var(--bad-bg); padding: .75rem 1rem;
  border-radius: 4px; }
.figure { font-size: 1.6rem; font-weight: 600; }
.est { color: var(--est); font-weight: 600; cursor: help; }
.actions { display: flex; flex-wrap: wrap; gap: .5rem; margin: .75rem 0 0; }
.actions a { border: 1px solid var(--line); border-radius: 4px; padding: .3rem .7rem;
  background: var(--head); }
svg.chart { width: 100%; max-width: 900px; height: auto; display: block; }
svg.chart text { font: 11px Inter, system-ui, sans-serif; fill: currentColor; }
svg.chart .axis { stroke: var(--faint); stroke-width: 1; }
svg.chart .grid { stroke: var(--line); stroke-width: 1; }
svg.chart .mean { stroke: var(--bad); stroke-dasharray: 4 3; stroke-width: 1.5; }
form.filter { display: flex; gap: .75rem; align-items: end; margin: 0 0 1rem; flex-wrap: wrap; }
form.filter label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
td.error-text { color: var(--bad); min-width: 10rem; max-width: 22rem; overflow-wrap: anywhere; }
"""
)

# Follows the Airflow UI's light/dark setting: the parent page's <html> class (same origin, the
# iframe of the navigation entry), else the setting Airflow keeps in localStorage ("theme"), else
# the OS (the CSS media query). Run before the body renders, and again when the setting changes.
THEME_SCRIPT = (
    "(function(){var d=document.documentElement;function pick(){var m=null;"
    "try{var p=window.parent!==window&&window.parent.document.documentElement.classList;"
    "if(p&&p.contains('dark'))m='dark';else if(p&&p.contains('light'))m='light';}catch(e){}"
    "if(!m){try{var t=localStorage.getItem('theme');if(t==='dark'||t==='light')m=t;}"
    "catch(e){}}d.classList.remove('dark','light');if(m)d.classList.add(m);}"
    "pick();window.addEventListener('storage',pick);"
    "try{if(window.parent!==window)new MutationObserver(pick).observe("
    "window.parent.document.documentElement,{attributes:true});}catch(e){}})();"
)
THEME_SCRIPT_HASH = (
    "'sha256-" + base64.b64encode(hashlib.sha256(THEME_SCRIPT.encode()).digest()).decode() + "'"
)


def document(title: str, body: str, *, root: str = "") -> str:
    """A whole page; ``root`` is the relative path from this page back to the app's root."""
    nav = (
        f'<nav class="top"><a href="{root or "./"}">Jobs</a>'
        f'<a href="{root}runs">Maintenance runs</a></nav>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style>"
        f"<script>{THEME_SCRIPT}</script></head>"
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


def timestamp(value: datetime | None, *, short: bool = False) -> str:
    """A UTC time that never wraps; ``short`` drops the seconds (the tooltip keeps them)."""
    if value is None:
        return '<span class="none">-</span>'
    shown = value.strftime("%Y-%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")
    return f'<time datetime="{value.isoformat()}" title="{value.isoformat()}">{shown} UTC</time>'


def figure(value: int, *, as_bytes: bool = False) -> str:
    """A count with thousands separators, or a byte size (``1.3 MiB``): plain text."""
    return human_bytes(value) if as_bytes else f"{value:,}"


def number(value: int | None, *, as_bytes: bool = False) -> str:
    if value is None:
        return '<td class="num none">-</td>'
    return f'<td class="num" title="{value}">{escape(figure(value, as_bytes=as_bytes))}</td>'


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
