"""Orphan cleanup: delete files under a job's roots that no snapshot of the job knows.

Roots: the job's directory under the checkpoint root (``chk-<n>/``, ``shared/``, default
savepoints) and every savepoint directory the catalog knows for the job elsewhere. A file is an
orphan when the catalog knows no such path for the job (``known_paths``) and it was last modified
before ``older_than`` (default 3 days). Never deleted, whatever their age:

* anything under the directory of a PENDING snapshot: a checkpoint writes its data files before
  it attaches them, so while it is in flight its files are unknown to the catalog but always
  inside its own directory, which the catalog records when the snapshot begins;
* unknown files under ``shared/`` while the job has a PENDING snapshot: an incremental checkpoint
  writes its new shared files (outside its directory) before attaching them too;
* the ``_metadata`` of a COMPLETED snapshot (it is attached anyway; this guards a catalog that
  lost the row);
* anything under the directory of another job's snapshot: a savepoint directory this job used
  once (and expired) may hold another job's savepoint now.

Why that is enough: storage is listed first and the catalog read after. A file in the listing
existed before that read, and every file is written after its snapshot began, so its snapshot
was already PENDING (or further) when the catalog was read: either it is protected above or its
files are known. Under the job's file lease the catalog is read once more right before deleting,
and the files are forgotten under the lease's token first (see
:mod:`state_engine.maintenance.deletion`).

Listing is ``CheckpointStorage.list_files`` (fsspec ``find``) on the driver: one listing call per
directory level is cheap next to Spark's job start. ``spark`` is used only for very large deletes.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from state_engine.catalog import Catalog
from state_engine.faults import crash_point
from state_engine.jobs.spark_delete import SPARK_MIN_FILES, spark_deleter
from state_engine.jobs.spark_job import maintenance_job
from state_engine.maintenance.deletion import (
    THREADS,
    FileLease,
    forget_and_delete,
    hooks,
    limited,
    parse_cutoff,
    resolve_job,
    wait_seconds,
)
from state_engine.maintenance.job_storage import storage_for
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.snapshot.storage import (
    METADATA_FILE,
    SHARED_DIR,
    list_url,
    remove_empty_dirs,
)
from state_engine.snapshot_enums import SnapshotKind, SnapshotStatus

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "orphan_cleanup"
DEFAULT_OLDER_THAN = "3d"


@dataclass(frozen=True)
class Listed:
    url: str
    size: int
    modified: datetime | None


@dataclass
class OrphanPlan:
    orphans: dict[str, int] = field(default_factory=dict)
    too_young: int = 0
    unknown_age: int = 0
    protected_pending: list[str] = field(default_factory=list)
    deferred_shared: list[str] = field(default_factory=list)
    pending_dirs: list[str] = field(default_factory=list)
    pending_snapshots: list[int] = field(default_factory=list)
    other_jobs: int = 0


def savepoint_roots(catalog: Catalog, job: str, job_dir_url: str) -> list[str]:
    """The directories of the job's savepoints outside its job directory."""
    base = job_dir_url.rstrip("/")
    return sorted(
        {
            s.location.rstrip("/")
            for s in catalog.list_snapshots(job, kind=SnapshotKind.SAVEPOINT)
            if not s.location.startswith(base + "/")
        }
    )


def list_roots(catalog: Catalog, job: str, job_dir_url: str, storage: Any) -> list[Listed]:
    """Every file under the job's directory and its savepoint directories elsewhere."""
    base = job_dir_url.rstrip("/")
    found = [Listed(f"{base}/{f.path}", f.size, f.modified) for f in storage.list_files(job)]
    for root in savepoint_roots(catalog, job, job_dir_url):
        found.extend(_list_dir(root))
    return found


def other_jobs_dirs(catalog: Catalog, job: str, job_dir_url: str) -> list[str]:
    """Directories (with a trailing slash) of other jobs' snapshots inside this job's roots."""
    roots = [job_dir_url.rstrip("/"), *savepoint_roots(catalog, job, job_dir_url)]
    return sorted(
        {
            s.location.rstrip("/") + "/"
            for root in roots
            for s in catalog.snapshots_under(root)
            if s.job != job
        }
    )


def _list_dir(url: str) -> list[Listed]:
    return [Listed(f"{url}/{f.path}", f.size, f.modified) for f in list_url(url)]


