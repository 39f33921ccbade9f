"""``statectl verify [JOB]``: check the catalog against storage (:mod:`state_engine.verify`).

Importing this loads the catalog, fsspec and pyarrow (seconds): statectl adds its parser only when
the command line names ``verify``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from state_engine.catalog import Catalog
from state_engine.cli.output import print_text
from state_engine.config import Settings
from state_engine.verify import EXIT_INCONSISTENT, verify


def cmd_verify(args: argparse.Namespace) -> int:
    with Catalog.from_settings(Settings.from_env()) as catalog:
        report = verify(catalog, args.job, deep=not args.quick, strict=args.strict, sync=args.sync)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print_text(report.render())
    return 0 if report.ok else EXIT_INCONSISTENT


def register(commands: Any) -> argparse.ArgumentParser:
    """Add ``verify`` to statectl's subcommands."""
    text = (
        "check the catalog against storage: every file of every live snapshot exists with its "
        "size and checksum, each _metadata verifies; list unreferenced files. Exit 0 when "
        f"consistent, {EXIT_INCONSISTENT} on any inconsistency"
    )
    parser: argparse.ArgumentParser = commands.add_parser("verify", help=text, description=text)
    parser.set_defaults(handler=cmd_verify)
    parser.add_argument("job", metavar="JOB", nargs="?", help="only this job (default: all)")
    parser.add_argument("--quick", action="store_true", help="sizes only, no checksums")
    parser.add_argument(
        "--strict", action="store_true", help="unreferenced files are errors, not warnings"
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="Flink jobs: when a snapshot's _metadata is missing (the running job subsumed it "
        "since the last import), sync the job's directories and verify it again",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser
