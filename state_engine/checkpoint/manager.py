"""The checkpoint manager: two-phase snapshots of a job's subtasks, registered in the catalog.

``trigger`` runs the synchronous phase on the caller's (task) thread: every backend fixes a view
and operator-state rows are copied. The asynchronous phase runs on the manager's checkpoint
thread (one snapshot at a time, in trigger order) while processing continues: data files, then
the catalog attachments and key-group stats (still PENDING, so orphan cleanup keeps its hands off),
then ``_metadata``, then PENDING -> COMPLETED by compare-and-swap, last of all. Afterwards
checkpoints beyond ``retained`` are subsumed and the files the catalog then calls releasable are
deleted from storage (under the job's file lease) and forgotten.

A failed or cancelled snapshot leaves nothing behind: its new files are removed, the catalog row
ends DISCARDED.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from state_engine.backends.base import KeyedStateBackend
from state_engine.catalog.records import FileRecord, KeyGroupStatRow, SnapshotRecord
from state_engine.catalog.repository import Catalog
from state_engine.checkpoint.commit import (
    FILE_LEASE_TTL_S,
    PendingCommit,
    file_lease_name,
    reserve,
)
from state_engine.checkpoint.forked import ForkedWrite, can_fork, reap_exited
from state_engine.checkpoint.restore import restore_snapshot
from state_engine.checkpoint.spool import Spool, spool_for
from state_engine.checkpoint.state import (
    RestoredState,
    RestoreMode,
    StateBackendFactory,
    SubtaskState,
)
from state_engine.checkpoint.writer_lease import WriterLease
from state_engine.collector import collector_paused
from state_engine.errors import (
    CheckpointError,
    CommitConflict,
    InvalidSnapshotRequest,
    InvalidSnapshotTransition,
    LeaseError,
    MissingSnapshotFile,
    ReusedFileMissing,
    SnapshotCancelled,
    StatekeeperError,
)
from state_engine.faults import crash_point
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.snapshot.canonical import (
    DEFAULT_ROW_GROUP_BYTES,
    KeyGroupStats,
    write_operator_state,
)
from state_engine.snapshot.metadata import (
    OPERATOR_STATE_PREFIX,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
    operator_state_key,
)
from state_engine.snapshot.registry import SharedStateRegistry
from state_engine.snapshot.storage import SHARED_PREFIX, CheckpointStorage, SnapshotDir
from state_engine.snapshot.strategy import (
    CanonicalSnapshotStrategy,
    Capture,
    ClaimingStrategy,
    SnapshotStrategy,
    SubtaskResult,
    WriteContext,
)
from state_engine.snapshot_enums import FORMAT_OPTIONS, SnapshotFormat, SnapshotKind, SnapshotStatus

_log = logging.getLogger(__name__)


@dataclass
class SnapshotStats:
    """What one snapshot cost: bytes and files written now, files referenced from before."""

    bytes_written: int = 0
    files_written: int = 0
    files_reused: int = 0
    entries: int = 0
    full_bytes: int = 0
    sync_ms: float = 0.0
    async_ms: float = 0.0
    #: who wrote the files: "thread" (the checkpoint thread), "fork" (a child forked at the
    #: barrier) or "fork-spool" (such a child, into a local spool the thread then uploaded)
    writer: str = "thread"
    #: why subsuming older checkpoints after this one completed failed (retried after the next
    #: completion); the checkpoint itself is COMPLETED either way
    retention_error: str | None = None


@dataclass
class _Job:
    commit: PendingCommit
    record: SnapshotRecord
    snapshot: SnapshotDir
    kind: SnapshotKind
    format: SnapshotFormat
    parallelism: int
    captures: list[Capture[Any]]
    operator_rows: dict[str, dict[int, tuple[list[Any], dict[str, dict[str, Any]]]]]
    incremental: bool
    parent: SnapshotRecord | None
    ctx: WriteContext
    stats: SnapshotStats = field(default_factory=SnapshotStats)
    catalog_totals: tuple[int, int] = (0, 0)  # bytes of the attached files, entries recorded
    committed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the forked child writing the files (heap views), started at the barrier
    child: ForkedWrite[Any] | None = None
    #: where that child writes when the snapshot is on an object store (uploaded afterwards)
    spool: Spool | None = None
    started: bool = False  # the checkpoint thread took the job up


class PendingSnapshot:
    """A snapshot whose asynchronous phase runs (or waits to run) on the checkpoint thread."""

    def __init__(self, job: _Job, future: Future[SnapshotRecord]) -> None:
        self._job = job
        self._future = future
        self.checkpoint_id = job.record.checkpoint_id
        self.snapshot_id = job.record.id
        self.kind = str(job.kind)
        self.location = job.snapshot.url

    @property
    def stats(self) -> SnapshotStats:
        return self._job.stats

    def result(self, timeout: float | None = None) -> SnapshotRecord:
        """The COMPLETED catalog record; raises what failed the snapshot (SnapshotCancelled...)."""
        try:
            return self._future.result(timeout)
        except CancelledError as exc:
            raise SnapshotCancelled(
                f"snapshot {self.location} (checkpoint {self.checkpoint_id}) was cancelled "
                "before it started writing; nothing of it is kept: trigger a new one"
            ) from exc

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        """Stop the snapshot; True unless it already committed. Its files are removed and its
        catalog row ends DISCARDED once the checkpoint thread has stopped it."""
        with self._job.lock:
            if self._job.committed:
                return False
            self._job.ctx.cancelled.set()
            return True

    def __repr__(self) -> str:
        return f"PendingSnapshot({self.kind} {self.checkpoint_id} at {self.location})"


class CheckpointManager:
    """Checkpoints and savepoints of one job, and restores of them at any parallelism.

    ``format``: ``canonical`` (full Parquet), ``native`` (RocksDB files; with ``incremental``
    SSTs are uploaded once into ``shared/``; heap backends are written canonical), ``delta``
    (heap incremental: deltas on a canonical base, a new base every ``full_every`` deltas;
    RocksDB backends are written canonical).

    ``fork_writer``: heap snapshots on local storage are written by a child process forked at the
    barrier (see :mod:`state_engine.checkpoint.forked`), so the job keeps its core and copies no
    state on write; False writes them on the checkpoint thread from a copy-on-write view.

    ``chain_in_flight``: for overlapping checkpoints, a heap delta continues the chain of the
    checkpoint still in flight before it (holding only the changes since; it fails if that one
    fails) instead of the last completed one's (holding every change not confirmed yet).

    ``writer_lease``: the job's writer lease this manager's run holds (a JobRunner passes it; see
    :mod:`state_engine.checkpoint.writer_lease`): once lost, no snapshot begins; released on
    :meth:`close`.
    """

    def __init__(
        self,
        catalog: Catalog,
        storage: CheckpointStorage | str,
        job: str,
        *,
        max_parallelism: int,
        parallelism: int,
        format: str = "canonical",
        retained: int = 3,
        incremental: bool = False,
        full_every: int = 8,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        verify_checksums: bool = False,
        fork_writer: bool = True,
        chain_in_flight: bool = False,
        writer_lease: WriterLease | None = None,
    ) -> None:
        if format not in FORMAT_OPTIONS:
            raise InvalidSnapshotRequest(
                f"checkpoint format {format!r} of job {job!r} is unknown; use one of "
                f"{', '.join(FORMAT_OPTIONS)}"
            )
        if retained < 1 or full_every < 1:
            raise InvalidSnapshotRequest(
                f"retained ({retained}) and full_every ({full_every}) of job {job!r} must be >= 1"
            )
        self.catalog = catalog
        self.storage = (
            storage if isinstance(storage, CheckpointStorage) else CheckpointStorage(storage)
        )
        self.job = self.storage.job_dir(job)
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self.format = format
        self.retained = retained
        self.incremental = incremental or format == SnapshotFormat.DELTA.option
        self.full_every = full_every
        self.row_group_bytes = row_group_bytes
        self.verify_checksums = verify_checksums
        self.fork_writer = fork_writer
        self.chain_in_flight = chain_in_flight
        self.writer_lease = writer_lease
        self.registry = SharedStateRegistry()
        self.job_record = catalog.register_job(
            job, max_parallelism=max_parallelism, location=self.storage.url_of(self.job)
        )
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-{job}")
        self._owned: dict[int, SnapshotRecord] = {}  # snapshot id -> completed checkpoint
        self._last_completed: SnapshotRecord | None = None
        self._force_full = False
        self._registered_states: dict[tuple[str, str], Any] = {}
        self._closed = False
        # what completed checkpoints' strategies do on the task thread (checkpoint id, hook)
        self._to_confirm: list[tuple[int, Callable[[], None]]] = []
        self._in_flight: dict[int, _Job] = {}

    # --- snapshots ---

    def trigger(
        self,
        subtasks: Sequence[SubtaskState],
        *,
        kind: str = SnapshotKind.CHECKPOINT,
        savepoint_dir: str | None = None,
        trigger: str = "periodic",
        format: str | None = None,
    ) -> PendingSnapshot:
        """The synchronous phase; returns once every backend fixed its view."""
        started = time.perf_counter()
        kind_ = self._check_kind(kind, savepoint_dir)
        fmt = self._format_for(kind_, format)
        parallelism = self._check_subtasks(subtasks)
        strategies = self._strategies(subtasks, fmt)
        # the last completed checkpoint, read with the completions confirmed up to it: what
        # the strategies build on (another may complete meanwhile on the checkpoint thread)
        last = self._confirm_completed()
        incremental = (
            kind_ is SnapshotKind.CHECKPOINT
            and fmt is not SnapshotFormat.CANONICAL
            and self.incremental
            and not self._force_full
        )
        parent = last if incremental else None
        commit = self._begin(kind_, fmt, parallelism, savepoint_dir, trigger, parent)
        record, snap = commit.record, commit.snapshot
        ctx = WriteContext(
            snapshot=snap,
            checkpoint_id=record.checkpoint_id,
            savepoint=kind_ is SnapshotKind.SAVEPOINT,
            incremental=incremental,
            cancelled=threading.Event(),
            registry=self.registry,
            row_group_bytes=self.row_group_bytes,
            full_every=self.full_every,
            chain_in_flight=self.chain_in_flight,
        )
        captures: list[Capture[Any]] = []
        try:
            for st in subtasks:
                for uid in sorted(st.keyed):
                    strategy = strategies.get((st.subtask_index, uid))
                    backend = st.keyed[uid]
                    captures.append(
                        self._capture(strategy, uid, st.subtask_index, backend, fmt, record, ctx)
                    )
            operator_rows = {
                uid: {
                    st.subtask_index: (
                        list(st.operator[uid].snapshot_rows()),
                        {n: m.to_dict() for n, m in st.operator[uid].state_meta().items()},
                    )
                    for st in subtasks
                    if uid in st.operator
                }
                for uid in sorted({u for st in subtasks for u in st.operator})
            }
        except BaseException as exc:
            # as when the asynchronous phase fails: the views go, and each capture is marked
            # failed, so no later delta continues a chain this checkpoint never wrote
            self._release(captures)
            for c in captures:
                c.abandon()
            self._abandon(commit, exc)
            raise
        job = _Job(
            commit=commit,
            record=record,
            snapshot=snap,
            kind=kind_,
            format=fmt,
            parallelism=parallelism,
            captures=captures,
            operator_rows=operator_rows,
            incremental=incremental,
            parent=parent,
            ctx=ctx,
        )
        fork = self.fork_writer and can_fork(snap)
        if fork and captures and all(c.forkable for c in captures):
            self._fork(job)
        job.stats.sync_ms = (time.perf_counter() - started) * 1000
        if kind_ is SnapshotKind.CHECKPOINT and fmt is not SnapshotFormat.CANONICAL:
            self._force_full = False
        with self._lock:
            self._in_flight[job.record.id] = job
        future = self._executor.submit(self._run, job)
        return PendingSnapshot(job, future)

    def _fork(self, job: _Job) -> None:
        """Start the child that writes the files, now: it holds the state as of this barrier, so
        the views are released at once and the task thread copies no slot on its next writes."""
        spool = None
        try:
            for c in job.captures:
                c.prepare(job.ctx)
            # on an object store the child writes into a local spool; _forked_files uploads it
            spool = spool_for(job.snapshot)
            target = job.snapshot if spool is None else spool.snapshot
            job.child = ForkedWrite(lambda opened: self._write_files(job, opened, target))
            job.spool = spool
            job.stats.writer = "fork" if spool is None else "fork-spool"
        except OSError:
            if spool is not None:
                spool.remove()
            return  # no fork (out of processes or memory): the checkpoint thread writes instead
        except BaseException as exc:
            if spool is not None:
                spool.remove()
            self._release(job.captures)
            for c in job.captures:
                c.abandon()
            self._abandon(job.commit, exc)
            raise
        self._release(job.captures)

    def _check_kind(self, kind: str, savepoint_dir: str | None) -> SnapshotKind:
        try:
            kind_ = SnapshotKind(str(kind).upper())
        except ValueError:
            raise InvalidSnapshotRequest(
                f"snapshot kind {kind!r} for job {self.job!r} is unknown; use CHECKPOINT or "
                "SAVEPOINT"
            ) from None
        if savepoint_dir is not None and kind_ is not SnapshotKind.SAVEPOINT:
            raise InvalidSnapshotRequest(
                f"savepoint_dir {savepoint_dir!r} given for a {kind_} of job {self.job!r}; "
                "checkpoints live under the checkpoint root: pass kind='SAVEPOINT'"
            )
        if self._closed:
            raise InvalidSnapshotRequest(
                f"the checkpoint manager of job {self.job!r} is closed; create a new one"
            )
        return kind_

    def _format_for(self, kind: SnapshotKind, override: str | None) -> SnapshotFormat:
        fmt = override if override is not None else self.format
        if fmt not in FORMAT_OPTIONS:
            raise InvalidSnapshotRequest(
                f"snapshot format {fmt!r} for job {self.job!r} is unknown; use one of "
                f"{', '.join(FORMAT_OPTIONS)}"
            )
        # a savepoint is self-contained: a delta chain would reach into other snapshots
        if kind is SnapshotKind.SAVEPOINT and (
            override is None or fmt == SnapshotFormat.DELTA.option
        ):
            return SnapshotFormat.CANONICAL
        return SnapshotFormat(fmt.upper())

    def _check_subtasks(self, subtasks: Sequence[SubtaskState]) -> int:
        p = len(subtasks)
        indexes = sorted(st.subtask_index for st in subtasks)
        if p == 0 or indexes != list(range(p)):
            raise InvalidSnapshotRequest(
                f"a snapshot of job {self.job!r} needs every subtask once (indexes 0..n-1), got "
                f"{indexes}"
            )
        if p > self.max_parallelism:
            raise InvalidSnapshotRequest(
                f"{p} subtasks exceed max parallelism {self.max_parallelism} of job {self.job!r}"
            )
        for st in subtasks:
            want = compute_key_group_range_for_operator_index(
                self.max_parallelism, p, st.subtask_index
            )
            for uid, b in st.keyed.items():
                if b.max_parallelism != self.max_parallelism or b.key_group_range != want:
                    raise InvalidSnapshotRequest(
                        f"keyed backend of operator {uid!r}, subtask {st.subtask_index} of job "
                        f"{self.job!r} owns {b.key_group_range} of max parallelism "
                        f"{b.max_parallelism}, but subtask {st.subtask_index} of {p} owns {want} "
                        f"of {self.max_parallelism}; pass the backends the job runs with"
                    )
        self.parallelism = p
        return p

    def _strategies(
        self, subtasks: Sequence[SubtaskState], fmt: SnapshotFormat
    ) -> dict[tuple[int, str], SnapshotStrategy]:
        """Each backend's strategy for ``fmt`` (its own, or canonical). Asked before a snapshot
        is reserved, so a backend that refuses the format leaves nothing written."""
        out: dict[tuple[int, str], SnapshotStrategy] = {}
        for st in subtasks:
            for uid, b in st.keyed.items():
                if getattr(b, "remote_capture", None) is not None:
                    continue  # its worker process picks the strategy (see _capture)
                try:
                    strategy = b.snapshot_strategy(fmt)
                except InvalidSnapshotRequest as exc:
                    raise InvalidSnapshotRequest(
                        f"{str(fmt).lower()} snapshot of job {self.job!r}, operator {uid!r}, "
                        f"subtask {st.subtask_index}: {exc}"
                    ) from exc
                if strategy is None:
                    strategy = CanonicalSnapshotStrategy(b)
                out[(st.subtask_index, uid)] = strategy
        return out

    def _begin(
        self,
        kind: SnapshotKind,
        fmt: SnapshotFormat,
        parallelism: int,
        savepoint_dir: str | None,
        trigger: str,
        parent: SnapshotRecord | None,
    ) -> PendingCommit:
        return reserve(
            self.catalog,
            self.storage,
            self.job,
            kind=kind,
            format=fmt,
            parallelism=parallelism,
            max_parallelism=self.max_parallelism,
            trigger=trigger,
            savepoint_dir=savepoint_dir,
            parent_id=parent.id if parent is not None else None,
            # raises WriterLeaseLost first: a run that lost the job to another begins nothing
            lease=None if self.writer_lease is None else self.writer_lease.fencing(),
            writer=None if self.writer_lease is None else self.writer_lease.owner,
        )

    def _capture(
        self,
        strategy: SnapshotStrategy | None,
        uid: str,
        index: int,
        backend: KeyedStateBackend,
        fmt: SnapshotFormat,
        record: SnapshotRecord,
        ctx: WriteContext,
    ) -> Capture[Any]:
        remote = getattr(backend, "remote_capture", None)
        if remote is not None:  # a subtask in a worker process captures and writes it there
            return remote(fmt, uid, index, record, ctx)  # type: ignore[no-any-return]  # remote_capture is duck-typed (worker-process backends)
        assert strategy is not None
        return strategy.capture(uid, index, ctx)

    # --- asynchronous phase ---

    def _run(self, job: _Job) -> SnapshotRecord:
        started = time.perf_counter()
        job.started = True
        ctx = job.ctx
        try:
            try:
                ctx.check()
                if job.child is not None:
                    written, op_files = self._forked_files(job)
                else:
                    for c in job.captures:
                        c.prepare(ctx)
                    written, op_files = self._write_files(job, ctx.created.append)
                results = [c.result(ctx, w) for c, w in zip(job.captures, written, strict=True)]
            finally:
                self._release(job.captures)
            # An incremental checkpoint whose every subtask wrote a new base reuses no file of
            # the one it was begun on: it stands alone, with no parent in _metadata or catalog.
            standalone = job.parent is not None and not any(r.files_reused for r in results)
            if standalone:
                job.parent = None
            ctx.check()
            crash_point("checkpoint.after_data_files")
            meta = self._metadata(job, results, op_files)
            self._register_states(meta)
            ctx.check()
            self._attach(job, meta, results)
            crash_point("checkpoint.after_attach")
            ctx.check()
            with job.lock:
                ctx.check()  # a cancel after this point is refused: the commit starts
                job.committed = True
            total_bytes, entries = job.catalog_totals
            record = job.commit.complete(
                meta, bytes=total_bytes, entries=entries, standalone=standalone
            )
            crash_point("checkpoint.after_complete")
        except BaseException as exc:
            if job.committed and self._completed_in_catalog(job.record.id):
                # The CAS committed but its answer was lost (a dropped connection, say): the
                # snapshot is COMPLETED and restorable, so its files must stay.
                raise
            job.committed = False
            if isinstance(exc, (ReusedFileMissing, MissingSnapshotFile)):
                self._reuse_nothing()
            for c in job.captures:
                c.abandon()
            if job.child is not None:
                job.child.kill(ctx.created.append)  # files it reported are removed below
            if job.spool is not None:
                job.spool.remove()
            self._abandon(job.commit, exc, created=ctx.created)
            raise
        finally:
            with self._lock:
                self._in_flight.pop(job.record.id, None)
        job.stats.async_ms = (time.perf_counter() - started) * 1000
        job.stats.full_bytes = meta.total_bytes
        job.stats.entries = record.entries
        self._completed(job, record, meta, results)
        return record

    def _reused(self, meta: SnapshotMetadata) -> list[str]:
        """The files of ``meta`` that earlier snapshots wrote: another snapshot's directory
        (a delta chain), or a ``shared/`` file offered by the registry. A shared file the
        snapshot wrote itself is never in the registry: its name was new."""
        return [
            f.path
            for f in meta.files
            if f.shared
            and (not f.path.startswith(SHARED_PREFIX) or self.registry.lookup(f.path) is not None)
        ]

    def _reuse_nothing(self) -> None:
        """A file this job meant to reuse is gone (an expire or cleanup outside the job deleted
        it): the next checkpoint reuses no earlier file and writes the state in full, as after
        a NO_CLAIM restore, so one failed checkpoint is all the job loses."""
        self.registry.clear()
        self._force_full = True

    def _completed_in_catalog(self, snapshot_id: int) -> bool:
        try:
            return self.catalog.get_snapshot(snapshot_id).status is SnapshotStatus.COMPLETED
        except StatekeeperError:
            return False  # the catalog cannot say: treat the commit as not done, as before

    def _forked_files(self, job: _Job) -> Any:
        assert job.child is not None
        ctx = job.ctx
        try:
            # the child reports snapshot-relative paths: in a spool they name the same files
            got = job.child.wait(cancelled=ctx.cancelled.is_set, opened=ctx.created.append)
            ctx.check()
            if job.spool is not None and got is not None:
                written, op_files = got
                files = [f for w in written for f in w.files]
                files += [f for per_subtask in op_files.values() for _, f in per_subtask]
                job.spool.upload(files, ctx.check)
        finally:
            if job.spool is not None:
                job.spool.remove()
        stale = [c for c in job.captures if not c.still_valid(ctx)]
        if stale:
            raise CheckpointError(
                f"checkpoint {job.record.checkpoint_id}: the files that subtask "
                f"{stale[0].subtask_index}'s delta builds on were released while it was written; "
                "the next checkpoint writes a new base"
            )
        return got

    @staticmethod
    def _release(captures: Sequence[Capture[Any]]) -> None:
        for c in captures:
            with contextlib.suppress(Exception):
                c.release()

    def _write_files(
        self, job: _Job, opened: Callable[[str], None], target: SnapshotDir | None = None
    ) -> tuple[list[Any], dict[str, list[tuple[int, SnapshotFile]]]]:
        """Every data file of the snapshot: keyed (per capture), then operator state. Runs in a
        forked child when every capture allows it (one fork per snapshot). ``target``: where
        the files go (default the snapshot directory; a forked child's spool)."""
        target = job.snapshot if target is None else target
        ctx = job.ctx if target is job.snapshot else dataclasses.replace(job.ctx, snapshot=target)
        written = []
        for c in job.captures:
            ctx.check()
            written.append(c.write_files(ctx, opened))
        ctx.check()
        op_files: dict[str, list[tuple[int, SnapshotFile]]] = {}
        for uid, per_subtask in job.operator_rows.items():
            for index, (rows, metas) in sorted(per_subtask.items()):
                if not rows and not metas:
                    continue
                f = write_operator_state(target, rows, subtask=index, on_open=opened)
                op_files.setdefault(uid, []).append((index, f))
        return written, op_files

    def _metadata(
        self,
        job: _Job,
        results: list[SubtaskResult],
        op_files: dict[str, list[tuple[int, SnapshotFile]]],
    ) -> SnapshotMetadata:
        files: dict[str, SnapshotFile] = {}
        operators = []
        uids = sorted({r.operator_uid for r in results} | set(job.operator_rows))
        captures = {(c.operator_uid, c.subtask_index): c for c in job.captures}
        for uid in uids:
            states: dict[str, dict[str, Any]] = {}
            key_ser: dict[str, Any] | None = None
            subtasks = []
            for r in sorted(
                (r for r in results if r.operator_uid == uid), key=lambda r: r.subtask_index
            ):
                c = captures[(uid, r.subtask_index)]
                key_ser = key_ser or c.key_serializer
                if key_ser != c.key_serializer:
                    raise InvalidSnapshotRequest(
                        f"operator {uid!r} of job {self.job!r} has different key serializers on "
                        f"its subtasks ({key_ser} vs {c.key_serializer}); every subtask must key "
                        "the same way"
                    )
                for name, m in c.states.items():
                    self._merge_state(states, uid, name, m)
                for f in r.files:
                    files.setdefault(f.path, f)
                subtasks.append(
                    SubtaskSnapshot(
                        r.subtask_index, r.key_group_range, tuple(f.path for f in r.files)
                    )
                )
            for _index, (_rows, metas) in sorted(job.operator_rows.get(uid, {}).items()):
                for name, m in metas.items():
                    self._merge_state(states, uid, operator_state_key(name), m)
            op_paths = []
            for _index, f in op_files.get(uid, []):
                files[f.path] = f
                op_paths.append(f.path)
            operators.append(
                OperatorSnapshot(
                    operator_id=uid,
                    key_serializer=key_ser,
                    states=states,
                    subtasks=tuple(subtasks),
                    operator_state_files=tuple(op_paths),
                )
            )
        return SnapshotMetadata(
            job=self.job,
            checkpoint_id=job.record.checkpoint_id,
            kind=job.kind,
            format=job.format,
            max_parallelism=self.max_parallelism,
            parallelism=job.parallelism,
            operators=tuple(operators),
            files=tuple(files.values()),
            parent=job.parent.checkpoint_id if job.parent is not None else None,
        )

    def _merge_state(
        self, states: dict[str, dict[str, Any]], uid: str, name: str, meta: dict[str, Any]
    ) -> None:
        seen = states.setdefault(name, meta)
        if seen != meta:
            raise InvalidSnapshotRequest(
                f"state {name!r} of operator {uid!r} in job {self.job!r} is registered "
                f"differently on two subtasks ({seen} vs {meta}); every subtask must register "
                "it with the same descriptor"
            )

    def _register_states(self, meta: SnapshotMetadata) -> None:
        for op in meta.operators:
            for name, m in op.states.items():
                if (op.operator_id, name) in self._registered_states and self._registered_states[
                    (op.operator_id, name)
                ] == m:
                    continue
                if name.startswith(OPERATOR_STATE_PREFIX):
                    kind, ttl = f"operator-{m['mode'].lower()}", None
                else:
                    kind, ttl = m["kind"], m.get("ttl")
                self.catalog.register_state(
                    self.job, op.operator_id, name, kind=kind, serializers=m["serializers"], ttl=ttl
                )
                self._registered_states[(op.operator_id, name)] = m

    def _attach(self, job: _Job, meta: SnapshotMetadata, results: list[SubtaskResult]) -> None:
        stats: list[KeyGroupStatRow] = []
        for uid in sorted({r.operator_uid for r in results}):
            merged: dict[int, KeyGroupStats] = {}
            for r in results:
                if r.operator_uid == uid:
                    merged.update(r.key_group_stats)
            stats.extend(
                KeyGroupStatRow(uid, kg, s.rows, s.bytes) for kg, s in sorted(merged.items())
            )
        job.catalog_totals = job.commit.attach(meta, stats, reused=self._reused(meta))
        by_path = {f.path: f for f in meta.files}
        job.stats.bytes_written = sum(r.bytes_written for r in results) + sum(
            by_path[p].size for op in meta.operators for p in op.operator_state_files
        )
        job.stats.files_reused = sum(r.files_reused for r in results)
        job.stats.files_written = len(job.ctx.created)

    # --- completion, retention, release ---

    def _completed(
        self,
        job: _Job,
        record: SnapshotRecord,
        meta: SnapshotMetadata,
        results: list[SubtaskResult],
    ) -> None:
        if job.kind is not SnapshotKind.CHECKPOINT:
            return
        with self._lock:
            self._last_completed = record
            self._owned[record.id] = record
            self.registry.register(meta.files)
            for r in results:
                if r.on_complete is not None:
                    self._to_confirm.append((record.checkpoint_id, r.on_complete))
            owned = sorted(self._owned.values(), key=lambda r: r.checkpoint_id, reverse=True)
            drop = owned[self.retained :]
            for old in drop:
                self._owned.pop(old.id, None)
        try:
            self._retire(drop)
        except Exception as exc:
            # The checkpoint is COMPLETED and restorable whatever happens here (Flink, too, only
            # logs a failed discard of subsumed checkpoints): the ones to drop went back to the
            # manager and are subsumed after the next completion.
            job.stats.retention_error = f"{type(exc).__name__}: {exc}"
            _log.warning(
                "job %s: checkpoint %s completed, but subsuming older checkpoints failed (%s); "
                "retried after the next checkpoint",
                self.job,
                record.checkpoint_id,
                job.stats.retention_error,
            )

    def _retire(self, drop: list[SnapshotRecord]) -> None:
        """Subsume ``drop`` and forget the files that releases in one catalog transaction
        (rather than one per step), then delete those files from storage."""
        try:
            with self.catalog.batch():
                for r in drop:
                    with contextlib.suppress(InvalidSnapshotTransition, CommitConflict):
                        self.catalog.subsume_snapshot(r.id)
                claim = self._forget_releasable()
        except BaseException:
            with self._lock:  # rolled back: they are subsumed after the next completion
                self._owned.update((r.id, r) for r in drop)
            raise
        if claim is not None:
            self._delete_released(*claim)

    def collect_garbage(self) -> list[str]:
        """Delete the job's files the catalog calls releasable (no retained snapshot uses them)
        from storage, under the job's file lease, and forget them; returns the deleted URLs.

        The catalog forgets first (under the fencing token, refusing any file a live snapshot
        uses), storage deletes after: a crash in between leaves only files nothing references,
        which orphan cleanup reclaims, never a catalog entry for a file that is gone.
        """
        with self.catalog.batch():
            claim = self._forget_releasable()
        return [] if claim is None else self._delete_released(*claim)

    def _forget_releasable(self) -> tuple[str, int, list[FileRecord]] | None:
        """The catalog half of :meth:`collect_garbage`, in the caller's transaction: take the
        job's file lease and forget the releasable files; (lease, token, files), or None if
        there are none or another deleter holds the lease."""
        base = self.storage.url_of(self.job).rstrip("/") + "/"
        if not any(f.path.startswith(base) for f in self.catalog.releasable_files(self.job)):
            return None
        lease = file_lease_name(self.job)
        try:
            token = self.catalog.acquire_lease(
                lease, f"checkpoint-manager-{uuid.uuid4().hex[:8]}", FILE_LEASE_TTL_S
            )
        except LeaseError:
            return None  # expire/orphan cleanup is deleting right now; the next one retries
        # Read again under the lease: another deleter may have finished in the meantime.
        files = [f for f in self.catalog.releasable_files(self.job) if f.path.startswith(base)]
        for f in files:
            rel = f.path[len(base) :]
            if rel.startswith("shared/"):
                self.registry.forget(["../" + rel])
        if files:
            self.catalog.forget_files(self.job, [f.path for f in files], lease=lease, token=token)
        return lease, token, files

    def _delete_released(self, lease: str, token: int, files: list[FileRecord]) -> list[str]:
        """The storage half of :meth:`collect_garbage`, after the catalog forgot ``files``:
        delete them, then give the lease up; returns the deleted URLs."""
        deleted: list[str] = []
        try:
            for f in files:
                if self.storage.delete(f.path):
                    crash_point("checkpoint.during_release")
                deleted.append(f.path)
            self.storage.remove_empty_dirs(
                (posixpath.dirname(f.path) for f in files), [self.storage.url_of(self.job)]
            )
        finally:
            with contextlib.suppress(LeaseError):
                self.catalog.release_lease(lease, token)
        return deleted

    def _abandon(
        self, commit: PendingCommit, exc: BaseException, created: Sequence[str] = ()
    ) -> None:
        """Leave nothing of a failed or cancelled snapshot: its row ends DISCARDED, its files
        (``created``: also those outside its directory, e.g. ``shared/`` uploads) are removed."""
        commit.abort(exc, created=created, discard=True, storage=self.storage)
        with contextlib.suppress(Exception):
            self.collect_garbage()

    # --- completion on the task thread ---

    def notify_checkpoint_complete(self, checkpoint_id: int | None = None) -> None:
        """Tell the strategies of completed checkpoints (up to ``checkpoint_id``) so: the heap
        delta strategy confirms its view and continues its chain from the new files.

        Call it from the task thread (the thread that writes state); ``trigger`` calls it too,
        so a runtime that never calls it still gets correct deltas.
        """
        with self._lock:
            ready = [
                (cid, r)
                for cid, r in self._to_confirm
                if checkpoint_id is None or cid <= checkpoint_id
            ]
            self._to_confirm = [x for x in self._to_confirm if x not in ready]
        for _cid, on_complete in ready:
            on_complete()

    def _confirm_completed(self) -> SnapshotRecord | None:
        """:meth:`notify_checkpoint_complete` for every completed checkpoint; the last one."""
        with self._lock:
            ready, self._to_confirm = self._to_confirm, []
            last = self._last_completed
        for _cid, on_complete in ready:
            on_complete()
        return last

    # --- restore ---

    def restore(
        self,
        snapshot: int | str | SnapshotRecord = "latest",
        *,
        parallelism: int,
        factory: StateBackendFactory,
        key_serializer: Any = None,
        mode: RestoreMode = RestoreMode.NO_CLAIM,
        clock: Any = None,
        subtask_indexes: Sequence[int] | None = None,
    ) -> RestoredState:
        """Restore a COMPLETED snapshot at ``parallelism`` into ``factory``'s backends.

        ``snapshot``: ``"latest"`` (the job's latest completed checkpoint or savepoint), a catalog
        snapshot id, a SnapshotRecord, or a snapshot directory URL (e.g. a relocated savepoint;
        registered in this job's catalog if it is not known yet).
        ``subtask_indexes``: restore only these subtasks of the new parallelism (default: all);
        ``RestoredState.subtasks`` then holds just those, in the given order.
        """
        # a heap state is built at once: kept out of the cyclic collector's walks (see collector)
        with collector_paused(keep=True):
            result = restore_snapshot(
                self,
                snapshot,
                parallelism=parallelism,
                factory=factory,
                key_serializer=key_serializer,
                clock=clock,
                subtask_indexes=subtask_indexes,
            )
        restored = result.restored
        self.parallelism = parallelism
        with self._lock:
            self._to_confirm.clear()
            if mode is RestoreMode.CLAIM:
                rec = restored.snapshot
                if rec.kind is SnapshotKind.CHECKPOINT and rec.job_id == self.job_record.id:
                    self._owned[rec.id] = rec
                    self._last_completed = rec
                    self.registry.register(result.shared_files)
                    self._claim_chains(restored, result.unchanged_subtask_files, result.folded)
                self._force_full = False
            else:
                # NO_CLAIM: the restored snapshot stays the user's even if this manager wrote it
                self._owned.pop(restored.snapshot.id, None)
                self.registry.clear()
                self._last_completed = None
                self._force_full = True
        return restored

    def _claim_chains(
        self,
        restored: RestoredState,
        unchanged: Mapping[tuple[str, int], Sequence[SnapshotFile]],
        folded: Mapping[tuple[str, int], pa.Table],
    ) -> None:
        """Let each restored backend whose key-group range did not change continue from its
        old subtask's files (a heap delta chain: the next delta holds only new changes, and
        the first checkpoint rewrites the chain as the base the restore folded)."""
        fmt = self._format_for(SnapshotKind.CHECKPOINT, None)
        for st in restored.subtasks:
            for uid, backend in st.keyed.items():
                files = unchanged.get((uid, st.subtask_index))
                if files is None:
                    continue
                # a backend that cannot write the format fails at its first checkpoint, as
                # it does without a claim
                with contextlib.suppress(InvalidSnapshotRequest):
                    strategy = backend.snapshot_strategy(fmt)
                    if isinstance(strategy, ClaimingStrategy):
                        strategy.claim(files, folded.get((uid, st.subtask_index)))

    def close(self, *, wait: bool = True) -> None:
        """Stop the checkpoint thread (after the snapshots in flight, with ``wait``)."""
        self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=not wait)
        with self._lock:  # the shutdown cancelled every job the thread had not taken up
            never_ran = [job for job in self._in_flight.values() if not job.started]
        for job in never_ran:
            # as after a crash: its PENDING row and files stay for recovery and orphan cleanup
            if job.child is not None:
                job.child.kill()
            if job.spool is not None:
                job.spool.remove()  # local only: what it held never reached the store
        reap_exited(block=True)  # the writers that delivered their files and were exiting
        if self.writer_lease is not None:
            self.writer_lease.release()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
