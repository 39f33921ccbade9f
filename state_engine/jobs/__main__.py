"""``python -m state_engine.jobs NAME --param value ...``: a maintenance job as a Spark application.

As a spark-submit application: ``spark-submit .../state_engine/jobs/__main__.py NAME ...``
(state_engine installed on the driver and the executors). The last line on stdout is the run's
JSON report; an error is one line on stderr and exit code 1 (bad usage: 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from state_engine.errors import StatekeeperError
from state_engine.jobs.commands import add_job_parsers, json_default, run_job

PROG = "python -m state_engine.jobs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Run one Statekeeper maintenance job.")
    add_job_parsers(parser.add_subparsers(dest="command", metavar="JOB"), _print_report)
    return parser


def _print_report(args: argparse.Namespace) -> int:
    report = run_job(args)
    print(json.dumps(report, default=json_default, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except StatekeeperError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except Exception as exc:  # Spark failing to start, I/O: still one line, never a traceback
        print(f"{PROG}: error: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}",
              file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    sys.exit(main())
