"""``statectl maintain NAME ...`` and ``statectl state show SNAPSHOT``.

``maintain`` prints the run's report as JSON: a savepoint of a Flink job's snapshot is converted
in-process (:mod:`state_engine.flink.convert`), every other run goes through
:func:`state_engine.jobs.commands.run_job`. ``state show`` decodes a snapshot's keyed state: a
Flink job's from Flink's bytes, a small Statekeeper snapshot read directly, a larger one with Spark.
Every handler is ``handler(args) -> exit code`` and raises StatekeeperErrors for statectl to print.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from state_engine.config import Settings
from state_engine.errors import InvalidJobParams
from state_engine.jobs.commands import add_job_parsers, json_default, run_job


def cmd_maintain(args: argparse.Namespace) -> int:
    report = _flink_savepoint(args) if args.job_name == "savepoint" else None
    if report is None:
        report = run_job(args)
    print(json.dumps(report, default=json_default, sort_keys=True))
    print_restore(report)
    return 0


def print_restore(report: dict[str, Any], *, out: Any = None) -> None:
    """A Flink rewrite's news for people (on stderr: stdout is the JSON report): that no rewrite
    was needed, how to restore the output savepoint, what must change in the job first."""
    import sys

    from state_engine.flink.maintain import restore_lines

    stats = report.get("stats") or {}
    restore = stats.get("restore")
    if not isinstance(restore, dict):
        return
    stream = out if out is not None else sys.stderr
    if stats.get("no_rewrite_needed"):
        print(stats.get("message", "no rewrite needed"), file=stream)
    elif stats.get("output_location"):
        print(f"wrote Flink savepoint {stats['output_location']} (snapshot "
              f"{report.get('output_snapshot_id')})", file=stream)  # fmt: skip
    for line in restore_lines(restore):
        print(line, file=stream)


def cmd_state_show(args: argparse.Namespace) -> int:
    from state_engine.catalog import Catalog

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        rows = _flink_state_rows(catalog, args)
        if rows is None:
            rows = _statekeeper_state_rows(catalog, args, settings)
    from state_engine.maintenance.state_decode import COLUMNS

    if args.json:
        print(json.dumps(rows, default=json_default, ensure_ascii=False))
    else:
        from state_engine.formatting import format_table

        print(format_table(COLUMNS, [[r[c] for c in COLUMNS] for r in rows], width=60))
    return 0


def _flink_savepoint(args: argparse.Namespace) -> dict[str, Any] | None:
    """A snapshot of a Flink job converts in-process (no Spark); None for any other snapshot."""
    if getattr(args, "snapshot", None) is None and getattr(args, "job", None) is None:
        return None
    from state_engine.catalog import Catalog
    from state_engine.flink import convert
    from state_engine.flink.keyed_state import catalog_flink_metadata
    from state_engine.flink.pyflink import PyFlinkTypes

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        snapshot = args.snapshot
        if snapshot is None:  # --job NAME: its latest Flink snapshot, if it is a Flink job
            snapshot = convert.latest_flink_snapshot(catalog, args.job)
            if snapshot is None:
                return None
        elif catalog_flink_metadata(catalog, snapshot) is None:
            return None
        return convert.run(
            catalog,
            snapshot,
            savepoint_dir=args.savepoint_dir,
            ttl=convert.parse_ttl(args.ttl),
            pyflink_types=PyFlinkTypes.parse(args.pyflink_types),
            run_id=args.run_id,
            settings=settings,
        )


def _statekeeper_state_rows(
    catalog: Any, args: argparse.Namespace, settings: Settings
) -> list[dict[str, Any]]:
    """Rows of a Statekeeper snapshot: read directly when small, with Spark above that."""
    from state_engine.maintenance.state_local import plan_show, read_rows

    # every refusal (id, status, format, operator, state, key) before any Spark start
    plan = plan_show(catalog, args.snapshot, state=args.state, key=args.key, operator=args.operator)
    if plan.local and not args.spark:
        return read_rows(plan, args.limit)
    from state_engine.jobs.spark import app_name, build_spark, quiet_spark_conf
    from state_engine.jobs.state_inspect import show_rows

    spark = build_spark(settings, extra=quiet_spark_conf(), name=app_name("state-show"))
    spark.sparkContext.setLogLevel("ERROR")
    return show_rows(
        spark,
        catalog,
        args.snapshot,
        state=args.state,
        key=args.key,
        operator=args.operator,
        limit=args.limit,
    )


def _flink_state_rows(catalog: Any, args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Rows of a snapshot of a Flink job, decoded in-process from Flink's bytes (no Spark)."""
    from state_engine.flink.keyed_state import catalog_flink_metadata
    from state_engine.flink.pyflink import PyFlinkTypes
    from state_engine.flink.snapshot_state import snapshot_rows

    meta = catalog_flink_metadata(catalog, args.snapshot)
    if meta is None:
        if getattr(args, "raw", False):
            raise InvalidJobParams("--raw reads snapshots of Flink jobs only")
        return None
    return snapshot_rows(
        meta,
        operator=args.operator,
        state=args.state,
        key=args.key,
        limit=args.limit,
        raw=args.raw,
        pyflink_types=PyFlinkTypes.parse(args.pyflink_types),
    )


def register(subparsers: Any) -> None:
    """Add ``maintain NAME ...`` and ``state show SNAPSHOT ...`` to statectl."""
    maintain = subparsers.add_parser(
        "maintain", help="run a maintenance job on Spark", description="run a maintenance job"
    )
    add_job_parsers(maintain.add_subparsers(dest="maintain_command", metavar="JOB"), cmd_maintain)

    state = subparsers.add_parser("state", help="read the state inside a snapshot")
    state_commands = state.add_subparsers(dest="state_command", metavar="ACTION")
    show = state_commands.add_parser(
        "show",
        help="decoded keyed state of a completed canonical snapshot",
        description="decoded keyed state of a completed canonical snapshot (read directly when "
        "its files are small, with Spark above 64 MiB)",
    )
    show.add_argument("snapshot", metavar="SNAPSHOT", type=int, help="snapshot id")
    show.add_argument("--state", help="only this state")
    show.add_argument("--key", help="only this key (int keys as digits, tuple keys as JSON)")
    show.add_argument("--operator", help="only this operator")
    show.add_argument("--limit", type=int, default=100, help="at most this many rows (100)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.add_argument(
        "--spark",
        action="store_true",
        help="read with Spark even when the files are small (default: Spark above 64 MiB)",
    )
    show.add_argument(
        "--raw",
        action="store_true",
        help="Flink snapshots: keys and values as base64 bytes, not decoded",
    )
    show.add_argument(
        "--pyflink-type",
        dest="pyflink_types",
        action="append",
        metavar="STATE=KIND[:TYPE[:TYPE]]",
        help="PyFlink jobs: how a Python state is coded, e.g. total=value:LONG (repeatable)",
    )
    show.set_defaults(handler=cmd_state_show)
