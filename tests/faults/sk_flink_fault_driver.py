"""The process the Flink crash-point tests kill: ``import`` runs ``statectl flink import``'s
import, ``maintain KIND`` runs the Flink expire or orphan cleanup with a run id and JSON params.
Each prints its report as one JSON line; started with ``STATEKEEPER_CRASH_AT`` it dies there."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from state_engine.catalog import Catalog


def run_import(args: argparse.Namespace) -> dict[str, Any]:
    from state_engine.flink.import_job import import_flink

    with Catalog.open(args.catalog) as catalog:
        return import_flink(catalog, args.paths, args.job).to_dict()


def run_maintain(args: argparse.Namespace) -> dict[str, Any]:
    if args.lease_ttl is not None:
        from state_engine.maintenance import deletion

        # as sk_fault_driver: a killed deleter's lease must expire before its retry can start
        defaults = deletion.FileLease.__init__.__kwdefaults__
        assert defaults is not None and "ttl" in defaults
        defaults["ttl"] = args.lease_ttl
    from state_engine.flink.retention import run_maintenance

    with Catalog.open(args.catalog) as catalog:
        return run_maintenance(catalog, args.kind, run_id=args.run_id, **json.loads(args.params))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import")
    imp.add_argument("paths", nargs="+")
    imp.add_argument("--catalog", required=True)
    imp.add_argument("--job", required=True)
    imp.set_defaults(run=run_import)
    maintain = commands.add_parser("maintain")
    maintain.add_argument("kind", choices=["expire", "orphan_cleanup"])
    maintain.add_argument("--catalog", required=True)
    maintain.add_argument("--run-id", required=True)
    maintain.add_argument("--params", default="{}")
    maintain.add_argument("--lease-ttl", type=float)
    maintain.set_defaults(run=run_maintain)
    args = parser.parse_args(argv)
    print(json.dumps(args.run(args), default=str, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
