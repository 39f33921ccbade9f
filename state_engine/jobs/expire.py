"""Expire: retention of a job's checkpoints (and of savepoints the user names), files included.

Iceberg's ``expire_snapshots`` rule: the COMPLETED checkpoints not among the newest
``retain_last`` and (with ``older_than``) completed before the cut-off; the latest always stays.
Under the job's file lease (:mod:`state_engine.maintenance.deletion`) they are DISCARDED, then the
files the catalog calls releasable are forgotten and deleted. Files of expired checkpoints that
the job's running writer wrote are left to it (it may build on them still). Stale PENDING
commits (``abort_pending_older_than``) are failed by compare-and-swap, a writer that completes
first wins. ``spark`` only spreads a very large deletion (:mod:`state_engine.jobs.spark_delete`)
and may be None. The rules in full are in the docs (retention).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint.writer_lease import running_writer
from state_engine.errors import (
    CommitConflict,
    InvalidJobParams,
    InvalidSnapshotTransition,
    NoSuchSnapshot,
    RetentionRemovesEverything,
)
from state_engine.faults import crash_point
from state_engine.jobs.spark_delete import SPARK_MIN_FILES, spark_deleter
from state_engine.jobs.spark_job import maintenance_job
from state_engine.maintenance.deletion import (
    THREADS,
    FileLease,
    as_aware,
    forget_and_delete,
    hooks,
    limited,
    parse_cutoff,
    resolve_job,
    wait_seconds,
)
from state_engine.maintenance.job_storage import storage_for
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.snapshot.storage import remove_empty_dirs
from state_engine.snapshot_enums import RETAINED_STATUSES, SnapshotKind, SnapshotStatus

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "expire"
RETAINED = RETAINED_STATUSES


@dataclass(frozen=True)
class ExpiryPlan:
    expire: list[SnapshotRecord]
    kept_checkpoints: list[SnapshotRecord]
    cutoff: datetime | None
    #: PENDING snapshots begun before ``pending_cutoff``: stale commits to fail
    abort: list[SnapshotRecord] = field(default_factory=list)
    pending_cutoff: datetime | None = None


def _savepoint_names(savepoints: Any) -> list[str]:
    if savepoints is None:
        return []
    if isinstance(savepoints, str | int):
        savepoints = [savepoints]
    if not isinstance(savepoints, list | tuple):
        raise InvalidJobParams(
            f"savepoints {savepoints!r} must be a list of savepoint ids or directory names"
        )
    return [str(s).strip() for s in savepoints if str(s).strip()]


def _check_retain_last(retain_last: Any) -> int | None:
    if retain_last is None:
        return None
    if isinstance(retain_last, bool) or not isinstance(retain_last, int):
        raise InvalidJobParams(f"retain_last {retain_last!r} must be an integer >= 1")
    if retain_last < 0:
        raise InvalidJobParams(f"retain_last {retain_last} is negative; use an integer >= 1")
    if retain_last == 0:
        raise RetentionRemovesEverything(
            "retain_last=0 would remove every checkpoint of the job; nothing was deleted: keep "
            "at least one (retain_last >= 1)"
        )
    return retain_last


def plan_expiry(
    catalog: Catalog,
    job: str,
    *,
    retain_last: int | None,
    older_than: Any,
    savepoints: Sequence[str],
    abort_pending_older_than: Any = None,
) -> ExpiryPlan:
    """The snapshots to expire (or a specific error); reads the catalog, changes nothing."""
    snapshots = catalog.list_snapshots(job)  # newest checkpoint id first
    now = catalog.now()
    cutoff = None if older_than is None else parse_cutoff(older_than, now)
    pending_cutoff = (
        None
        if abort_pending_older_than is None
        else parse_cutoff(abort_pending_older_than, now, "abort_pending_older_than")
    )
    completed = [
        s
        for s in snapshots
        if s.kind is SnapshotKind.CHECKPOINT and s.status is SnapshotStatus.COMPLETED
    ]
    selected: list[SnapshotRecord] = []
    if retain_last is not None or cutoff is not None:
        for rank, snap in enumerate(completed):
            if retain_last is not None and rank < retain_last:
                continue
            done = as_aware(snap.completed_at or snap.created_at)
            if cutoff is not None and done >= cutoff:
                continue
            selected.append(snap)
        if completed and len(selected) == len(completed):
            raise RetentionRemovesEverything(
                f"the retention (older_than={older_than!r}) would remove all {len(completed)} "
                f"completed checkpoints of job {job!r}, the latest "
                f"(checkpoint {completed[0].checkpoint_id}) too; nothing was deleted: add "
                "retain_last >= 1 or choose an earlier older_than"
            )
    by_name: dict[str, dict[int, SnapshotRecord]] = {}
    for s in snapshots:
        if s.kind is SnapshotKind.SAVEPOINT:
            location = s.location.rstrip("/")
            for key in (str(s.id), posixpath.basename(location), location):
                by_name.setdefault(key, {})[s.id] = s
    for name in savepoints:
        matches = by_name.get(name.rstrip("/"), {})
        if not matches:
            raise NoSuchSnapshot(
                f"job {job!r} has no savepoint {name!r} (give a savepoint's snapshot id or "
                f"directory name); nothing was deleted: list them with `statectl snapshots {job}`"
            )
        if len(matches) > 1:
            named = ", ".join(f"{s.id} ({s.location})" for s in matches.values())
            raise InvalidJobParams(
                f"savepoint {name!r} of job {job!r} could be any of snapshots {named}; nothing "
                "was deleted: name it by its snapshot id or its full location"
            )
        (savepoint,) = matches.values()
        if savepoint.status not in (SnapshotStatus.COMPLETED, SnapshotStatus.FAILED) or (
            savepoint in selected
        ):
            continue  # already expired (a retry): nothing more to do for it
        selected.append(savepoint)
    expired_ids = {s.id for s in selected}
    kept = [s for s in completed if s.id not in expired_ids]
    stale = (
        []
        if pending_cutoff is None
        else [
            s
            for s in snapshots
            if s.status is SnapshotStatus.PENDING and as_aware(s.created_at) < pending_cutoff
        ]
    )
    return ExpiryPlan(selected, kept, cutoff, stale, pending_cutoff)


def deferred_to_running_job(catalog: Catalog, job: str, plan: ExpiryPlan) -> set[str]:
    """Files of the expiring checkpoints that the job's running writer wrote: it may build on
    them still, so its own retention deletes them (see the module docstring)."""
    owner = running_writer(catalog, job)
    if owner is None:
        return set()
    return {f.path for s in plan.expire if s.writer == owner for f in catalog.snapshot_files(s.id)}


def would_release(catalog: Catalog, job: str, plan: ExpiryPlan) -> dict[str, int]:
    """Files (URL -> size) that expiring ``plan`` would delete, without changing anything."""
    going = [*plan.expire, *plan.abort]
    expired_ids = {s.id for s in going}
    remaining = [
        s for s in catalog.list_snapshots(job, status=list(RETAINED)) if s.id not in expired_ids
    ]
    still_used = {f.path for s in remaining for f in catalog.snapshot_files(s.id)}
    out = {f.path: f.size for f in catalog.releasable_files(job)}
    for s in going:
        for f in catalog.snapshot_files(s.id):
            if f.path not in still_used:
                out[f.path] = f.size
    return out


def _describe(s: SnapshotRecord) -> dict[str, Any]:
    """A snapshot as the report names it (its status as planned, before this run moved it)."""
    return {
        "id": s.id,
        "checkpoint_id": s.checkpoint_id,
        "kind": s.kind,
        "status": s.status,
        "location": s.location,
        "trigger": s.trigger,
        "created_at": s.created_at.isoformat(),
        "completed_at": s.completed_at.isoformat() if s.completed_at else None,
    }


def _abort(catalog: Catalog, snap: SnapshotRecord, run_id: str) -> bool:
    """PENDING -> FAILED by compare-and-swap on the version planned; False if its writer (or
    another run) moved it meanwhile: a snapshot that completed after all stays."""
    try:
        catalog.fail_snapshot(
            snap.id,
            expected_version=snap.version,
            error=f"aborted by expire run {run_id}: PENDING since "
            f"{as_aware(snap.created_at).isoformat()}, its writer presumed dead",
        )
        return True
    except (CommitConflict, InvalidSnapshotTransition):
        return False


def _discard(catalog: Catalog, snap: SnapshotRecord) -> bool:
    """DISCARDED by compare-and-swap; a snapshot someone else moved meanwhile is re-read once."""
    try:
        catalog.discard_snapshot(snap.id, expected_version=snap.version)
        return True
    except (CommitConflict, InvalidSnapshotTransition):
        now = catalog.get_snapshot(snap.id)
        # the job's manager subsumed it: still expire
        if now.status in (SnapshotStatus.SUBSUMED, SnapshotStatus.FAILED):
            catalog.discard_snapshot(now.id, expected_version=now.version)
            return True
        return False  # DISCARDED already, or back in use: leave it


@maintenance_job(KIND, resolve_job)
def run(
    spark: SparkSession | None,
    catalog: Catalog,
    ctx: RunContext,
    *,
    job: str,
    retain_last: int | None = None,
    older_than: Any = None,
    savepoints: Any = None,
    abort_pending_older_than: Any = None,
    dry_run: bool = False,
    wait: Any = False,
    spark_min_files: int = SPARK_MIN_FILES,
    threads: int = THREADS,
) -> JobResult:
    """Expire checkpoints by ``retain_last`` / ``older_than`` and the named ``savepoints``;
    fail the PENDING snapshots begun before ``abort_pending_older_than`` (stale commits)."""
    names = _savepoint_names(savepoints)
    retain = _check_retain_last(retain_last)
    if retain is None and older_than is None and not names and abort_pending_older_than is None:
        raise InvalidJobParams(
            "expire needs a retention: retain_last=N, older_than=<timestamp|duration>, "
            "savepoints=[...] to expire by name, or abort_pending_older_than=<duration> to fail "
            "stale commits"
        )
    wait_s = wait_seconds(wait)
    job_dir = storage_for(catalog, job, ctx.settings).url_of(job)

    def plan_now() -> ExpiryPlan:
        return plan_expiry(
            catalog,
            job,
            retain_last=retain,
            older_than=older_than,
            savepoints=names,
            abort_pending_older_than=abort_pending_older_than,
        )

    plan = plan_now()
    base: dict[str, Any] = {
        "dry_run": bool(dry_run),
        "cutoff": plan.cutoff.isoformat() if plan.cutoff else None,
        "pending_cutoff": plan.pending_cutoff.isoformat() if plan.pending_cutoff else None,
    }
    if dry_run:
        found = would_release(catalog, job, plan)
        deferred = deferred_to_running_job(catalog, job, plan) & found.keys()
        files = {p: n for p, n in found.items() if p not in deferred}
        return JobResult(
            stats={
                **base,
                "snapshots_expired": len(plan.expire),
                "would_expire": [_describe(s) for s in plan.expire],
                "pending_aborted": len(plan.abort),
                "would_abort_pending": [_describe(s) for s in plan.abort],
                "checkpoints_kept": len(plan.kept_checkpoints),
                "files_found": len(files),
                "bytes_found": sum(files.values()),
                "files_deferred_to_running_job": len(deferred),
                "files_deleted": 0,
                "bytes_deleted": 0,
                "would_delete": limited([{"path": p, "size": n} for p, n in sorted(files.items())]),
            }
        )
    with FileLease(catalog, job, KIND, ctx.run_id, wait=wait_s) as lease:
        # whatever happened while this run waited for the lease counts: decide again
        plan = plan_now()
        hooks.call("after_plan", KIND, job)
        lease.check()
        deferred = deferred_to_running_job(catalog, job, plan)  # before discarding drops refs
        aborted = [s for s in plan.abort if _abort(catalog, s, ctx.run_id)]
        expired = [s for s in plan.expire if _discard(catalog, s)]
        crash_point("expire.after_discard")
        found = {f.path: f.size for f in catalog.releasable_files(job)}
        deferred &= found.keys()
        files = {p: n for p, n in found.items() if p not in deferred}
        done = forget_and_delete(
            catalog,
            lease,
            files,
            delete=spark_deleter(spark, spark_min_files=spark_min_files, threads=threads),
        )
        pending = [s.location for s in catalog.list_snapshots(job, status=SnapshotStatus.PENDING)]
        gone = [*expired, *aborted]
        dirs = [posixpath.dirname(u) for u in done.paths] + [s.location for s in gone]
        stops = [job_dir] + [
            posixpath.dirname(s.location.rstrip("/"))
            for s in gone
            if not s.location.startswith(job_dir.rstrip("/") + "/")
        ]
        removed_dirs = remove_empty_dirs(dirs, stops, keep=pending)
    return JobResult(
        bytes_in=sum(files.values()),
        stats={
            **base,
            "snapshots_expired": len(expired),
            "expired": [_describe(s) for s in expired],
            "pending_aborted": len(aborted),
            "aborted_pending": [_describe(s) for s in aborted],
            "checkpoints_kept": len(plan.kept_checkpoints),
            "files_found": len(files),
            "bytes_found": sum(files.values()),
            "files_deferred_to_running_job": len(deferred),
            "files_deleted": done.files,
            "bytes_deleted": done.bytes,
            "files_already_gone": done.missing,
            "files_kept_in_use": len(done.skipped_live),
            "dirs_removed": removed_dirs,
            "lease_waited": lease.waited,
            "lease_token": lease.token,
            "deleted": limited(done.paths),
        },
    )
