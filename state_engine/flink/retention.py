"""Expire and orphan cleanup on Flink directories, in plain Python under the job's file lease.

``statectl maintain expire`` / ``maintain orphan_cleanup`` dispatch here for jobs of origin
``flink`` (:func:`flink_runner`); no Spark starts. Both are recorded maintenance runs that forget
in the catalog first, then delete from storage.

What the code cannot tell: Flink stores no completion time, so a checkpoint completed when its
``_metadata`` was last modified (Flink writes it last); "newest" is the higher checkpoint id within
one Flink job directory and, across the directories of a job restarted under new Flink job ids
(whose ids count from 1 again), the directory whose latest checkpoint completed last. Every
``_metadata`` on disk pins its files, imported or not. Files Flink's task managers own
(``taskowned/``, file merging's ``shared/<subdirectory>/``) are forgotten, never deleted; nor is
anything outside the job's directories or reached through a directory link. The rules in full are
in the docs (Flink retention).
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from state_engine.catalog import Catalog
from state_engine.catalog.records import JobRecord, SnapshotRecord
from state_engine.errors import (
    FlinkJobDirectoryMissing,
    FlinkMetadataError,
    InvalidJobParams,
    RetentionRemovesEverything,
)
from state_engine.faults import crash_point
from state_engine.flink.discarded import (
    Stamp,
    discarded_stamp,
    expired_details,
    metadata_stamp,
)
from state_engine.flink.import_job import referenced_files, under_any
from state_engine.flink.layout import (
    CHECKPOINT_DIR_PREFIX,
    JOB_DIR_PARTS,
    METADATA_FILE,
    ROLE_CHECKPOINTS,
    SHARED_DIR,
    TASKOWNED_DIR,
    is_checkpoint_dir,
)
from state_engine.flink.metadata import metadata_from_bytes
from state_engine.maintenance.deletion import (
    THREADS,
    FileLease,
    as_aware,
    delete_urls,
    forget_and_delete,
    hooks,
    limited,
    parse_cutoff,
    resolve_job,
    wait_seconds,
)
from state_engine.maintenance.run import JobResult, RunContext, recorded_run
from state_engine.snapshot.storage import FileStore, remove_empty_dirs
from state_engine.snapshot_enums import RETAINED_STATUSES, SnapshotKind, SnapshotStatus

EXPIRE = "expire"
ORPHAN_CLEANUP = "orphan_cleanup"
DEFAULT_OLDER_THAN = "3d"


def is_flink_job(catalog: Catalog, job: Any) -> bool:
    """Whether ``job`` names a catalog job of origin flink (False for unknown names)."""
    if not isinstance(job, str) or not job:
        return False
    try:
        return catalog.get_job(job).origin == "flink"
    except Exception:  # noqa: BLE001 - NoSuchJob and friends: not a Flink job; the job says so
        return False


def _deleted(items: list[str], nbytes: int) -> dict[str, Any]:
    """The deleted paths as a run's report lists them (cut to LIST_LIMIT), with their bytes."""
    return {**limited(items), "bytes": nbytes}


def checkpoint_dirs(catalog: Catalog, job: str) -> list[str]:
    """URLs of the job's imported checkpoint directories (``<checkpoint-dir>/<job-id>``)."""
    return [p for p, role in catalog.job_directories(job) if role == ROLE_CHECKPOINTS]


def scheduled_skips(catalog: Catalog, job: JobRecord) -> dict[str, str]:
    """Maintenance step -> why scheduled maintenance has nothing to do there for Flink job
    ``job`` whatever its policy: a job imported from savepoint directories only has no
    checkpoint directory, and savepoint directories are never cleaned of orphans."""
    if job.origin != "flink" or checkpoint_dirs(catalog, job.name):
        return {}
    return {
        ORPHAN_CLEANUP: "imported from savepoint directories only: no checkpoint directory to "
        "clean of orphans (savepoint directories are never cleaned)"
    }


