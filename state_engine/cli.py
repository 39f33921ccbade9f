"""``statectl``: the command line over the catalog and the state layer.

Every command is a subcommand registered in :func:`build_parser`. Errors from
:mod:`state_engine.errors` become one line on stderr and exit code 1; bad usage exits 2.
Every catalog command except ``catalog upgrade`` refuses a catalog that is not at head.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from state_engine import __version__
from state_engine.config import Settings
from state_engine.errors import StatekeeperError
from state_engine.jobs.commands import register as register_job_commands

Handler = Callable[[argparse.Namespace], int]


# --- output ---


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns; numbers right-aligned, everything else left."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        any(r[i] is not None for r in rows)
        and all(isinstance(r[i], int | float | Decimal) or r[i] is None for r in rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    if not rows:
        out.append("(no rows)")
    return "\n".join(out)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _print_json(payload: Any) -> None:
    print(json.dumps(payload, default=_json_default, indent=2, sort_keys=False))


def _print_records(
    args: argparse.Namespace, records: Sequence[Any], columns: Sequence[str]
) -> None:
    if args.json:
        _print_json([dataclasses.asdict(r) for r in records])
        return
    print(format_table(columns, [[getattr(r, c) for c in columns] for r in records]))


# --- commands ---


def _open_catalog() -> Any:
    from state_engine.catalog import Catalog

    return Catalog.from_settings(Settings.from_env())


def cmd_catalog_upgrade(args: argparse.Namespace) -> int:
    from state_engine.catalog import engine, migrate

    url = Settings.from_env().catalog_url
    before, after = migrate.upgrade(url)
    where = engine.display_url(url)
    if before == after:
        print(f"catalog at {where} is already at head ({after})")
    else:
        print(f"catalog at {where} upgraded from {before or 'empty'} to {after}")
    return 0


def cmd_catalog_current(args: argparse.Namespace) -> int:
    from state_engine.catalog import engine, migrate

    url = Settings.from_env().catalog_url
    current, head = migrate.current_revision(url), migrate.head_revision()
    if args.json:
        _print_json({"url": engine.display_url(url), "current": current, "head": head})
    else:
        state = "at head" if current == head else "NOT at head: run `statectl catalog upgrade`"
        print(f"{engine.display_url(url)}: revision {current or 'none'} (head {head}), {state}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        jobs = catalog.list_jobs()
        latest = {s.job_id: s for s in catalog.latest_snapshots()}
    if args.json:
        _print_json([{**dataclasses.asdict(j), "latest_snapshot": latest.get(j.id)} for j in jobs])
        return 0
    rows = []
    for j in jobs:
        snap = latest.get(j.id)
        rows.append(
            [
                j.id,
                j.name,
                j.max_parallelism,
                None if snap is None else snap.id,
                None if snap is None else snap.checkpoint_id,
                None if snap is None else snap.bytes,
                None if snap is None else snap.completed_at,
            ]
        )
    columns = ["id", "name", "max_parallelism", "latest", "checkpoint", "bytes", "completed_at"]
    print(format_table(columns, rows))
    return 0


def cmd_snapshots(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        snaps = catalog.list_snapshots(args.job, status=args.status, limit=args.limit)
    columns = [
        "id", "checkpoint_id", "kind", "format", "status", "parallelism", "bytes", "entries",
        "created_at", "completed_at", "trigger",
    ]  # fmt: skip
    _print_records(args, snaps, columns)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        snap = catalog.get_snapshot(args.snapshot)
        sizes = [p for p in catalog.state_size_history(snap.job_id) if p.snapshot_id == snap.id]
        skew = catalog.key_group_skew(snap.id)
    if args.json:
        _print_json({"snapshot": snap, "sizes": sizes, "skew": skew})
        return 0
    fields = dataclasses.asdict(snap)
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        print(f"{key.ljust(width)}  {_cell(value)}")
    if sizes:
        print("\nstate size per operator")
        print(
            format_table(
                ["operator", "files", "bytes", "shared_bytes"],
                [[p.operator, p.files, p.bytes, p.shared_bytes] for p in sizes],
            )
        )
    if skew:
        print("\nkey-group skew (max / mean rows per key group)")
        print(
            format_table(
                ["operator", "key_groups", "total_rows", "max_rows", "mean_rows", "skew"],
                [[k.operator, k.key_groups, k.total_rows, k.max_rows, k.mean_rows, k.skew]
                 for k in skew],
            )
        )  # fmt: skip
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        files = catalog.snapshot_files(args.snapshot)
    columns = [
        "path", "size", "shared", "operator", "subtask", "key_group_start", "key_group_end",
        "created_by_snapshot_id",
    ]  # fmt: skip
    _print_records(args, files, columns)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        runs = catalog.list_runs(job=args.job, kind=args.kind, limit=args.limit)
    columns = [
        "run_id", "kind", "job", "status", "attempts", "started_at", "finished_at", "rows_out",
        "bytes_out", "error",
    ]  # fmt: skip
    _print_records(args, runs, columns)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        result = catalog.query(args.query, max_rows=args.max_rows)
    if args.json:
        _print_json([dict(zip(result.columns, row, strict=True)) for row in result.rows])
    else:
        print(format_table(result.columns, result.rows))
    return 0


# --- parser ---


def _command(
    subparsers: Any, name: str, handler: Handler, help: str, *, json_output: bool = True
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statectl", description="Inspect and maintain the state of stream-processing jobs."
    )
    parser.add_argument("--version", action="version", version=f"statectl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    catalog = commands.add_parser("catalog", help="manage the catalog database schema")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", metavar="ACTION")
    _command(
        catalog_commands,
        "upgrade",
        cmd_catalog_upgrade,
        "migrate the catalog to this version's schema (creates it if needed)",
        json_output=False,
    )
    _command(catalog_commands, "current", cmd_catalog_current, "show the catalog's schema revision")

    _command(commands, "jobs", cmd_jobs, "list jobs with their latest completed snapshot")

    snapshots = _command(commands, "snapshots", cmd_snapshots, "list a job's snapshots")
    snapshots.add_argument("job", metavar="JOB", help="job name")
    snapshots.add_argument("--status", help="only this status (e.g. COMPLETED)")
    snapshots.add_argument("--limit", type=int, default=None, help="at most this many")

    show = _command(commands, "show", cmd_show, "show one snapshot: sizes and key-group skew")
    show.add_argument("snapshot", metavar="SNAPSHOT", type=int, help="snapshot id")

    files = _command(commands, "files", cmd_files, "list the files of a snapshot")
    files.add_argument("snapshot", metavar="SNAPSHOT", type=int, help="snapshot id")

    runs = _command(commands, "runs", cmd_runs, "maintenance history, newest first")
    runs.add_argument("--job", help="only runs of this job")
    runs.add_argument("--kind", help="only runs of this kind (e.g. compaction)")
    runs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")

    sql = _command(commands, "sql", cmd_sql, "run one read-only SELECT against the catalog")
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT * FROM sk_v_latest_snapshots"')
    sql.add_argument("--max-rows", type=int, default=None, help="stop after this many rows")

    # `maintain NAME` and `state show`: the Spark jobs register their own commands (pyspark is
    # imported only when one of them runs, so the catalog commands stay quick).
    register_job_commands(commands)
    from state_engine.verify import register as register_verify

    register_verify(commands)
    from state_engine.flink.cli import register as register_flink

    register_flink(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except StatekeeperError as exc:
        print(f"statectl: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
