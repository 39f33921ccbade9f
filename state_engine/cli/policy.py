"""``statectl jobs set-policy JOB (--manage ACTIONS | --read-only)``: what Statekeeper may delete
in a job's directories."""

from __future__ import annotations

import argparse
from typing import Any

from state_engine.cli.catalog import open_catalog
from state_engine.cli.output import print_json

MANAGE_HELP = (
    "what Statekeeper may delete in the job's directories: retention (expire deletes old "
    "checkpoints and the savepoints you name), orphans (orphan cleanup deletes unreferenced "
    "files), comma-separated"
)


def cmd_set_policy(args: argparse.Namespace) -> int:
    from state_engine.maintenance.scope import parse_actions, policy_text

    manage = [] if args.read_only else parse_actions(args.manage)
    with open_catalog() as catalog:
        job = catalog.set_job_policy(args.job, manage)
    if args.json:
        print_json({"job": job.name, "origin": job.origin, "manage": list(job.manage)})
    else:
        from state_engine.formatting import escape_control

        print(f"job {escape_control(job.name)}: management policy {policy_text(job.manage)}")
    return 0


def register(commands: Any) -> None:
    """Add ``set-policy`` under ``statectl jobs`` (registered before this, by ``browse``)."""
    jobs: argparse.ArgumentParser = commands.choices["jobs"]
    actions = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    description = (
        "Set which deleting maintenance Statekeeper may run in the job's directories. A job "
        "imported from Apache Flink starts read-only; a Statekeeper job allows everything. "
        "Writing a new savepoint is no deletion and needs no policy."
    )
    policy = actions.add_parser(
        "set-policy",
        help="set what Statekeeper may delete in a job's directories",
        description=description,
    )
    policy.add_argument("job", metavar="JOB", help="job name")
    choice = policy.add_mutually_exclusive_group(required=True)
    choice.add_argument("--manage", metavar="ACTIONS", help=MANAGE_HELP)
    choice.add_argument(
        "--read-only", action="store_true", help="Statekeeper deletes nothing in the job's dirs"
    )
    policy.add_argument("--json", action="store_true", help="print JSON")
    policy.set_defaults(handler=cmd_set_policy)