def discarded_metadata(catalog: Catalog, job: str) -> dict[str, set[Stamp]]:
    """Location -> stamps of the ``_metadata`` files the job's DISCARDED snapshots were
    discarded with: a ``_metadata`` there pins nothing only if it is one of these."""
    out: dict[str, set[Stamp]] = {}
    for snap in catalog.list_snapshots(job, status=SnapshotStatus.DISCARDED):
        stamp = discarded_stamp(snap)
        if stamp is not None:
            out.setdefault(snap.location, set()).add(stamp)
    return out


def _is_discarded(
    store: FileStore, path: str, location: str, discarded: dict[str, set[Stamp]]
) -> bool:
    stamps = discarded.get(location)
    # a stat only where a discarded snapshot was
    return stamps is not None and metadata_stamp(store, path) in stamps


def disk_checkpoints(
    catalog: Catalog, job: str, discarded: dict[str, set[Stamp]]
) -> dict[str, tuple[dict[str, int], bool]]:
    """Every ``chk-N`` with a ``_metadata`` under the job's checkpoint directories, read now:
    its location URL -> (the files it references (URL -> size), ``_metadata`` included; whether
    that ``_metadata`` is one the catalog discarded)."""
    out: dict[str, tuple[dict[str, int], bool]] = {}
    for root_url in checkpoint_dirs(catalog, job):
        store, root = FileStore.at(root_url)
        root = root.rstrip("/")
        for path in store.glob(f"{root}/{CHECKPOINT_DIR_PREFIX}*/{METADATA_FILE}"):
            if not is_checkpoint_dir(posixpath.basename(posixpath.dirname(path))):
                continue
            location = store.url_of(posixpath.dirname(path))
            dead = _is_discarded(store, path, location, discarded)
            out[location] = (_refs_of(store, path, root), dead)
    return out


def _refs_of(
    store: FileStore, path: str, root: str, files: set[str] | None = None
) -> dict[str, int]:
    def exists(loc: str) -> bool:
        stripped = store.path_of(loc)
        if files is not None and stripped.startswith(root + "/"):
            return stripped in files
        return store.exists(stripped)  # outside the listing (a NO_CLAIM ancestor's file)

    try:
        meta = metadata_from_bytes(store.read_bytes(path), path, job_dir=root, exists=exists)
    except FlinkMetadataError as exc:
        raise FlinkMetadataError(
            f"{exc}; nothing was deleted (a checkpoint that cannot be read might reference any "
            "file)"
        ) from None
    return {path: size for path, (size, _) in referenced_files(meta, store).items()}


def links_to_keep(
    candidates: Iterable[str], referenced: Iterable[str], roots: list[str]
) -> set[str]:
    """The candidate URLs (to delete) that must stay on local storage: in a directory whose real
    path is outside every root (the local walk follows directory links: a ``shared/`` linked to
    another job's), or another spelling of a referenced file (the same real path). Deleting a
    file link removes only the link, so only directories are resolved: one ``realpath`` per
    directory, a string test per file. Object stores have no links: nothing to keep there."""
    by_dir: dict[str, list[str]] = {}
    for url in candidates:
        by_dir.setdefault(url.rpartition("/")[0], []).append(url)
    if not by_dir or not roots:
        return set()
    store, _ = FileStore.at(roots[0])
    if not store.is_local:
        return set()
    real_dirs: dict[str, str] = {}

    def real_dir(dir_url: str) -> str:
        if dir_url not in real_dirs:
            real_dirs[dir_url] = os.path.realpath(store.path_of(dir_url)).rstrip("/") + "/"
        return real_dirs[dir_url]

    real_roots = tuple(real_dir(r.rstrip("/")) for r in roots)
    referenced_real = set()
    for url in referenced:
        if store.handles(url):
            head, _, name = url.rpartition("/")
            referenced_real.add(real_dir(head) + name)
    keep: set[str] = set()
    for dir_url, urls in by_dir.items():
        where = real_dir(dir_url)
        if not where.startswith(real_roots):
            keep.update(urls)
        elif referenced_real:
            keep.update(u for u in urls if where + u.rpartition("/")[2] in referenced_real)
    return keep


# --- expire ---


@dataclass
class ExpirePlan:
    expired: list[Any] = field(default_factory=list)  # SnapshotRecords to discard
    files: dict[str, int] = field(default_factory=dict)  # URL -> size, inside the job's dirs
    foreign: list[str] = field(default_factory=list)  # released, outside: reported, kept
    #: the released ones outside whose catalog rows this job holds (a changelog backend's files
    #: in the cluster's changelog directory): forgotten, kept
    foreign_forgotten: list[str] = field(default_factory=list)
    #: released, owned by Flink's task managers (see the module doc): forgotten, kept
    left_to_flink: list[str] = field(default_factory=list)
    dead_dirs: list[str] = field(default_factory=list)  # expired/discarded snapshot dirs
    links_kept: list[str] = field(default_factory=list)  # see links_to_keep
    #: catalog rows only dead snapshots reference whose path a checkpoint on disk (not imported
    #: yet: new where an expired one was) references now: forgotten, the file kept
    forget_only: list[str] = field(default_factory=list)


def _metadata_of(snap: SnapshotRecord) -> tuple[FileStore, str]:
    """The store and path of ``snap``'s ``_metadata``."""
    return FileStore.at(snap.location.rstrip("/") + "/" + METADATA_FILE)


def completed_at(snap: SnapshotRecord) -> float:
    """When Flink completed ``snap`` (epoch seconds): its ``_metadata``'s modification time, else
    the catalog's completion (import) time."""
    try:
        store, path = _metadata_of(snap)
        modified = store.modified(path)
    except (FileNotFoundError, OSError):
        modified = None
    if modified is not None:
        return modified.timestamp()
    done = snap.completed_at or snap.created_at
    return float(as_aware(done).timestamp())


def newest_first(checkpoints: list[SnapshotRecord]) -> list[SnapshotRecord]:
    """Checkpoints newest first: by checkpoint id within one Flink job directory (one run), and
    the runs by when their latest checkpoint completed, since a restarted job (a new Flink job id)
    counts its checkpoint ids from 1 again."""
    runs: dict[str, list[SnapshotRecord]] = {}
    for snap in checkpoints:
        runs.setdefault(posixpath.dirname(snap.location.rstrip("/")), []).append(snap)
    for run in runs.values():
        run.sort(key=lambda s: -s.checkpoint_id)
    latest_first = sorted(runs.items(), key=lambda kv: (-completed_at(kv[1][0]), kv[0]))
    return [snap for _, run in latest_first for snap in run]


def savepoint_named(completed: list[SnapshotRecord], want: str, job: str) -> SnapshotRecord:
    """The COMPLETED savepoint ``--savepoint want`` names: its directory name, catalog snapshot
    id or Flink savepoint id. A name two readings give different snapshots is refused: deleting
    the wrong savepoint cannot be undone."""
    readings = {
        "the directory name": [
            s for s in completed if posixpath.basename(s.location.rstrip("/")) == want
        ],
        "the snapshot id": [s for s in completed if str(s.id) == want],
        "the Flink savepoint id": [
            s
            for s in completed
            if s.kind is SnapshotKind.SAVEPOINT and str(s.checkpoint_id) == want
        ],
    }
    matched = {s.id: s for found in readings.values() for s in found}
    if len(matched) > 1:
        meanings = "; ".join(
            f"{reading} of snapshot {s.id} ({s.kind.lower()} {s.checkpoint_id} at {s.location})"
            for reading, found in readings.items()
            for s in found
        )
        raise InvalidJobParams(
            f"--savepoint {want!r} is ambiguous for Flink job {job!r}: it is {meanings}; nothing "
            "was deleted: give the savepoint's directory name (`statectl snapshots JOB` lists them)"
        )
    snap = next(iter(matched.values()), None)
    if snap is None or snap.kind is not SnapshotKind.SAVEPOINT:
        raise InvalidJobParams(
            f"--savepoint {want!r} is not a COMPLETED savepoint of Flink job {job!r} (give "
            "its directory name, snapshot id or Flink savepoint id; `statectl snapshots JOB` "
            "lists them)"
        )
    return snap


