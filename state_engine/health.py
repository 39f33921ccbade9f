"""The catalog health report: per job, its latest completed snapshot and its stale commits.

A PENDING snapshot older than the threshold is a commit that never completed (the job died
between writing files and the compare-and-swap); its files stay pinned until it is failed, after
which the orphan cleanup reclaims them. Plain functions over a ``Catalog``: the catalog health DAG
is a thin schedule around them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.catalog.engine import display_url
from state_engine.snapshot_enums import SnapshotStatus

JsonDict = dict[str, Any]


def _age_seconds(then: datetime, now: datetime) -> int:
    return max(int((now - then).total_seconds()), 0)


def _latest(snapshot: SnapshotRecord | None, now: datetime) -> JsonDict | None:
    if snapshot is None or snapshot.completed_at is None:
        return None
    return {
        "snapshot_id": snapshot.id,
        "checkpoint_id": snapshot.checkpoint_id,
        "kind": snapshot.kind,
        "completed_at": snapshot.completed_at.isoformat(),
        "age_seconds": _age_seconds(snapshot.completed_at, now),
        "bytes": snapshot.bytes,
        "location": snapshot.location,
    }


def _pending(snapshot: SnapshotRecord, now: datetime) -> JsonDict:
    return {
        "snapshot_id": snapshot.id,
        "checkpoint_id": snapshot.checkpoint_id,
        "kind": snapshot.kind,
        "created_at": snapshot.created_at.isoformat(),
        "age_seconds": _age_seconds(snapshot.created_at, now),
        "location": snapshot.location,
    }


def health_report(catalog: Catalog, *, now: datetime, stale_pending_after: timedelta) -> JsonDict:
    """A JSON-ready report of every job (sorted by name); ``now`` must be timezone-aware."""
    if now.tzinfo is None:
        raise ValueError("health_report needs an aware 'now' (the catalog stores UTC)")
    latest = {snap.job: snap for snap in catalog.latest_snapshots()}
    cutoff = now - stale_pending_after
    jobs: list[JsonDict] = []
    for job in catalog.list_jobs():
        pending = catalog.list_snapshots(job.name, status=SnapshotStatus.PENDING)
        stale = sorted(
            (p for p in pending if p.created_at <= cutoff), key=lambda p: p.checkpoint_id
        )
        jobs.append(
            {
                "job": job.name,
                "latest_completed": _latest(latest.get(job.name), now),
                "pending": len(pending),
                "stale_pending": [_pending(p, now) for p in stale],
            }
        )
    return {
        "catalog": display_url(catalog.engine.url),
        "checked_at": now.isoformat(),
        "stale_pending_after_seconds": int(stale_pending_after.total_seconds()),
        "jobs": jobs,
        "jobs_without_completed_snapshot": [j["job"] for j in jobs if not j["latest_completed"]],
        "stale_pending_total": sum(len(j["stale_pending"]) for j in jobs),
    }


def summary_lines(report: JsonDict) -> list[str]:
    """One line per job, for the task log."""
    lines = []
    for job in report["jobs"]:
        latest = job["latest_completed"]
        head = (
            "no completed snapshot"
            if latest is None
            else f"latest checkpoint {latest['checkpoint_id']} ({latest['age_seconds']} s old)"
        )
        stale = len(job["stale_pending"])
        tail = f"; {stale} PENDING snapshot(s) past the threshold" if stale else ""
        lines.append(f"{job['job']}: {head}{tail}")
    return lines
