"""What scheduled maintenance decides from the catalog before it starts any Spark work: how many
deltas rest on a job's full base (compaction), and which jobs a TTL cleanup can work on. The
maintenance and TTL cleanup DAGs call these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, SnapshotRecord
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