def _expire_plan(
    catalog: Catalog,
    job: str,
    retain_last: int | None,
    savepoints: list[str],
    dirs: list[str],
    cutoff: datetime | None = None,
) -> ExpirePlan:
    plan = ExpirePlan()
    completed = catalog.list_snapshots(job, status=SnapshotStatus.COMPLETED)
    checkpoints = newest_first([s for s in completed if s.kind is SnapshotKind.CHECKPOINT])
    if retain_last is not None or cutoff is not None:
        selected = checkpoints[retain_last or 0 :]
        if cutoff is not None:
            limit = cutoff.timestamp()
            selected = [s for s in selected if completed_at(s) < limit]
        if checkpoints and len(selected) == len(checkpoints):
            raise RetentionRemovesEverything(
                f"the retention would remove all {len(checkpoints)} completed checkpoints of "
                f"Flink job {job!r}, the latest (checkpoint {checkpoints[0].checkpoint_id}) too; "
                "nothing was deleted: add --retain-last N (N >= 1) or choose an earlier "
                "--older-than"
            )
        # the newest checkpoint always stays (a running job's next checkpoint builds on it)
        plan.expired.extend(s for s in selected if s is not checkpoints[0])
    for want in savepoints:
        plan.expired.append(savepoint_named(completed, str(want), job))
    expired_ids = {s.id for s in plan.expired}
    retained = [
        s for s in catalog.list_snapshots(job, status=RETAINED_STATUSES) if s.id not in expired_ids
    ]
    live: set[str] = set()
    for s in retained:
        live.update(f.path for f in catalog.snapshot_files(s.id))
    # and what other jobs' snapshots reference (a NO_CLAIM or LEGACY child of this job)
    live |= catalog.paths_referenced_elsewhere(job)
    discarded = discarded_metadata(catalog, job)
    on_disk = disk_checkpoints(catalog, job, discarded)
    # Dead: the checkpoints expired now, and those whose _metadata on disk is the very file the
    # catalog discarded (an earlier run was interrupted before deleting it). Any other checkpoint
    # on disk -- written since the last import, or new where a discarded one was -- pins its files.
    expiring = {s.location for s in plan.expired}
    dead = expiring | {loc for loc, (_, is_discarded) in on_disk.items() if is_discarded}
    on_disk_live: set[str] = set()
    for location, (refs, _) in on_disk.items():
        if location not in dead:
            on_disk_live.update(refs)
    catalog_live = set(live)
    live |= on_disk_live
    candidates: dict[str, int] = {}
    for s in plan.expired:
        for f in catalog.snapshot_files(s.id):
            candidates[f.path] = f.size
    # What an earlier, interrupted expire released (or forgot) but did not delete yet.
    for released in catalog.releasable_files(job):
        candidates.setdefault(released.path, released.size)
    for location, (refs, _) in on_disk.items():
        if location in dead:
            for url, size in refs.items():
                candidates.setdefault(url, size)
    plan.forget_only = sorted(u for u in candidates if u in on_disk_live and u not in catalog_live)
    candidates = {u: n for u, n in candidates.items() if u not in live}
    plan.dead_dirs = sorted(d for d in expiring | set(discarded) if under_any(d, dirs))
    linked = links_to_keep([u for u in candidates if under_any(u, dirs)], live, dirs)
    plan.links_kept = sorted(linked)
    task_owned = tuple(f"{d.rstrip('/')}/{TASKOWNED_DIR}/" for d in dirs)
    shared = tuple(f"{d.rstrip('/')}/{SHARED_DIR}/" for d in dirs)
    for url, size in sorted(candidates.items()):
        if not under_any(url, dirs):
            plan.foreign.append(url)
        elif url.startswith(task_owned) or any(
            url.startswith(d) and "/" in url[len(d) :] for d in shared
        ):
            plan.left_to_flink.append(url)
        elif url not in linked:
            plan.files[url] = size
    if plan.foreign:
        # Released files outside the job's directories are never deleted; the rows this job holds
        # go (Flink drops a changelog's files itself), or every later expire finds them again. An
        # ancestor job's files stay its own.
        owners = catalog.path_owners(plan.foreign)
        plan.foreign_forgotten = [u for u in plan.foreign if owners.get(u) == job]
    return plan


