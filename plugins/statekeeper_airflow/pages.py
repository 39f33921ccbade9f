"""Server-rendered pages: the jobs, a job, a snapshot, the maintenance history.

Plain HTML with inline CSS and SVG (see ``markup`` and ``charts``), rendered inside the Airflow
UI's iframe (the "Statekeeper" navigation entry) or opened directly. Tables are paged in the
database; ``offset`` and ``limit`` are query parameters, as in the API.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from state_engine.catalog import (
    JobRecord,
    Page,
    RunRecord,
    SizePoint,
    SnapshotFileRecord,
    SnapshotRecord,
)
from state_engine.formatting import ESTIMATE_NOTE, estimate_text, is_estimated
from state_engine.snapshot_enums import SnapshotKind, SnapshotStatus
from statekeeper_airflow.actions import (
    dag_href,
    dag_run_href,
    job_actions,
    task_log_href,
)
from statekeeper_airflow.api import MAX_LIMIT, CatalogDep, Offset, SnapshotId
from statekeeper_airflow.auth import page_user
from statekeeper_airflow.charts import Series, histogram, line_chart
from statekeeper_airflow.markup import (
    THEME_SCRIPT_HASH,
    Window,
    figure,
    human_age,
    human_bytes,
    human_duration,
    job_href,
    link,
    number,
    page,
    pager,
    snapshot_href,
    status_badge,
    table,
    timestamp,
)

router = APIRouter(dependencies=[Depends(page_user)], include_in_schema=False)

PAGE_LIMIT = 25
__all__ = ["THEME_SCRIPT_HASH", "error_page", "router"]
# The chart shows this many of the newest completed snapshots: enough for a trend, and the SVG
# stays small however long the job has run.
CHART_SNAPSHOTS = 200
PageLimit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="rows per page")]


def error_page(status_code: int, message: str, *, root: str = "") -> HTMLResponse:
    """The page for a catalog error; ``root`` leads from the failed URL back to the app."""
    heading = "not found" if status_code == 404 else "error"
    body = (
        f"<h1>Statekeeper: {heading}</h1>"
        f'<div class="error">{escape(message)}</div>'
        f'<p class="sub">See {link(root or "./", "all jobs")} or '
        f"{link(f'{root}runs', 'the maintenance runs')}.</p>"
    )
    return page(f"Statekeeper: {heading}", body, root=root, status_code=status_code)


def actions_bar(job: str, root: str, snapshot_id: int | None = None) -> str:
    """Buttons into Airflow's trigger forms for this job (Airflow checks the permissions)."""
    links = "".join(
        f'<a href="{escape(dag_href(root, a.dag_id, a.conf))}" target="_top" '
        f'title="{escape(a.dag_id)}: {escape(a.hint)}">{escape(a.label)}</a>'
        for a in job_actions(job, snapshot_id)
    )
    conf = {"job": job, **({} if snapshot_id is None else {"source_snapshot": snapshot_id})}
    return (
        f'<div class="actions">{links}</div>'
        '<p class="sub">Each opens the DAG in Airflow: press <b>Trigger</b>; the form suggests '
        f"the catalog's jobs. As configuration JSON: <code>{escape(json.dumps(conf))}</code></p>"
    )


def window(result: Page[Any], limit: int) -> Window:
    return Window(result.total, result.offset, limit, len(result.items))


# --- jobs ---


def jobs_rows(jobs: list[JobRecord], latest: dict[str, SnapshotRecord], now: datetime) -> list[str]:
    rows = []
    for job in jobs:
        snap = latest.get(job.name)
        if snap is None or snap.completed_at is None:
            last = '<td colspan="5" class="none">no completed snapshot</td>'
        else:
            last = (
                f'<td class="num">{link(snapshot_href("", snap.id), str(snap.checkpoint_id))}</td>'
                f"<td>{escape(snap.kind.lower())}</td>"
                f'<td class="num">{snap.parallelism}</td>'
                f'<td class="num">{escape(human_bytes(snap.bytes))}</td>'
                f'<td title="{escape(snap.completed_at.isoformat())}">'
                f"{escape(human_age(snap.completed_at, now))}</td>"
            )
        rows.append(
            f'<tr><td class="job">{link(job_href("", job.name), job.name)}</td>'
            f"<td class='num'>{job.max_parallelism}</td>{last}</tr>"
        )
    return rows


