"""The snapshot commit protocol, written once: reserve, attach, complete, or abort.

Every writer of a snapshot goes through it: the checkpoint manager, every Spark maintenance job
and the registration of a relocated savepoint.

1. :func:`reserve`: the snapshot directory must not hold a committed ``_metadata`` (checked
   *before* the catalog row exists, so no row, PENDING or FAILED, ever points at a directory
   that another snapshot committed: cleaning up after a crash removes a reserved directory
   whole), then the job's next checkpoint id is taken by ``begin_snapshot`` (PENDING).
2. The writer writes its data files under names that are never reused.
3. :meth:`PendingCommit.attach`: the files, ``_metadata`` among them, and the key-group
   statistics are recorded while the snapshot is PENDING, in one transaction: once it
   returns, a concurrent orphan cleanup sees them as referenced.
4. :meth:`PendingCommit.complete`: ``_metadata`` is written, last of the files, then the
   catalog moves PENDING -> COMPLETED by compare-and-swap.

:meth:`PendingCommit.abort` (or :func:`abandon`, for an attempt found in the catalog) leaves
nothing of a snapshot that did not complete: the row is FAILED (optionally DISCARDED), the
catalog forgets the files in its directory (so a retry may write the same names, ``_metadata``
in a fixed savepoint directory above all) and its files are removed. A COMPLETED snapshot is
never touched. The committer imports neither Spark nor the checkpoint manager.
"""

from __future__ import annotations

import contextlib
import uuid
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from state_engine.catalog.records import FileRef, KeyGroupStatRow, SnapshotRecord
from state_engine.errors import (
    CommitConflict,
    InvalidSnapshotRequest,
    InvalidSnapshotTransition,
    LeaseError,
    StatekeeperError,
)
from state_engine.faults import crash_point
from state_engine.snapshot.metadata import SnapshotMetadata, write_metadata
from state_engine.snapshot.storage import (
    METADATA_FILE,
    CheckpointStorage,
    SnapshotDir,
    format_checksum,
)
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

if TYPE_CHECKING:
    from state_engine.catalog.repository import Catalog

FILE_LEASE_TTL_S = 120.0
#: How many checkpoint ids a writer tries before it gives up (others kept taking them).
RESERVE_ATTEMPTS = 20


def file_lease_name(job: str) -> str:
    """The lease that guards deleting a job's snapshot files (shared with expire/orphan jobs)."""
    return f"statekeeper/{job}/files"


@dataclass(frozen=True)
class PendingCommit:
    """A reserved (PENDING) snapshot: its catalog row and its directory. ``lease``: the
    writer lease (name, fencing token) its completion must still hold, if any."""

    catalog: Catalog
    record: SnapshotRecord
    snapshot: SnapshotDir
    kind: SnapshotKind
    lease: tuple[str, int] | None = None

    def attach(
        self,
        meta: SnapshotMetadata,
        stats: Iterable[KeyGroupStatRow] = (),
        *,
        metadata_bytes: bytes | None = None,
        reused: Collection[str] = (),
    ) -> tuple[int, int]:
        """Record the files of ``meta`` and its ``_metadata`` (``metadata_bytes``, default
        ``meta.to_json()``), then the key-group statistics; the snapshot stays PENDING.
        ``reused``: its files that earlier snapshots wrote; the catalog refuses one it no
        longer knows (ReusedFileMissing).

        Returns (bytes of the attached files, entries recorded): what ``complete`` would
        otherwise sum up again in SQL.
        """
        data = meta.to_json() if metadata_bytes is None else metadata_bytes
        refs = file_refs(self.snapshot, meta, data, reused)
        rows = list(stats)
        # One transaction (one BEGIN/COMMIT, not one per call): once it commits, the catalog
        # knows the files and a concurrent orphan cleanup judges them as referenced.
        with self.catalog.batch():
            self.catalog.attach_files(self.record.id, refs)
            if rows:
                self.catalog.record_key_group_stats(self.record.id, rows)
        sizes = {r.path: r.size for r in refs}
        return sum(sizes.values()), sum(r.rows for r in rows)

    def complete(
        self,
        meta: SnapshotMetadata | None,
        *,
        bytes: int | None = None,
        entries: int | None = None,
        standalone: bool = False,
    ) -> SnapshotRecord:
        """Write ``_metadata`` (unless ``meta`` is None: it is in place already), then
        PENDING -> COMPLETED by compare-and-swap; returns the COMPLETED record. ``standalone``:
        it reuses no earlier snapshot's file, so the catalog records no parent."""
        if meta is not None:
            write_metadata(self.snapshot, None, meta)
        crash_point("commit.after_metadata")
        return self.catalog.complete_snapshot(
            self.record.id,
            self.record.version,
            bytes=bytes,
            entries=entries,
            standalone=standalone,
            lease=self.lease,
        )

    def abort(
        self,
        error: BaseException | str,
        *,
        created: Sequence[str] = (),
        discard: bool = False,
        storage: CheckpointStorage | None = None,
    ) -> bool:
        """Leave nothing of this snapshot unless it COMPLETED (see :func:`abandon`)."""
        return abandon(
            self.catalog,
            self.record,
            error,
            snapshot=self.snapshot,
            created=created,
            discard=discard,
            storage=storage,
        )


