"""``statectl flink ...``: commands for jobs whose snapshots Apache Flink wrote."""

from __future__ import annotations

import argparse
import json
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


def register(subparsers: Any) -> None:
    """Add ``flink import PATH... --job NAME [--json]`` to statectl."""
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