def classify(
    catalog: Catalog, job: str, job_dir_url: str, listed: list[Listed], cutoff: datetime
) -> OrphanPlan:
    """Split the listing into orphans and the files kept (reading the catalog now)."""
    snapshots = catalog.list_snapshots(job)
    known = catalog.known_paths(job)
    pending = [s for s in snapshots if s.status is SnapshotStatus.PENDING]
    pending_dirs = [s.location.rstrip("/") + "/" for s in pending]
    completed_metadata = {
        s.location.rstrip("/") + "/" + METADATA_FILE
        for s in snapshots
        if s.status is SnapshotStatus.COMPLETED
    }
    shared = job_dir_url.rstrip("/") + f"/{SHARED_DIR}/"
    foreign = tuple(other_jobs_dirs(catalog, job, job_dir_url))
    plan = OrphanPlan(
        pending_dirs=[d.rstrip("/") for d in pending_dirs],
        pending_snapshots=[s.id for s in pending],
    )
    for f in listed:
        if f.url in known or f.url in completed_metadata:
            continue
        if any(f.url.startswith(d) for d in pending_dirs):
            plan.protected_pending.append(f.url)
            continue
        if foreign and f.url.startswith(foreign):
            plan.other_jobs += 1
            continue
        if pending and f.url.startswith(shared):
            plan.deferred_shared.append(f.url)
            continue
        if f.modified is None:
            plan.unknown_age += 1
            continue
        if f.modified >= cutoff:
            plan.too_young += 1
            continue
        plan.orphans[f.url] = f.size
    return plan


def _stats(plan: OrphanPlan) -> dict[str, Any]:
    return {
        "files_found": len(plan.orphans),
        "bytes_found": sum(plan.orphans.values()),
        "kept_too_young": plan.too_young,
        "kept_unknown_age": plan.unknown_age,
        "kept_pending": len(plan.protected_pending),
        "kept_other_jobs": plan.other_jobs,
        "deferred_shared": len(plan.deferred_shared),
        "pending_snapshots": plan.pending_snapshots,
    }


@maintenance_job(KIND, resolve_job)
def run(
    spark: SparkSession | None,
    catalog: Catalog,
    ctx: RunContext,
    *,
    job: str,
    older_than: Any = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
    wait: Any = False,
    spark_min_files: int = SPARK_MIN_FILES,
    threads: int = THREADS,
) -> JobResult:
    """Delete the job's unreferenced files older than ``older_than`` (``dry_run``: list them)."""
    # file times are the storage's wall clock, not the catalog's
    cutoff = parse_cutoff(older_than, datetime.fromtimestamp(time.time(), UTC))
    wait_s = wait_seconds(wait)
    storage = storage_for(catalog, job, ctx.settings)
    job_dir = storage.url_of(job)
    if dry_run:
        listed = list_roots(catalog, job, job_dir, storage)  # first: see the module docstring
        hooks.call("after_listing", KIND, job)
        plan = classify(catalog, job, job_dir, listed, cutoff)
        base = {"dry_run": True, "cutoff": cutoff.isoformat(), "files_listed": len(listed)}
        return JobResult(
            stats={
                **base,
                **_stats(plan),
                "files_deleted": 0,
                "bytes_deleted": 0,
                "would_delete": limited(
                    [{"path": p, "size": n} for p, n in sorted(plan.orphans.items())]
                ),
            }
        )
    with FileLease(catalog, job, KIND, ctx.run_id, wait=wait_s) as lease:
        # listed under the lease: a listing taken before a wait would hold files another
        # deleter removed meanwhile
        listed = list_roots(catalog, job, job_dir, storage)
        hooks.call("after_listing", KIND, job)
        plan = classify(catalog, job, job_dir, listed, cutoff)
        hooks.call("after_plan", KIND, job)
        done = forget_and_delete(
            catalog,
            lease,
            plan.orphans,
            delete=spark_deleter(spark, spark_min_files=spark_min_files, threads=threads),
        )
        crash_point("orphan_cleanup.after_delete")
        pending = [s.location for s in catalog.list_snapshots(job, status=SnapshotStatus.PENDING)]
        roots = [job_dir] + [
            posixpath.dirname(u.rstrip("/"))
            for u in {s.location for s in catalog.list_snapshots(job, kind=SnapshotKind.SAVEPOINT)}
        ]
        removed_dirs = remove_empty_dirs(
            [posixpath.dirname(u) for u in done.paths], roots, keep=pending
        )
    return JobResult(
        bytes_in=sum(f.size for f in listed),
        stats={
            "dry_run": False,
            "cutoff": cutoff.isoformat(),
            "files_listed": len(listed),
            **_stats(plan),
            "files_deleted": done.files,
            "files_already_gone": done.missing,
            "bytes_deleted": done.bytes,
            "dirs_removed": removed_dirs,
            "lease_waited": lease.waited,
            "lease_token": lease.token,
            "deleted": limited(done.paths),
        },
    )
