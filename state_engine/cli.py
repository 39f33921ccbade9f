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
from state_engine.formatting import BYTE_COLUMNS, format_table
from state_engine.jobs.commands import register as register_job_commands

Handler = Callable[[argparse.Namespace], int]


# --- output ---


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
    rows = [[getattr(r, c) for c in columns] for r in records]
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))


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
        # the directories a Flink job's snapshots are imported from (none for Statekeeper jobs)
        dirs = {j.id: catalog.job_directories(j.id) for j in jobs if j.origin == "flink"}
    if args.json:
        _print_json(
            [
                {
                    **dataclasses.asdict(j),
                    "latest_snapshot": latest.get(j.id),
                    "directories": [{"path": p, "role": r} for p, r in dirs.get(j.id, [])],
                }
                for j in jobs
            ]
        )
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
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))
    return 0


def cmd_snapshots(args: argparse.Namespace) -> int:
    from state_engine.formatting import ESTIMATE_NOTE, estimate_text, is_estimated

    with _open_catalog() as catalog:
        snaps = catalog.list_snapshots(args.job, status=args.status, limit=args.limit)
    if args.json:
        _print_json(
            [{**dataclasses.asdict(s), "entries_estimated": is_estimated(s.format)} for s in snaps]
        )
        return 0
    columns = [
        "id", "checkpoint_id", "kind", "format", "status", "parallelism", "bytes", "entries",
        "created_at", "completed_at", "trigger",
    ]  # fmt: skip
    rows = [
        [estimate_text(s.entries, s.format) if c == "entries" and is_estimated(s.format)
         else getattr(s, c) for c in columns]
        for s in snaps
    ]  # fmt: skip
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))
    if any(is_estimated(s.format) for s in snaps):
        print(f"~ entries of native snapshots are {ESTIMATE_NOTE}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _open_catalog() as catalog:
        snap = catalog.get_snapshot(args.snapshot)
        sizes = [p for p in catalog.state_size_history(snap.job_id) if p.snapshot_id == snap.id]
        skew = catalog.key_group_skew(snap.id)
    from state_engine.formatting import (
        ESTIMATE_NOTE,
        cell_text,
        escape_control,
        estimate_text,
        human_bytes,
        is_estimated,
    )

    estimated = is_estimated(snap.format)
    if args.json:
        _print_json(
            {
                "snapshot": {**dataclasses.asdict(snap), "entries_estimated": estimated},
                "sizes": sizes,
                "skew": [{**dataclasses.asdict(k), "estimated": estimated} for k in skew],
            }
        )
        return 0
    fields = dataclasses.asdict(snap)
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        text = human_bytes(value) if key in BYTE_COLUMNS and value is not None else value
        if key == "entries" and estimated:
            text = f"{estimate_text(value, snap.format)} ({ESTIMATE_NOTE})"
        print(f"{key.ljust(width)}  {escape_control(cell_text(text))}")
    if sizes:
        print("\nstate size per operator")
        print(
            format_table(
                ["operator", "files", "bytes", "shared_bytes"],
                [[p.operator, p.files, p.bytes, p.shared_bytes] for p in sizes],
                sizes=BYTE_COLUMNS,
            )
        )
    if skew:
        print(
            "\nkey-group skew (max / mean rows per key group)"
            + (f" ~ ESTIMATED: {ESTIMATE_NOTE}" if estimated else "")
        )
        print(
            format_table(
                ["operator", "key_groups", "total_rows", "max_rows", "mean_rows", "skew"],
                [[k.operator, k.key_groups, k.total_rows, k.max_rows, k.mean_rows, k.skew]
                 for k in skew],
                sizes=BYTE_COLUMNS,
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
        result = catalog.query(
            args.query, max_rows=args.max_rows, timeout_s=args.timeout, max_bytes=args.max_bytes
        )
    if args.json:
        _print_json([dict(zip(result.columns, row, strict=True)) for row in result.rows])
    else:
        # a query's own numbers stay as the database returned them: no size columns here
        print(format_table(result.columns, result.rows))
    if result.truncated:
        print(
            f"statectl: output cut at {result.truncated}: narrow the query (WHERE, LIMIT) or "
            "raise --max-rows / --max-bytes",
            file=sys.stderr,
        )
    return 0


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value

    return parse


def _byte_count(text: str) -> int:
    """``1048576``, ``512K``, ``16M``, ``1G`` (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(raw[-1:], 1)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; use e.g. 1048576 or 16M"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


# --- parser ---


def _command(
    subparsers: Any, name: str, handler: Handler, help: str, *, json_output: bool = True
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """statectl's parser; given the command line ``argv``, only what that line needs is imported."""
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
    sql.add_argument(
        "--max-rows",
        type=_positive(int),
        default=10_000,
        help="print at most this many rows (10000)",
    )
    sql.add_argument(
        "--max-bytes",
        type=_byte_count,
        default=16 << 20,
        help="read at most this much output, e.g. 512K (default 16M)",
    )
    sql.add_argument(
        "--timeout",
        type=_positive(float),
        default=30.0,
        metavar="SECONDS",
        help="stop the query after this long (default 30)",
    )

    # `maintain NAME` and `state show`: the Spark jobs register their own commands (pyspark is
    # imported only when one of them runs, so the catalog commands stay quick).
    register_job_commands(commands)
    # verify imports the catalog, fsspec and pyarrow (seconds): its parser is built only when
    # the command line names it, so that `statectl --help` and usage errors stay instant
    if argv is None or "verify" in argv:
        from state_engine.verify import register as register_verify

        register_verify(commands)
    else:
        commands.add_parser(
            "verify", help="check the catalog against storage (see `statectl verify --help`)"
        )
    from state_engine.flink.cli import register as register_flink

    register_flink(commands)
    return parser


# The engine installs without these (pyproject.toml's extras); a command that needs one says which.
_EXTRA_OF = {"pyspark": "spark", "pandas": "spark", "psycopg": "postgres", "s3fs": "s3"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
    except ModuleNotFoundError as exc:
        extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"statectl: error: this needs {exc.name}, which is not installed; "
            f"install statekeeper's [{extra}] extra: pip install 'statekeeper[{extra}]'",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
