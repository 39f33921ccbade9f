"""``statectl catalog upgrade`` and ``statectl catalog current``: the catalog's schema."""

from __future__ import annotations

import argparse
from typing import Any

from state_engine.cli.output import command, print_json
from state_engine.config import Settings


def open_catalog() -> Any:
    """The configured catalog (a context manager), for the commands that read it."""
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
        print_json({"url": engine.display_url(url), "current": current, "head": head})
    else:
        state = "at head" if current == head else "NOT at head: run `statectl catalog upgrade`"
        print(f"{engine.display_url(url)}: revision {current or 'none'} (head {head}), {state}")
    return 0


def register(commands: Any) -> None:
    """Add ``catalog upgrade`` and ``catalog current`` to statectl."""
    catalog = commands.add_parser("catalog", help="manage the catalog database schema")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", metavar="ACTION")
    command(
        catalog_commands,
        "upgrade",
        cmd_catalog_upgrade,
        "migrate the catalog to this version's schema (creates it if needed)",
        json_output=False,
    )
    command(catalog_commands, "current", cmd_catalog_current, "show the catalog's schema revision")