def expire_body(
    catalog: Catalog,
    ctx: RunContext,
    *,
    job: str,
    retain_last: int | None = None,
    savepoints: list[str] | None = None,
    older_than: Any = None,
    dry_run: bool = False,
    wait: Any = False,
    threads: int = THREADS,
    **_: Any,
) -> JobResult:
    """Expire old checkpoints (and named savepoints) of a Flink job; see the module doc."""
    if retain_last is None and older_than is None and not savepoints:
        raise InvalidJobParams(
            "say what to expire: --retain-last N, --older-than AGE and/or --savepoint ID_OR_NAME"
        )
    if retain_last is not None and (
        isinstance(retain_last, bool) or not isinstance(retain_last, int) or retain_last < 1
    ):
        raise InvalidJobParams(f"--retain-last {retain_last!r}: keep at least 1 checkpoint")
    cutoff = (
        None
        if older_than is None
        else parse_cutoff(older_than, datetime.fromtimestamp(time.time(), UTC))
    )
    dirs = [p for p, _ in catalog.job_directories(job)]
    if dry_run:
        plan = _expire_plan(catalog, job, retain_last, list(savepoints or []), dirs, cutoff)
        return JobResult(stats=_expire_stats(plan, True, sorted(plan.files), 0))
    with FileLease(catalog, job, EXPIRE, ctx.run_id, wait=wait_seconds(wait)) as lease:
        plan = _expire_plan(catalog, job, retain_last, list(savepoints or []), dirs, cutoff)
        hooks.call("after_plan", EXPIRE, job)
        for snap in plan.expired:
            lease.check()
            # what its _metadata is: a later run tells it from a new checkpoint at its location
            stamp = metadata_stamp(*_metadata_of(snap))
            catalog.discard_snapshot(
                snap.id,
                error="expired" if stamp else "expired; its _metadata was already gone",
                details=expired_details(stamp),
            )
        crash_point("flink.expire.after_discard")
        # the files stay where they are
        forget = plan.forget_only + plan.left_to_flink + plan.foreign_forgotten
        if forget:
            lease.check()
            catalog.forget_files(job, forget, lease=lease.name, token=lease.held_token)
        done = forget_and_delete(catalog, lease, plan.files, threads=threads)
        removed = remove_empty_dirs(
            [posixpath.dirname(u) for u in done.paths] + plan.dead_dirs,
            dirs,
            keep=[s.location for s in catalog.list_snapshots(job, status=SnapshotStatus.PENDING)],
        )
    return JobResult(
        bytes_in=sum(plan.files.values()),
        stats={**_expire_stats(plan, False, done.paths, done.bytes), "dirs_removed": removed},
    )


def _expire_stats(
    plan: ExpirePlan, dry_run: bool, deleted: list[str], nbytes: int
) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "origin": "flink",
        "expired": [
            {"snapshot_id": s.id, "checkpoint_id": s.checkpoint_id, "kind": s.kind}
            for s in plan.expired
        ],
        "files_deleted": 0 if dry_run else len(deleted),
        "bytes_deleted": nbytes,
        "would_delete_bytes": sum(plan.files.values()),
        "foreign_kept": plan.foreign,
        # files Flink's task managers own: forgotten, kept (Flink and orphan cleanup drop them)
        "left_to_flink": plan.left_to_flink,
        "links_kept": plan.links_kept,
        # paths a checkpoint written since (where an expired one was) owns now: kept on disk,
        # forgotten by the catalog, which the next sync imports them into
        "forgotten_for_new_checkpoints": plan.forget_only,
        "deleted": _deleted(list(deleted), nbytes),
    }


# --- orphan cleanup ---


