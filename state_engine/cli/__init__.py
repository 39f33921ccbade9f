"""``statectl``: the command line over the catalog and the state layer.

Every command is a subcommand, registered by its module here in :func:`build_parser`. Errors from
:mod:`state_engine.errors` become one line on stderr and exit code 1; bad usage exits 2.
Every catalog command except ``catalog upgrade`` refuses a catalog that is not at head.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from state_engine import __version__
from state_engine.cli import browse, catalog, flink, maintain, policy, sql
from state_engine.errors import StatekeeperError


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """statectl's parser; given the command line ``argv``, only what that line needs is imported."""
    parser = argparse.ArgumentParser(
        prog="statectl", description="Inspect and maintain the state of stream-processing jobs."
    )
    parser.add_argument("--version", action="version", version=f"statectl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    catalog.register(commands)
    browse.register(commands)
    policy.register(commands)  # `jobs set-policy`, under browse's `jobs`
    sql.register(commands)
    # `maintain NAME` and `state show` import pyspark only when one of them runs, so the catalog
    # commands stay quick
    maintain.register(commands)
    # verify imports the catalog, fsspec and pyarrow (seconds): its parser is built only when
    # the command line names it, so that `statectl --help` and usage errors stay instant
    if argv is None or "verify" in argv:
        from state_engine.cli.verify import register as register_verify

        register_verify(commands)
    else:
        commands.add_parser(
            "verify", help="check the catalog against storage (see `statectl verify --help`)"
        )
    flink.register(commands)
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