def reserve(
    catalog: Catalog,
    storage: CheckpointStorage,
    job: str,
    *,
    kind: SnapshotKind,
    format: SnapshotFormat,
    parallelism: int,
    max_parallelism: int,
    trigger: str,
    savepoint_dir: str | None = None,
    parent_id: int | None = None,
    lease: tuple[str, int] | None = None,
    writer: str | None = None,
    metadata_format: str = "statekeeper",
) -> PendingCommit:
    """Take the job's next checkpoint id and its directory; the snapshot is PENDING. With
    ``lease`` (a writer lease's name and fencing token) it begins and completes only while that
    holds; ``writer`` (the lease's owner) is recorded as the run that began it;
    ``metadata_format``: whose ``_metadata`` it gets ("flink" for a rewritten Flink savepoint)."""
    if savepoint_dir is not None and kind is not SnapshotKind.SAVEPOINT:
        raise InvalidSnapshotRequest(
            f"savepoint_dir {savepoint_dir!r} given for a {kind} of job {job!r}; checkpoints "
            "live under the checkpoint root: ask for a SAVEPOINT"
        )
    for _ in range(RESERVE_ATTEMPTS):
        latest = catalog.list_snapshots(job, limit=1)
        cid = (latest[0].checkpoint_id + 1) if latest else 1
        if kind is SnapshotKind.CHECKPOINT:
            snap = storage.checkpoint(job, cid)
        else:
            snap = storage.savepoint(job, cid, savepoint_dir)
        # before the row exists: no row may ever point at a directory another snapshot committed
        if snap.has_metadata():
            raise InvalidSnapshotRequest(
                f"snapshot directory {snap.url} already holds a committed {METADATA_FILE}; "
                "snapshots are never overwritten: choose another savepoint directory"
            )
        try:
            record = catalog.begin_snapshot(
                job,
                location=snap.url,
                parallelism=parallelism,
                kind=kind,
                format=format,
                checkpoint_id=cid,
                parent_id=parent_id,
                max_parallelism=max_parallelism,
                trigger=trigger,
                writer=writer,
                lease=lease,
                metadata_format=metadata_format,
            )
        except CommitConflict:
            continue  # another writer took this checkpoint id: take the next
        return PendingCommit(catalog, record, snap, kind, lease)
    raise CommitConflict(
        f"could not reserve a checkpoint id for job {job!r}: others keep taking them; try again"
    )


def register(
    catalog: Catalog, job: str, snap: SnapshotDir, meta: SnapshotMetadata, *, trigger: str
) -> SnapshotRecord:
    """Record a committed snapshot directory the catalog does not know yet (a relocated
    savepoint) as COMPLETED: reserve its row, attach its files and ``_metadata``, complete.
    Its files are the user's: a failure only fails and discards the row."""
    record = catalog.begin_snapshot(
        job,
        location=snap.url,
        parallelism=meta.parallelism,
        kind=SnapshotKind.SAVEPOINT,
        format=meta.format,
        max_parallelism=meta.max_parallelism,
        trigger=trigger,
    )
    pending = PendingCommit(catalog, record, snap, SnapshotKind.SAVEPOINT)
    try:
        pending.attach(meta, metadata_bytes=snap.read_metadata_bytes())
        return pending.complete(None)
    except BaseException as exc:
        _fail(catalog, record, f"registering {snap.url}: {exc}", discard=True)
        raise


def abandon(
    catalog: Catalog,
    record: SnapshotRecord,
    error: BaseException | str,
    *,
    snapshot: SnapshotDir | None = None,
    created: Sequence[str] = (),
    discard: bool = False,
    storage: CheckpointStorage | None = None,
) -> bool:
    """Leave nothing of a snapshot that did not complete; False (nothing removed) if it
    COMPLETED, or if the catalog can say nothing about it.

    The row goes PENDING -> FAILED (and -> DISCARDED with ``discard``), the catalog forgets
    the files in its directory (under the job's file lease; if another deleter holds it, the
    expire job forgets them later), and its files are removed: ``created`` (snapshot-relative,
    e.g. ``../shared/`` uploads) and the whole directory, unless another live snapshot has
    that directory (a later attempt's savepoint). Each step is best effort, so the error that
    failed the snapshot is the one its writer sees.
    """
    status = _status(catalog, record.id)
    if status is SnapshotStatus.COMPLETED:
        return False
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    if status is not SnapshotStatus.FAILED:
        try:
            catalog.fail_snapshot(record.id, error=text[:2000])
        except (InvalidSnapshotTransition, CommitConflict):
            if _status(catalog, record.id) is SnapshotStatus.COMPLETED:
                return False  # its compare-and-swap won after all: the snapshot is restorable
        except StatekeeperError:
            if status is None:
                # the catalog can say nothing: the files stay (the retry or orphan cleanup
                # removes them), never the files of a snapshot that may have completed
                return False
    snap = snapshot if snapshot is not None else SnapshotDir.from_url(record.location)
    with contextlib.suppress(Exception):
        _forget_own_files(catalog, record, snap)
    if not _location_in_use(catalog, record):
        with contextlib.suppress(Exception):
            _remove(snap, created, storage)
    if discard:
        with contextlib.suppress(InvalidSnapshotTransition, CommitConflict):
            catalog.discard_snapshot(record.id)
    return True