@router.get("/", response_class=HTMLResponse)
def jobs_overview(
    catalog: CatalogDep, limit: PageLimit = PAGE_LIMIT, offset: Offset = 0
) -> HTMLResponse:
    jobs = catalog.jobs_page(limit=limit, offset=offset)
    latest = {snap.job: snap for snap in catalog.latest_snapshots()}
    count = f"{jobs.total} job{'s' if jobs.total != 1 else ''}"
    headers = [
        ("Job", False),
        ("Max parallelism", True),
        ("Latest checkpoint", True),
        ("Kind", False),
        ("Parallelism", True),
        ("State size", True),
        ("Completed", False),
    ]
    body = (
        "<h1>Statekeeper: jobs</h1>"
        f'<p class="sub">{count} in the catalog; the latest completed snapshot of each.</p>'
        + table(
            headers,
            jobs_rows(jobs.items, latest, datetime.now(UTC)),
            empty="No jobs in the catalog yet. A job appears here when it registers with the "
            "catalog (its first checkpoint does that).",
        )
        + pager(window(jobs, limit), {}, noun="jobs")
    )
    return page("Statekeeper: jobs", body)


# --- a job ---


def size_series(points: list[SizePoint], formats: Mapping[int, str] | None = None) -> list[Series]:
    """The job's total state size per snapshot, one line per snapshot format (a canonical
    savepoint among native checkpoints is another line, not a dip), and one line per operator
    (of the newest format) when there are several; savepoints are marked."""
    formats = formats or {}
    totals: dict[int, tuple[datetime, float]] = {}
    kinds: dict[int, str] = {}
    per_operator: dict[str, dict[int, tuple[datetime, float]]] = defaultdict(dict)
    for p in points:
        if p.completed_at is None:
            continue
        at, total = totals.get(p.snapshot_id, (p.completed_at, 0.0))
        totals[p.snapshot_id] = (at, total + p.bytes)
        kinds[p.snapshot_id] = p.kind
        if p.operator is not None:
            per_operator[p.operator][p.snapshot_id] = (p.completed_at, float(p.bytes))
    by_format: dict[str, list[int]] = defaultdict(list)
    for sid in totals:
        by_format[formats.get(sid, "")].append(sid)
    newest = max(totals, key=lambda sid: totals[sid][0], default=None)
    main = formats.get(newest, "") if newest is not None else ""
    series = []
    for fmt in sorted(by_format, key=lambda f: (f != main, f)):
        ids = by_format[fmt]
        label = "total" if len(by_format) == 1 or not fmt else f"total, {fmt.lower()}"
        series.append(
            Series(
                label,
                sorted(totals[sid] for sid in ids),
                savepoints=frozenset(
                    totals[sid][0] for sid in ids if kinds[sid] == SnapshotKind.SAVEPOINT
                ),
                halo=True,
            )
        )
    if 1 < len(per_operator) <= 5:
        for op, by_id in sorted(per_operator.items()):
            pts = [pt for sid, pt in by_id.items() if formats.get(sid, "") == main]
            series.append(Series(op, sorted(pts)))
    return series or [Series("total", [])]


def estimate_mark() -> str:
    return f'<abbr class="est" title="{escape(ESTIMATE_NOTE)}">~ estimated</abbr>'


def entries_cell(s: SnapshotRecord) -> str:
    if not is_estimated(s.format):
        return number(s.entries)
    return (
        f'<td class="num" title="{s.entries} ({escape(ESTIMATE_NOTE)})">'
        f'<span class="est">{escape(estimate_text(s.entries, s.format))}</span></td>'
    )


def estimate_legend(snapshots: list[SnapshotRecord]) -> str:
    if not any(is_estimated(s.format) for s in snapshots):
        return ""
    return (
        f'<p class="sub"><span class="est">~</span> Entries of native (RocksDB) snapshots are '
        f"{escape(ESTIMATE_NOTE)}; a canonical savepoint of one counts its rows exactly.</p>"
    )


def snapshot_rows(snapshots: list[SnapshotRecord], root: str) -> list[str]:
    return [
        "<tr>"
        f'<td class="num">{link(snapshot_href(root, s.id), str(s.id))}</td>'
        f'<td class="num">{s.checkpoint_id}</td>'
        f"<td>{escape(s.kind.lower())}</td><td>{escape(s.format.lower())}</td>"
        f"<td>{status_badge(s.status)}</td>"
        f'<td class="num">{s.parallelism}</td>'
        f"{number(s.bytes, as_bytes=True)}{entries_cell(s)}"
        f"<td>{timestamp(s.completed_at)}</td>"
        "</tr>"
        for s in snapshots
    ]


