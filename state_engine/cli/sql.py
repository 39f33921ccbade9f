"""``statectl sql QUERY``: one read-only SELECT against the catalog, within caps."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from state_engine.cli.catalog import open_catalog
from state_engine.cli.output import command, print_json
from state_engine.formatting import format_table


def cmd_sql(args: argparse.Namespace) -> int:
    with open_catalog() as catalog:
        result = catalog.query(
            args.query, max_rows=args.max_rows, timeout_s=args.timeout, max_bytes=args.max_bytes
        )
    if args.json:
        print_json([dict(zip(result.columns, row, strict=True)) for row in result.rows])
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


def register(commands: Any) -> None:
    """Add ``sql QUERY`` to statectl."""
    sql = command(commands, "sql", cmd_sql, "run one read-only SELECT against the catalog")
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
