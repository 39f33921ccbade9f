"""``statectl flink import`` and ``statectl flink forget-directory``: jobs whose snapshots Apache
Flink wrote."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from state_engine.config import Settings


def cmd_flink_import(args: argparse.Namespace) -> int:
    from state_engine.catalog import Catalog
    from state_engine.flink.import_job import import_flink

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        report = import_flink(catalog, list(args.paths), args.job)
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report.render())
    return 0


def cmd_flink_forget_directory(args: argparse.Namespace) -> int:
    from state_engine.catalog import Catalog
    from state_engine.flink.forget import forget_directory

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        report = forget_directory(catalog, args.path, args.job, wait=args.wait)
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report.render())
    return 0


def cmd_flink_rewrite(args: argparse.Namespace) -> int:
    from state_engine.cli.maintain import print_restore
    from state_engine.jobs.commands import json_default, run_job

    args.job_name = "flink_rewrite"
    report = run_job(args)
    if args.json:
        print(json.dumps(report, default=json_default, sort_keys=True))
        print_restore(report)
    else:
        print_restore(report, out=sys.stdout)
    return 0


def register(subparsers: Any) -> None:
    """Add ``flink import PATH... --job NAME`` and ``flink forget-directory PATH --job NAME``."""
    flink = subparsers.add_parser(
        "flink", help="Apache Flink jobs: import their checkpoints and savepoints"
    )
    commands = flink.add_subparsers(dest="flink_command", metavar="ACTION")
    imp = commands.add_parser(
        "import",
        help="import (or sync) a Flink job's checkpoint/savepoint directories into the catalog",
        description=(
            "Each PATH is a Flink job's checkpoint directory (<checkpoint-dir>/<job-id>), a "
            "savepoint directory, or a directory of savepoint directories. Every completed "
            "snapshot becomes a catalog snapshot of job NAME (origin flink). Run it again to "
            "sync: new snapshots are added, vanished ones marked."
        ),
    )
    imp.add_argument("paths", metavar="PATH", nargs="+", help="directory path or URL")
    imp.add_argument("--job", required=True, help="the catalog job name")
    imp.add_argument("--json", action="store_true", help="print the report as JSON")
    imp.set_defaults(handler=cmd_flink_import)
    forget = commands.add_parser(
        "forget-directory",
        help="forget a directory of a Flink job that is gone for good",
        description=(
            "A sync keeps the snapshots of a claimed directory it cannot find (it may come "
            "back). When PATH was deleted on purpose, this discards the job's snapshots in it, "
            "forgets its files (nothing is deleted) and releases the directory. Refused while "
            "PATH exists."
        ),
    )
    forget.add_argument("path", metavar="PATH", help="the directory, as it was imported")
    forget.add_argument("--job", required=True, help="the catalog job name")
    forget.add_argument(
        "--wait", type=float, default=None, metavar="SECONDS",
        help="wait up to SECONDS for the job's file lease (held by an expire or orphan cleanup)",
    )  # fmt: skip
    forget.add_argument("--json", action="store_true", help="print the report as JSON")
    forget.set_defaults(handler=cmd_flink_forget_directory)
    from state_engine.jobs.commands import flink_rewrite_arguments

    rewrite = commands.add_parser(
        "rewrite",
        help="write a Flink savepoint from a Flink job's snapshot (rescale, TTL, state surgery)",
        description=(
            "Rewrite a COMPLETED snapshot of Flink job NAME (its latest one Flink wrote, unless "
            "--snapshot) into a new canonical Flink savepoint, on Spark: a new parallelism and "
            "max parallelism, TTL cleanup (--ttl STATE=MS, --at), dropped states or operators, "
            "new uids. The savepoint is a catalog snapshot of the job; restore it with "
            "`flink run -s DIR`. Nothing is written when the input is refused."
        ),
    )
    flink_rewrite_arguments(rewrite)
    rewrite.add_argument("--run-id", help="the run's id: the same id again never redoes a success")
    rewrite.add_argument("--json", action="store_true", help="print the run's report as JSON")
    rewrite.set_defaults(handler=cmd_flink_rewrite, dag_id=None, airflow_run_id=None, task_id=None)