def restore_section(catalog: CatalogDep, job: JobRecord) -> str:
    """A Flink job's newest savepoint written by a rewrite run: how to restore it."""
    if job.origin != "flink":
        return ""
    for run in catalog.list_runs(job=job.name, status="SUCCEEDED", limit=20):
        stats = (run.stats or {}).get("stats") or {}
        restore = stats.get("restore")
        if not isinstance(restore, dict) or not run.output_snapshot_id:
            continue
        warnings = "".join(f"<li>{escape(str(w))}</li>" for w in restore.get("warnings") or ())
        return (
            "<h2>Restore the rewritten savepoint</h2>"
            f'<p class="sub">Snapshot {run.output_snapshot_id}, written by {escape(run.kind)} '
            f"run {escape(run.run_id)} into {escape(str(stats.get('output_location')))}.</p>"
            f"<pre>{escape(str(restore.get('command')))}</pre>"
            f"<p>or in the job's configuration:</p><pre>{escape(str(restore.get('config')))}</pre>"
            + (f"<ul>{warnings}</ul>" if warnings else "")
        )
    return ""


@router.get("/jobs/{job:path}", response_class=HTMLResponse)
def job_page(
    job: str, catalog: CatalogDep, limit: PageLimit = PAGE_LIMIT, offset: Offset = 0
) -> HTMLResponse:
    root = "../"
    record = catalog.get_job(job)
    snapshots = catalog.snapshots_page(job, limit=limit, offset=offset)
    history = catalog.state_size_history(job, limit=CHART_SNAPSHOTS)
    formats = {
        s.id: s.format
        for s in catalog.list_snapshots(
            job, status=SnapshotStatus.COMPLETED, limit=2 * CHART_SNAPSHOTS
        )
    }
    series = size_series(history, formats)
    shown = len({p.snapshot_id for p in history if p.completed_at is not None})
    chart = line_chart(
        series,
        element_id="size-chart",
        title=f"State size of {job} over time",
        y_label=human_bytes,
        binary=True,
    )
    runs_href = f"{root}runs?{urlencode({'job': record.name})}"
    facts = (
        '<dl class="facts">'
        f"<dt>Max parallelism</dt><dd>{record.max_parallelism}</dd>"
        f"<dt>Location</dt><dd>{escape(record.location or '-')}</dd>"
        f"<dt>Registered</dt><dd>{timestamp(record.created_at)}</dd>"
        f"<dt>Maintenance</dt><dd>{link(runs_href, 'runs of this job')}</dd>"
        "</dl>" + actions_bar(record.name, root)
    )
    headers = [
        ("Snapshot", True),
        ("Checkpoint", True),
        ("Kind", False),
        ("Format", False),
        ("Status", False),
        ("Parallelism", True),
        ("Bytes", True),
        ("Entries", True),
        ("Completed at", False),
    ]
    body = (
        f"<h1>Job {escape(record.name)}</h1>{facts}{restore_section(catalog, record)}"
        f"<h2>State size over time</h2>"
        f'<p class="sub">All files each completed snapshot references, the newest {shown} '
        f"snapshot{'s' if shown != 1 else ''}.</p>{chart}"
        "<h2>Snapshots</h2>"
        + table(headers, snapshot_rows(snapshots.items, root), empty="No snapshots on this page.")
        + estimate_legend(snapshots.items)
        + pager(window(snapshots, limit), {}, noun="snapshots")
    )
    return page(f"Statekeeper: job {record.name}", body, root=root)


# --- a snapshot ---


def file_rows(files: list[SnapshotFileRecord]) -> list[str]:
    rows = []
    for f in files:
        kg = (
            "-"
            if f.key_group_start is None
            else f"{f.key_group_start}-{f.key_group_end}"
            if f.key_group_end != f.key_group_start
            else str(f.key_group_start)
        )
        rows.append(
            f'<tr><td class="path">{escape(f.path)}</td>{number(f.size, as_bytes=True)}'
            f"<td>{'shared' if f.shared else 'exclusive'}</td>"
            f"<td>{escape(f.operator or '-')}</td>"
            f'<td class="num">{"-" if f.subtask is None else f.subtask}</td>'
            f'<td class="num">{kg}</td></tr>'
        )
    return rows