def file_refs(
    snap: SnapshotDir,
    meta: SnapshotMetadata,
    metadata_bytes: bytes,
    reused: Collection[str] = (),
) -> list[FileRef]:
    """The catalog's references of every file ``meta`` lists (those in ``reused`` marked so),
    and of ``_metadata`` itself."""
    by_path = {f.path: f for f in meta.files}
    again = set(reused)

    def ref(path: str, **where: Any) -> FileRef:
        f = by_path[path]
        return FileRef(
            snap.url_of(path),
            f.size,
            f.checksum,
            details={"kind": str(f.kind)},
            reused=path in again,
            **where,
        )

    refs: list[FileRef] = []
    for op in meta.operators:
        for st in op.subtasks:
            first, last = st.key_group_range
            refs.extend(
                # ../ paths are files of earlier snapshots: shared by both
                ref(
                    p,
                    shared=by_path[p].shared,
                    operator=op.operator_id,
                    subtask=st.index,
                    key_group_start=first,
                    key_group_end=last,
                )
                for p in st.files
            )
        refs.extend(ref(p, operator=op.operator_id) for p in op.operator_state_files)
    refs.append(
        FileRef(
            snap.metadata_url,
            len(metadata_bytes),
            format_checksum(zlib.crc32(metadata_bytes)),
            details={"kind": METADATA_FILE},
        )
    )
    return refs


def _location_in_use(catalog: Catalog, record: SnapshotRecord) -> bool:
    """Whether another PENDING or COMPLETED snapshot has ``record``'s directory or one inside
    it (a retry of the same run into a fixed savepoint directory): then what ``record`` left
    there is orphan cleanup's. True when the catalog cannot say."""
    try:
        others = catalog.snapshots_under(record.location)
    except StatekeeperError:
        return True
    return any(
        s.id != record.id and s.status in (SnapshotStatus.PENDING, SnapshotStatus.COMPLETED)
        for s in others
    )


def _status(catalog: Catalog, snapshot_id: int) -> SnapshotStatus | None:
    try:
        return catalog.get_snapshot(snapshot_id).status
    except StatekeeperError:
        return None  # the catalog cannot say


def _fail(catalog: Catalog, record: SnapshotRecord, error: str, *, discard: bool) -> None:
    # separately: a failed first step must not leave the snapshot PENDING
    with contextlib.suppress(Exception):
        catalog.fail_snapshot(record.id, error=error[:2000])
    if discard:
        with contextlib.suppress(Exception):
            catalog.discard_snapshot(record.id)


def _forget_own_files(catalog: Catalog, record: SnapshotRecord, snap: SnapshotDir) -> None:
    """The catalog forgets the files in the snapshot's own directory (not ``shared/`` ones, nor
    earlier snapshots' files it reused), under the job's file lease if it is free."""
    base = snap.url.rstrip("/") + "/"
    own = [
        f.path
        for f in catalog.snapshot_files(record.id)
        if f.created_by_snapshot_id == record.id and not f.shared and f.path.startswith(base)
    ]
    if not own:
        return
    lease = file_lease_name(record.job)
    try:
        token = catalog.acquire_lease(
            lease, f"commit-abort-{uuid.uuid4().hex[:8]}", FILE_LEASE_TTL_S
        )
    except LeaseError:
        return  # a deleter holds it: expire forgets the released files later
    try:
        catalog.forget_files(record.job, own, lease=lease, token=token)
    finally:
        with contextlib.suppress(LeaseError):
            catalog.release_lease(lease, token)


def _remove(snap: SnapshotDir, created: Sequence[str], storage: CheckpointStorage | None) -> None:
    """Remove ``created`` (snapshot-relative, may reach ``../shared/``) and the directory."""
    for rel in created:
        snap.remove_file(rel)
    if storage is not None:
        storage.discard(snap)  # refuses a directory that looks like a job root
    else:
        snap.remove()