@dataclass
class OrphanPlan:
    listed: int = 0
    orphans: dict[str, int] = field(default_factory=dict)  # URL -> size
    too_new: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)  # chk-N without _metadata
    links_kept: list[str] = field(default_factory=list)  # see links_to_keep
    referenced: int = 0


def _orphan_plan(catalog: Catalog, job: str, dirs: list[str], cutoff: datetime) -> OrphanPlan:
    plan = OrphanPlan()
    own = [p for p, _ in catalog.job_directories(job)]
    # an expired checkpoint whose _metadata survived a crash pins nothing; a new one there does
    discarded = discarded_metadata(catalog, job)
    referenced: set[str] = set(catalog.live_paths(job))
    listed: dict[str, tuple[int, float]] = {}
    for root_url in dirs:
        store, root = FileStore.at(root_url)
        root = root.rstrip("/")
        if not store.exists(root):
            raise FlinkJobDirectoryMissing(
                f"the checkpoint directory {root_url} of Flink job {job!r} is gone; nothing was "
                "deleted and its snapshots are kept: run it again once the directory is back"
            )
        to_url = store.url_of
        found = store.find(root)
        files = {f"{root}/{f.path}" for f in found}
        now = time.time()
        heads: dict[str, bool] = {}  # first path component -> Flink's to clean?
        chk_heads: set[str] = set()
        for f in found:
            head, sep, _ = f.path.partition("/")
            if not sep:
                continue  # a file directly in the job directory: not Flink's
            keep = heads.get(head)
            if keep is None:
                is_chk = is_checkpoint_dir(head)
                keep = heads[head] = head in JOB_DIR_PARTS or is_chk
                if is_chk:
                    chk_heads.add(head)
            if keep:  # only chk-*/, shared/, taskowned/ are Flink's to clean
                # unknown age: treat as new, never delete
                mtime = f.modified_at if f.modified_at is not None else now
                listed[to_url(f"{root}/{f.path}")] = (f.size, mtime)
        # Every completed checkpoint on disk now, imported or not, pins its files.
        for head in sorted(chk_heads):
            path = f"{root}/{head}/{METADATA_FILE}"
            if path not in files:
                plan.in_flight.append(to_url(f"{root}/{head}"))
            elif not _is_discarded(store, path, to_url(f"{root}/{head}"), discarded):
                referenced.update(_refs_of(store, path, root, files))
    plan.listed = len(listed)
    plan.referenced = len(referenced)
    plan.foreign = sorted(u for u in referenced if not under_any(u, own))
    limit = cutoff.timestamp()
    orphans = []
    for url, (_size, mtime) in listed.items():
        if url in referenced:
            continue
        if mtime >= limit:
            plan.too_new.append(url)
        else:
            orphans.append(url)
    linked = links_to_keep(orphans, referenced, dirs)
    plan.links_kept = sorted(linked)
    orphans = sorted(u for u in orphans if u not in linked)
    plan.too_new.sort()
    plan.orphans = {u: int(listed[u][0]) for u in orphans}
    return plan


def _empty_chk_dirs(dirs: list[str], cutoff: datetime) -> list[str]:
    """Empty ``chk-N`` directories last modified before the cut-off (an earlier run emptied
    them; a newer empty one may be a checkpoint Flink just started)."""
    out = []
    limit = cutoff.timestamp()
    for root_url in dirs:
        store, root = FileStore.at(root_url)
        for entry in store.ls(root.rstrip("/")):
            name = posixpath.basename(entry.path)
            if not entry.is_dir or not is_checkpoint_dir(name):
                continue
            # unknown age: treat as new, never delete
            mtime = entry.modified.timestamp() if entry.modified is not None else time.time()
            if mtime < limit and store.is_empty_dir(entry.path):
                out.append(store.url_of(entry.path))
    return out


def _head(path: str, root: str) -> str:
    return path[len(root) + 1 :].split("/", 1)[0] if path.startswith(root + "/") else ""