def skew_section(catalog: CatalogDep, snapshot: SnapshotRecord) -> str:
    skews = catalog.key_group_skew(snapshot.id)
    if not skews:
        return '<p class="none">No key-group statistics were recorded for this snapshot.</p>'
    rows_by_operator: dict[str, list[int]] = defaultdict(lambda: [0] * snapshot.max_parallelism)
    for stat in catalog.key_group_stats(snapshot.id):
        if 0 <= stat.key_group < snapshot.max_parallelism:
            rows_by_operator[stat.operator][stat.key_group] = stat.rows
    parts = []
    for n, skew in enumerate(skews):
        figure = "-" if skew.skew is None else f"{skew.skew:.2f}"
        estimated = is_estimated(snapshot.format)
        if estimated and skew.skew is not None:
            figure = f"~{figure}"
        parts.append(
            f"<h3>Operator {escape(skew.operator)}</h3>"
            + (
                f"<p>{estimate_mark()}: rows per key group below are estimates.</p>"
                if estimated
                else ""
            )
            + f'<p>Skew (max / mean rows per key group): <span class="figure skew">{figure}</span>'
            f" &middot; max {skew.max_rows:,} rows, mean {skew.mean_rows:,.1f} over "
            f"{skew.key_groups:,} key groups ({skew.recorded_key_groups:,} recorded), "
            f"{skew.total_rows:,} rows in all</p>"
            + histogram(
                rows_by_operator[skew.operator],
                mean=skew.mean_rows,
                element_id=f"skew-chart-{n}",
                title=f"Rows per key group of {skew.operator}",
            )
        )
    return "".join(parts)


@router.get("/snapshots/{snapshot_id}", response_class=HTMLResponse)
def snapshot_page(
    snapshot_id: SnapshotId, catalog: CatalogDep, limit: PageLimit = PAGE_LIMIT, offset: Offset = 0
) -> HTMLResponse:
    root = "../"
    snap = catalog.get_snapshot(snapshot_id)
    summary = catalog.snapshot_files_summary(snapshot_id)
    files = catalog.snapshot_files_page(snapshot_id, limit=limit, offset=offset)
    parent = (
        "-"
        if snap.parent_id is None
        else link(snapshot_href(root, snap.parent_id), str(snap.parent_id))
    )
    facts = (
        '<dl class="facts">'
        f"<dt>Job</dt><dd>{link(job_href(root, snap.job), snap.job)}</dd>"
        f"<dt>Checkpoint</dt><dd>{snap.checkpoint_id}</dd>"
        f"<dt>Kind, format</dt><dd>{escape(snap.kind.lower())}, {escape(snap.format.lower())}</dd>"
        f"<dt>Status</dt><dd>{status_badge(snap.status)}</dd>"
        f"<dt>Parallelism</dt><dd>{snap.parallelism} of max {snap.max_parallelism}</dd>"
        f"<dt>Parent</dt><dd>{parent}</dd>"
        f"<dt>Location</dt><dd>{escape(snap.location)}</dd>"
        f"<dt>Size</dt><dd>{escape(human_bytes(snap.bytes))}, "
        f"{escape(estimate_text(snap.entries, snap.format))} entries"
        f"{' ' + estimate_mark() if is_estimated(snap.format) else ''}</dd>"
        f"<dt>Files</dt><dd>{summary.files:,} files of {escape(human_bytes(summary.bytes))} "
        f"({summary.shared_files:,} shared, {escape(human_bytes(summary.shared_bytes))}); "
        f"{summary.references:,} references</dd>"
        f"<dt>Created</dt><dd>{timestamp(snap.created_at)}</dd>"
        f"<dt>Completed</dt><dd>{timestamp(snap.completed_at)}</dd>"
        + (f"<dt>Error</dt><dd>{escape(snap.error)}</dd>" if snap.error else "")
        + "</dl>"
        + actions_bar(snap.job, root, snap.id)
    )
    headers = [
        ("Path", False),
        ("Size", True),
        ("Sharing", False),
        ("Operator", False),
        ("Subtask", True),
        ("Key groups", True),
    ]
    body = (
        f"<h1>Snapshot {snap.id}: {escape(snap.job)} checkpoint {snap.checkpoint_id}</h1>{facts}"
        "<h2>Key-group skew</h2>"
        + skew_section(catalog, snap)
        + "<h2>Files</h2>"
        + table(headers, file_rows(files.items), empty="This snapshot references no files.")
        + pager(window(files, limit), {}, noun="file references")
    )
    return page(f"Statekeeper: snapshot {snap.id}", body, root=root)


# --- maintenance history ---


def flow(into: int | None, out: int | None, *, as_bytes: bool = False) -> str:
    """In and out in one cell ("1,280 → 1,280"): two columns fewer, so the table fits 1024 px."""

    def shown(value: int | None) -> str:
        if value is None:
            return '<span class="none">-</span>'
        return escape(figure(value, as_bytes=as_bytes))

    return (
        f'<td class="num flow" title="in {into if into is not None else "-"}, '
        f'out {out if out is not None else "-"}"><span>{shown(into)}</span> &rarr; '
        f"<span>{shown(out)}</span></td>"
    )


