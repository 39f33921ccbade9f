"""What statectl prints: JSON, tables of records, text from the catalog, usage errors, and how a
command is added."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, NoReturn

from state_engine.formatting import BYTE_COLUMNS, escape_control, format_table

Handler = Callable[[argparse.Namespace], int]


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def print_json(payload: Any) -> None:
    print(json.dumps(payload, default=json_default, indent=2, sort_keys=False))


def print_text(text: str) -> None:
    """Print a rendered report line by line, each escaped as table cells are: a name or path
    from the catalog must not move the cursor or forge a line."""
    print("\n".join(escape_control(line) for line in text.split("\n")))


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: what was wrong and where the help is."""

    def error(self, message: str) -> NoReturn:
        line = escape_control(f"{self.prog}: error: {message}; see `{self.prog} --help`")
        self.exit(2, line + "\n")


def print_records(args: argparse.Namespace, records: Sequence[Any], columns: Sequence[str]) -> None:
    if args.json:
        print_json([dataclasses.asdict(r) for r in records])
        return
    rows = [[getattr(r, c) for c in columns] for r in records]
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))


def command(
    subparsers: Any, name: str, handler: Handler, help: str, *, json_output: bool = True
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` running ``handler``, with ``--json`` unless ``json_output``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser
