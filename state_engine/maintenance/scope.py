"""A job's management policy: which deleting maintenance Statekeeper may run in its directories.

``expire`` needs the action ``retention`` and ``orphan_cleanup`` the action ``orphans``; the
other jobs (compaction, TTL cleanup, savepoint, rescale) write new snapshots and need none. A dry
run deletes nothing and is always allowed. The policy is checked where a run is asked for
(statectl, the Airflow operator, the maintenance DAG's plan), before any run is recorded; the job
bodies themselves do not ask. The rules in full are in the docs (operations: what Statekeeper
deletes in Flink directories).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, JobRecord
from state_engine.catalog.models import JOB_ACTIONS
from state_engine.errors import JobReadOnly, NoSuchJob

#: the policy action each deleting maintenance job needs
ACTION_OF = {"expire": "retention", "orphan_cleanup": "orphans"}


def parse_actions(text: str) -> list[str]:
    """``--manage retention,orphans`` as a list of actions; an unknown one is refused."""
    actions = [a.strip() for a in text.split(",") if a.strip()]
    if not actions:
        raise JobReadOnly(
            f"--manage needs one or more of {','.join(JOB_ACTIONS)} (use --read-only for none)"
        )
    for action in actions:
        if action not in JOB_ACTIONS:
            raise JobReadOnly(
                f"--manage {text!r}: unknown action {action!r}; the actions are "
                f"{', '.join(JOB_ACTIONS)}"
            )
    return actions


def policy_text(manage: Iterable[str]) -> str:
    """A policy as people read it: ``retention,orphans`` or ``read-only``."""
    return ",".join(manage) or "read-only"


def grant_command(job: JobRecord, action: str) -> str:
    """The command that adds ``action`` to the job's policy."""
    wanted = [a for a in JOB_ACTIONS if a in job.manage or a == action]
    return f"statectl jobs set-policy {job.name} --manage {','.join(wanted)}"


def refusal(job: JobRecord, kind: str) -> str | None:
    """Why ``kind`` may not delete in ``job``'s directories, or None when its policy allows it."""
    action = ACTION_OF.get(kind)
    if action is None or action in job.manage:
        return None
    what = (
        "is read-only for Statekeeper"
        if not job.manage
        else f"lets Statekeeper manage {policy_text(job.manage)} only, not {action}"
    )
    return (
        f"job {job.name!r} {what}: nothing deleted ({kind} needs {action!r}); allow it with "
        f"`{grant_command(job, action)}`"
    )


def check_allowed(catalog: Catalog, kind: str, params: Mapping[str, Any]) -> None:
    """Refuse (JobReadOnly) a deleting run of ``kind`` the job's policy does not allow.

    An unknown job or a dry run passes: the job itself says what is wrong with the first, and
    the second deletes nothing.
    """
    job = params.get("job")
    if kind not in ACTION_OF or params.get("dry_run") or not isinstance(job, str):
        return
    try:
        record = catalog.get_job(job)
    except NoSuchJob:
        return
    reason = refusal(record, kind)
    if reason is not None:
        raise JobReadOnly(reason)


@dataclass(frozen=True)
class Deletion:
    """What a run deleted, as its report says: ``paths`` are the first of ``count``."""

    count: int
    bytes: int
    paths: list[str]


def deleted_by(recorded: Mapping[str, Any] | None) -> Deletion | None:
    """The files a run deleted, from its recorded report (a run record's ``stats``); None when
    it deleted none (a dry run deletes none)."""
    report = (recorded or {}).get("stats")
    if not isinstance(report, dict) or report.get("dry_run"):
        return None
    listed = report.get("deleted")
    listed = listed if isinstance(listed, dict) else {}
    count = report.get("files_deleted", listed.get("count"))
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return None
    nbytes = report.get("bytes_deleted", listed.get("bytes"))
    items = listed.get("items")
    return Deletion(
        count,
        nbytes if isinstance(nbytes, int) else 0,
        [str(p) for p in items] if isinstance(items, list) else [],
    )