def airflow_cell(r: RunRecord, root: str) -> str:
    """The Airflow DAG run (and its task's log) that made a maintenance run, as links."""
    if r.dag_id is None:
        return '<span class="none">-</span>'
    if not r.airflow_run_id:
        return escape(r.dag_id)
    run_link = (
        f'<a href="{escape(dag_run_href(root, r.dag_id, r.airflow_run_id))}" target="_top">'
        f"{escape(r.dag_id)}</a>"
    )
    log = task_log_href(root, r.dag_id, r.airflow_run_id, r.kind)
    log_link = (
        ""
        if log is None
        else f' &middot; <a href="{escape(log)}" target="_top" class="log">task log</a>'
    )
    return f"{run_link}{log_link}<br><small>{escape(r.airflow_run_id)}</small>"


def run_rows(runs: list[RunRecord], root: str = "") -> list[str]:
    # nine columns, secondary figures on a second line: the table fits a 1024 px window
    rows = []
    for r in runs:
        seconds = None if r.finished_at is None else (r.finished_at - r.started_at).total_seconds()
        snapshots = " &rarr; ".join(
            link(snapshot_href("", sid), str(sid)) if sid is not None else "-"
            for sid in (r.input_snapshot_id, r.output_snapshot_id)
        )
        rows.append(
            f'<tr><td class="wrap"><b>{escape(r.kind)}</b><br>'
            f"<small>{escape(r.run_id)}</small></td>"
            f'<td class="wrap">{link(job_href("", r.job), r.job) if r.job else "-"}</td>'
            f"<td>{status_badge(r.status)}<br><small>{escape(human_duration(seconds))}</small></td>"
            f"<td>{timestamp(r.started_at, short=True)}</td>"
            f"{flow(r.rows_in, r.rows_out)}{flow(r.bytes_in, r.bytes_out, as_bytes=True)}"
            f'<td class="num">{snapshots}</td><td class="wrap">{airflow_cell(r, root)}</td>'
            f'<td class="error-text">{escape(r.error or "")}</td></tr>'
        )
    return rows


def options(values: list[str], chosen: str | None, everything: str) -> str:
    opts = [f'<option value="">{escape(everything)}</option>']
    for value in values:
        selected = " selected" if value == chosen else ""
        opts.append(f'<option value="{escape(value)}"{selected}>{escape(value)}</option>')
    return "".join(opts)


RUN_KINDS = ["compaction", "savepoint", "ttl_cleanup", "rescale", "expire", "orphan_cleanup"]
RUN_STATUSES = ["RUNNING", "SUCCEEDED", "FAILED"]


@router.get("/runs", response_class=HTMLResponse)
def runs_page(
    catalog: CatalogDep,
    limit: PageLimit = PAGE_LIMIT,
    offset: Offset = 0,
    job: str | None = None,
    kind: str | None = None,
    status: str | None = None,
) -> HTMLResponse:
    job, kind, status = job or None, kind or None, status or None  # the form sends "" for "all"
    runs = catalog.runs_page(job=job, kind=kind, status=status, limit=limit, offset=offset)
    jobs = [j.name for j in catalog.list_jobs()]
    kinds = sorted({*RUN_KINDS, *([kind] if kind else [])})
    form = (
        '<form class="filter" method="get">'
        f'<label>Job<select name="job">{options(jobs, job, "all jobs")}</select></label>'
        f'<label>Kind<select name="kind">{options(kinds, kind, "all kinds")}</select></label>'
        f'<label>Status<select name="status">{options(RUN_STATUSES, status, "any status")}'
        '</select></label><button type="submit">Filter</button></form>'
    )
    headers = [
        ("Kind and run", False),
        ("Job", False),
        ("Status, duration", False),
        ("Started", False),
        ("Rows in → out", True),
        ("Bytes in → out", True),
        ("Snapshots", True),
        ("Airflow DAG / run", False),
        ("Error", False),
    ]
    scope = f" of job {escape(job)}" if job else ""
    body = (
        f"<h1>Maintenance runs{scope}</h1>"
        '<p class="sub">Compaction, savepoints, TTL cleanup, rescales, expiry and orphan cleanup, '
        "newest first.</p>"
        + form
        + table(headers, run_rows(runs.items), empty="No maintenance runs match.")
        + pager(window(runs, limit), {"job": job, "kind": kind, "status": status}, noun="runs")
    )
    return page("Statekeeper: maintenance runs", body)
