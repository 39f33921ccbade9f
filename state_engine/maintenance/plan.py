"""What scheduled maintenance decides from the catalog before it starts any Spark work: which
steps each job's management policy allows, how many deltas rest on a job's full base
(compaction), and which jobs a TTL cleanup can work on. The maintenance and TTL cleanup DAGs call
these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, JobRecord, SnapshotRecord
from state_engine.maintenance.scope import policy_text, refusal
from state_engine.snapshot.metadata import read_metadata
from state_engine.snapshot_enums import SnapshotFormat


@dataclass(frozen=True)
class DeltaChain:
    """The latest COMPLETED snapshot of a job and how many deltas rest on its full base."""

    job: str
    latest_id: int | None
    deltas: int

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "latest_snapshot_id": self.latest_id, "deltas": self.deltas}


def delta_chain(catalog: Catalog, job: str) -> DeltaChain:
    """Count the deltas that rest on the full base of the job's latest COMPLETED snapshot.

    Read from the snapshot's ``_metadata``: every delta file carries its index in its subtask's
    chain (1 = the first delta on the base), so the count is the longest chain of any subtask.
    The catalog's ``parent_id`` cannot say it: it links a delta to the checkpoint completed
    last when it was triggered (none for a new base), one step, not the chain; and with
    overlapping checkpoints a delta may build on one still in flight then. A snapshot in
    another format (canonical, e.g. compaction's output, or native) has no deltas.
    """
    latest = catalog.latest_snapshot(job)
    if latest is None:
        return DeltaChain(job, None, 0)
    if latest.format != str(SnapshotFormat.DELTA):
        return DeltaChain(job, latest.id, 0)
    meta = read_metadata(latest.location)
    deltas = max((f.chain_index or 0 for f in meta.files), default=0)
    return DeltaChain(job, latest.id, deltas)


def has_active_ttl(record: SnapshotRecord) -> bool:
    """Whether any state in the snapshot's ``_metadata`` has a TTL that is not disabled."""
    meta = read_metadata(record.location)
    for op in meta.operators:
        for info in op.states.values():
            ttl = info.get("ttl") if isinstance(info, dict) else None
            if ttl and ttl.get("update_type") != "DISABLED":
                return True
    return False


def ttl_plan(catalog: Catalog) -> dict[str, Any]:
    """Every job's latest COMPLETED snapshot that a TTL cleanup can work on, and why others not.

    ``targets``: ``{"job", "snapshot"}`` per job to clean. ``skipped``: ``{"job", "reason"}``.
    """
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    latest = {s.job: s for s in catalog.latest_snapshots()}
    for job in catalog.list_jobs():
        record = latest.get(job.name)
        if job.origin == "flink":
            skipped.append(
                {"job": job.name, "reason": "a Flink job: convert a snapshot (savepoint DAG) first"}
            )
        elif record is None:
            skipped.append({"job": job.name, "reason": "no COMPLETED snapshot"})
        elif record.format != str(SnapshotFormat.CANONICAL):
            skipped.append(
                {
                    "job": job.name,
                    "reason": f"latest snapshot {record.id} is {record.format}: the maintenance "
                    "DAG's compaction turns it canonical first",
                }
            )
        elif not has_active_ttl(record):
            skipped.append(
                {"job": job.name, "reason": f"snapshot {record.id} has no state with a TTL"}
            )
        else:
            targets.append({"job": job.name, "snapshot": record.id})
    return {"targets": targets, "skipped": skipped}


#: the maintenance DAG's steps per job, in the order they run
STEPS = ("compaction", "expire", "orphan_cleanup")
#: step -> reason, for the steps an origin has nothing to do in (``flink.retention``'s rules)
SkipsOf = Callable[[Catalog, JobRecord], dict[str, str]]


def step_skip(
    catalog: Catalog, job: JobRecord, step: str, skips_of: SkipsOf | None = None
) -> str | None:
    """Why scheduled maintenance skips ``step`` of ``job``, or None when it runs: the job's
    management policy does not allow the deletion, or there is nothing of the kind to work on."""
    reason = refusal(job, step)
    if reason is not None:
        return reason
    return (skips_of(catalog, job) if skips_of else {}).get(step)


def maintenance_plan(catalog: Catalog, skips_of: SkipsOf | None = None) -> dict[str, Any]:
    """Every job, its policy, and each step scheduled maintenance skips for it and why.

    ``jobs``: the job names, by name; ``policies``: name -> policy text; ``skipped``:
    ``{"job", "step", "reason"}`` per step skipped (compaction decides from the delta chain
    when it runs).
    """
    jobs = catalog.list_jobs()
    skipped = []
    for job in jobs:
        for step in STEPS:
            reason = step_skip(catalog, job, step, skips_of)
            if reason is not None:
                skipped.append({"job": job.name, "step": step, "reason": reason})
    return {
        "jobs": [j.name for j in jobs],
        "policies": {j.name: policy_text(j.manage) for j in jobs},
        "skipped": skipped,
    }