def orphan_body(
    catalog: Catalog,
    ctx: RunContext,
    *,
    job: str,
    older_than: Any = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
    wait: Any = False,
    threads: int = THREADS,
    **_: Any,
) -> JobResult:
    """Delete unreferenced files under a Flink job's checkpoint directories; see the module doc."""
    cutoff = parse_cutoff(older_than, datetime.fromtimestamp(time.time(), UTC))
    dirs = checkpoint_dirs(catalog, job)
    if not dirs:
        raise InvalidJobParams(
            f"Flink job {job!r} has no imported checkpoint directory; orphan cleanup works on "
            "<checkpoint-dir>/<job-id> directories (savepoint directories are never cleaned)"
        )
    if dry_run:
        plan = _orphan_plan(catalog, job, dirs, cutoff)
        return JobResult(stats=_orphan_stats(plan, cutoff, True, sorted(plan.orphans), 0, 0))
    with FileLease(catalog, job, ORPHAN_CLEANUP, ctx.run_id, wait=wait_seconds(wait)) as lease:
        plan = _orphan_plan(catalog, job, dirs, cutoff)
        hooks.call("after_plan", ORPHAN_CLEANUP, job)
        known = catalog.known_paths(job)
        in_catalog = {u: n for u, n in plan.orphans.items() if u in known}
        unknown = [u for u in plan.orphans if u not in known]
        done = forget_and_delete(catalog, lease, in_catalog, threads=threads)
        lease.check()
        gone = delete_urls(unknown, threads=threads)
        crash_point("flink.orphan_cleanup.after_delete")
        deleted = sorted(set(done.paths) | gone)
        removed = remove_empty_dirs(
            [posixpath.dirname(u) for u in deleted] + _empty_chk_dirs(dirs, cutoff),
            dirs,
            keep=[s.location for s in catalog.list_snapshots(job, status=SnapshotStatus.PENDING)],
        )
    nbytes = sum(plan.orphans[u] for u in deleted)
    return JobResult(
        bytes_in=sum(plan.orphans.values()),
        stats={**_orphan_stats(plan, cutoff, False, deleted, nbytes, removed)},
    )


def _orphan_stats(
    plan: OrphanPlan, cutoff: datetime, dry_run: bool, deleted: list[str], nbytes: int, dirs: int
) -> dict[str, Any]:
    return {
        "dry_run": dry_run,
        "origin": "flink",
        "cutoff": cutoff.isoformat(),
        "files_listed": plan.listed,
        "files_referenced": plan.referenced,
        "orphans": len(plan.orphans),
        "orphan_bytes": sum(plan.orphans.values()),
        "files_deleted": 0 if dry_run else len(deleted),
        "bytes_deleted": nbytes,
        "dirs_removed": dirs,
        "too_new": plan.too_new,
        "checkpoints_without_metadata": plan.in_flight,
        "foreign_references": plan.foreign,
        "links_kept": plan.links_kept,
        "deleted": _deleted(list(deleted), nbytes),
    }


flink_expire = recorded_run(EXPIRE, resolve_job)(expire_body)
flink_orphan_cleanup = recorded_run(ORPHAN_CLEANUP, resolve_job)(orphan_body)
RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    EXPIRE: flink_expire,
    ORPHAN_CLEANUP: flink_orphan_cleanup,
}


def flink_runner(
    catalog: Catalog, kind: str, params: dict[str, Any]
) -> Callable[..., dict[str, Any]] | None:
    """The Flink runner of maintenance ``kind`` if ``params["job"]`` is a Flink job, else None."""
    if kind not in RUNNERS or not is_flink_job(catalog, params.get("job")):
        return None
    return RUNNERS[kind]


def run_maintenance(
    catalog: Catalog, kind: str, settings: Any = None, **params: Any
) -> dict[str, Any]:
    """Run ``kind`` on a Flink job; the report's ``deleted`` is also at its top level."""
    runner = RUNNERS[kind]
    report = runner(catalog, settings=settings, **params)
    stats = report.get("stats") or {}
    if "deleted" in stats:
        report = {**report, "deleted": stats["deleted"]}
    return report
