"""The local job runner: N subtasks of source -> keyed process function -> sink in one thread.

Each step reads one record from each source subtask in turn and hands it straight to the keyed
subtask that owns its key group, whose output goes to that subtask's sink writer. One thread and a
fixed order make a run deterministic: the same input gives the same checkpoints at the same records,
and the output and final state do not depend on the parallelism.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import RestoredState, RestoreMode, SubtaskState
from state_engine.checkpoint.writer_lease import WriterLease
from state_engine.errors import InvalidJob, JobError
from state_engine.keygroups import assign_to_key_group, compute_key_group_range_for_operator_index
from state_engine.runtime.coordinator import CheckpointCoordinator, CheckpointStats
from state_engine.runtime.job import Job
from state_engine.runtime.keyed_operator import KeyedProcessOperator
from state_engine.runtime.sinks import SinkWriter, new_attempt_id
from state_engine.runtime.source_reader import SourceReader
from state_engine.runtime.watermarks import MAX_WATERMARK, MIN_WATERMARK
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind
from state_engine.state.meta import StateEntry
from state_engine.state.ttl import Clock, SystemClock

if TYPE_CHECKING:
    from state_engine.catalog import Catalog, SnapshotRecord

#: Keys whose subtask the runner remembers (a dict hit instead of hashing the key per record).
ROUTE_CACHE_SIZE = 1 << 16
#: A key the route cache does not hold (None there means: another process's subtask).
_MISSING: Any = object()


@dataclass
class JobResult:
    """What a run (or a part of one, up to a kill) did."""

    job: str
    parallelism: int
    records_in: int
    records_out: int
    records_skipped: int
    late_records: int
    timers_fired: int
    finished: bool
    killed: bool
    watermark: int
    restored_from: Any = None  # SnapshotRecord
    checkpoints: list[Any] = field(default_factory=list)  # SnapshotRecord, completed
    savepoints: list[Any] = field(default_factory=list)
    failed_checkpoints: list[str] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)


class _Subtask:
    """Subtask i of every operator (they are chained: same index, same thread)."""

    def __init__(
        self,
        job: Job,
        index: int,
        parallelism: int,
        keyed: KeyedStateBackend,
        source_state: OperatorStateBackend,
        sink_state: OperatorStateBackend,
        clock: Clock,
        attempt: str,
    ) -> None:
        self.index = index
        self.job = job
        self.keyed = keyed
        self.source_state = source_state
        self.sink_state = sink_state
        self.reader = SourceReader(job.source, source_state)
        self.writer = SinkWriter(job.sink, sink_state, attempt)
        self.operator = KeyedProcessOperator(
            job.operator_uid,
            index,
            parallelism,
            job.new_function(),
            keyed,
            clock,
            self.writer.write,
        )

    def prepare_snapshot(self, barrier: int) -> SubtaskState:
        self.reader.sync_offsets()
        self.writer.prepare_commit(barrier)
        return SubtaskState(
            subtask_index=self.index,
            keyed={self.job.operator_uid: self.keyed},
            operator={self.job.source_uid: self.source_state, self.job.sink_uid: self.sink_state},
        )

    def notify_checkpoint_complete(self, barrier: int) -> None:
        self.writer.notify_checkpoint_complete(barrier)


def _catch_up(operators: Sequence[KeyedProcessOperator], watermark: int) -> None:
    for o in operators:
        if o.watermark < watermark:
            o.advance_watermark(watermark)


def build_subtask(
    job: Job,
    index: int,
    parallelism: int,
    factory: Any,
    restored: SubtaskState | None,
    clock: Clock,
    attempt: str,
) -> _Subtask:
    """Subtask ``index`` of ``job``: its restored state, or fresh state for its key groups."""
    keyed = restored.keyed.get(job.operator_uid) if restored is not None else None
    if keyed is None:
        kgr = compute_key_group_range_for_operator_index(job.max_parallelism, parallelism, index)
        keyed = factory.create(
            job.operator_uid, index, job.key_serializer, job.max_parallelism, kgr, clock
        )
    ops = restored.operator if restored is not None else {}
    source_state = ops.get(job.source_uid) or OperatorStateBackend(index, parallelism)
    sink_state = ops.get(job.sink_uid) or OperatorStateBackend(index, parallelism)
    return _Subtask(job, index, parallelism, keyed, source_state, sink_state, clock, attempt)


class JobRunner:
    """Runs ``job`` fresh, or restored from a snapshot at the job's (possibly new) parallelism.

    ``restore_from``: None (fresh), ``"latest"``, a catalog snapshot id, or a snapshot directory
    URL (a savepoint); it needs ``catalog`` and ``storage``, as does checkpointing.

    A job whose :attr:`Job.execution_mode` is ``"processes"`` gets a
    :class:`~state_engine.runtime.worker_pool.ProcessJobRunner` (same API, subtasks in worker
    processes).
    """

    #: The runner of ``execution="processes"``: :mod:`state_engine.runtime.worker_pool` defines
    #: it and sets it here when imported (the ``state_engine.runtime`` package imports it), so
    #: this module does not import the worker pool built on top of it.
    process_runner: type[JobRunner] | None = None

    def __new__(cls, job: Job, **kwargs: Any) -> JobRunner:
        if cls is JobRunner and isinstance(job, Job) and job.execution_mode == "processes":
            if JobRunner.process_runner is None:
                raise JobError("execution='processes' needs state_engine.runtime.worker_pool")
            return super().__new__(JobRunner.process_runner)
        return super().__new__(cls)

    def __init__(
        self,
        job: Job,
        *,
        catalog: Catalog | None = None,
        storage: CheckpointStorage | str | Path | None = None,
        restore_from: int | str | None = None,
        restore_mode: Any = None,
    ) -> None:
        if not isinstance(job, Job):
            raise InvalidJob(f"JobRunner runs a Job, got {type(job).__name__}")
        needs_manager = job.checkpointing or restore_from is not None
        if needs_manager and (catalog is None or storage is None):
            raise InvalidJob(
                f"job {job.name!r} checkpoints or restores, which needs a catalog and a "
                "checkpoint storage: pass JobRunner(job, catalog=..., storage=...)"
            )
        self.job = job
        self.catalog = catalog
        self.storage = str(storage) if isinstance(storage, Path) else storage
        self.restore_from = restore_from
        self.restore_mode = restore_mode
        self.parallelism = job.parallelism
        self.clock: Clock = job.clock if job.clock is not None else SystemClock()
        self.attempt = new_attempt_id()
        self.manager: CheckpointManager | None = None
        self.coordinator: CheckpointCoordinator | None = None
        self.subtasks: list[_Subtask] = []
        self.restored_from: SnapshotRecord | None = None
        #: PENDING snapshots of an earlier run that stopped mid-checkpoint, failed by this one
        self.failed_stale_commits: list[SnapshotRecord] = []
        self._started = False
        self._closed = False
        self._finished = False
        self._killed = False
        self._records_in = 0
        self._late = 0
        self._watermark = MIN_WATERMARK
        self._timings: dict[str, Any] = {"setup_s": 0.0, "run_s": 0.0, "run_cpu_s": 0.0}

    # --- setup ---

    def _new_manager(self, catalog: Catalog, storage: CheckpointStorage | str) -> CheckpointManager:
        """The checkpoint manager of this run's job at this run's parallelism."""
        job = self.job
        # one run writes a job's snapshots: refused while another run of it lives
        lease = WriterLease(catalog, job.name).acquire()
        try:
            manager = CheckpointManager(
                catalog,
                storage,
                job.name,
                max_parallelism=job.max_parallelism,
                parallelism=self.parallelism,
                format=job.checkpoint_format,
                retained=job.retained,
                incremental=job.incremental,
                fork_writer=job.fork_writer,
                chain_in_flight=job.max_concurrent_checkpoints > 1,
                writer_lease=lease,
            )
        except BaseException:
            lease.release()
            raise
        try:
            # what a run that stopped mid-checkpoint left PENDING is nobody's now
            self.failed_stale_commits = lease.fail_stale_commits(manager.storage)
        except BaseException:
            manager.close()
            raise
        return manager

    def _restore_through(
        self,
        manager: CheckpointManager,
        snapshot: int | str,
        factory: Any,
        subtask_indexes: Sequence[int] | None = None,
    ) -> RestoredState:
        """Restore ``snapshot`` through ``manager`` at this run's parallelism (all subtasks, or
        ``subtask_indexes``), in the run's restore mode (NO_CLAIM unless it names one)."""
        return manager.restore(
            snapshot,
            parallelism=self.parallelism,
            factory=factory,
            key_serializer=self.job.key_serializer,
            mode=self.restore_mode or RestoreMode.NO_CLAIM,
            clock=self.clock,
            subtask_indexes=subtask_indexes,
        )

    def _setup(self) -> None:
        started = time.perf_counter()
        job, p = self.job, self.parallelism
        factory = job.backend if job.backend is not None else HeapBackendFactory()
        if (
            SnapshotFormat.from_option(job.checkpoint_format) is SnapshotFormat.DELTA
            and isinstance(factory, HeapBackendFactory)
            and not factory.track_changes
        ):
            # a delta checkpoint is the changes since the last one: the heap must record them
            factory = HeapBackendFactory(track_changes=True)
        restored: list[SubtaskState] | None = None
        if self.catalog is not None and self.storage is not None:
            self.manager = self._new_manager(self.catalog, self.storage)
            if self.restore_from is not None:
                result = self._restore_through(self.manager, self.restore_from, factory)
                self.restored_from = result.snapshot
                restored = sorted(result.subtasks, key=lambda s: s.subtask_index)
                if [s.subtask_index for s in restored] != list(range(p)):
                    raise JobError(
                        f"job {job.name!r}: the restore returned subtasks "
                        f"{[s.subtask_index for s in restored]}, expected 0..{p - 1}"
                    )
        for i in range(p):
            st = restored[i] if restored is not None else None
            self.subtasks.append(build_subtask(job, i, p, factory, st, self.clock, self.attempt))
        # Partitions no restored subtask holds (all of them, when fresh) go round-robin.
        held = {part for s in self.subtasks for part in s.reader.partitions}
        new = [part for part in job.source.partitions() if part not in held]
        for j, part in enumerate(new):
            self.subtasks[j % p].reader.assign([part])
        # The restored checkpoint's pre-committed output is committed now; the rest discarded.
        committables = [c for s in self.subtasks for c in s.writer.restored_committables()]
        job.sink.recover(committables)
        if self.manager is not None:
            self.coordinator = CheckpointCoordinator(
                self.manager,
                self.subtasks,
                interval_records=job.checkpoint_interval_records,
                interval_seconds=job.checkpoint_interval_seconds,
                max_concurrent=job.max_concurrent_checkpoints,
            )
        self._started = True
        self._timings["setup_s"] = time.perf_counter() - started
        self._timings["restored_committables"] = len(committables)

    def _ensure_running(self) -> None:
        if self._closed or self._killed:
            raise JobError(
                f"job {self.job.name!r} was {'killed' if self._killed else 'closed'}: start a new "
                "JobRunner (restore_from='latest' to continue from its last checkpoint)"
            )
        if not self._started:
            try:
                self._setup()
            except BaseException:
                # a run that could not start gives the job up (its writer lease) at once
                if self.manager is not None:
                    with contextlib.suppress(Exception):
                        self.manager.close(wait=True)
                    self.manager = None
                raise

    # --- running ---

    def run(self) -> JobResult:
        """Run to the end of the (bounded) input; a final checkpoint commits the rest."""
        self._ensure_running()
        if not self._finished:
            self._pump(None)
            self._end_of_input()
        return self.result()

    def run_until(self, records: int, *, kill: bool = True) -> JobResult:
        """Process until ``records`` records have been read in this run, then stop.

        ``kill=True`` stops abruptly, as a crash would: no final checkpoint, in-memory state and
        uncommitted output dropped, completed checkpoints not notified. ``kill=False`` pauses; call
        :meth:`run`, :meth:`checkpoint`, :meth:`savepoint` or :meth:`kill` next.
        """
        if type(records) is not int or records < 0:
            raise InvalidJob(f"run_until needs a record count >= 0, got {records!r}")
        self._ensure_running()
        if not self._finished and not self._pump(records):
            self._end_of_input()
        if kill:
            self.kill()
        return self.result()

    def _pump(self, limit: int | None) -> bool:
        """Process records until ``limit`` (True: limit reached) or the end of input (False)."""
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self._pump_records(limit)
        finally:
            self._timings["run_s"] += time.perf_counter() - started
            self._timings["run_cpu_s"] += time.thread_time() - cpu

    def _routing(self) -> tuple[list[SourceReader], list[KeyedProcessOperator | None]]:
        """Every source subtask's reader, and per keyed subtask its operator (None: another
        process runs it, and its records are read here only to be skipped)."""
        return [s.reader for s in self.subtasks], [s.operator for s in self.subtasks]

    def _pump_records(self, limit: int | None) -> bool:
        # The per-record path: everything loop-invariant is a local, the route of a key is a
        # dict hit after its first record, and the watermark is recomputed only when a source
        # subtask's watermark moved. An operator's watermark is advanced when it next runs (a
        # record, a processing-time timer), when an event-time timer of it is due, and before a
        # barrier and on return: what each operator sees, in order, is that of advancing every
        # operator at every step, without a call per operator and record.
        job, p = self.job, self.parallelism
        max_p = job.max_parallelism
        key_of = job.key_selector
        readers, operators = self._routing()
        owned = [o for o in operators if o is not None]
        marks = [r.watermarks for r in readers]
        polls = [(r.next_record, r.watermarks, i) for i, r in enumerate(readers) if not r.finished]
        # Each reader's watermark as last read (MAX_WATERMARK once idle): the job's watermark is
        # their minimum. A reader's watermark moves only on its own records, which flag it
        # dirty, so a step re-reads only its own reader; readers flagged before this loop make
        # the first re-read take them all, as the loop found them.
        held = [MAX_WATERMARK if m.idle or m._dirty else m.current for m in marks]
        reread_all = any(m._dirty for m in marks)
        one_reader = len(marks) == 1
        single = operators[0] if p == 1 else None
        route: dict[Any, KeyedProcessOperator | None] = {}
        missing = _MISSING
        coordinator = self.coordinator
        n = self._records_in
        check_at = n if coordinator is not None else sys.maxsize
        stop = sys.maxsize if limit is None else limit
        wm_now = self._watermark
        late = 0
        # the timer heaps (lists kept in place): a truth test per step
        proc = [(o.timers.processing._heap, o) for o in owned]
        event = [(o.timers.event._heap, o) for o in owned]
        try:
            while polls:
                ended = False
                for next_record, wmarks, index in polls:
                    if n >= stop:
                        _catch_up(owned, wm_now)
                        return True
                    got = next_record()
                    if got is not None:
                        value, ts = got
                        key = key_of(value)
                        op = single
                        if op is None:
                            op = route.get(key, missing)
                            if op is missing:
                                op = operators[assign_to_key_group(key, max_p) * p // max_p]
                                if len(route) >= ROUTE_CACHE_SIZE:
                                    route.clear()
                                route[key] = op
                        if op is not None:
                            if op.watermark < wm_now:
                                op.advance_watermark(wm_now)
                            if ts <= wm_now:
                                late += 1
                            op.process(key, value, ts)
                        n += 1
                    else:
                        ended = True  # this reader has read all its partitions
                    if wmarks._dirty or got is None:
                        if got is not None and not reread_all:
                            held[index] = wmarks.current  # it read a record: not idle
                        else:
                            held = [MAX_WATERMARK if m.idle else m.current for m in marks]
                            reread_all = False
                        wm = held[0] if one_reader else min(held)
                        if wm > wm_now:
                            wm_now = self._watermark = wm
                            for heap, o in event:
                                if heap and heap[0][0] <= wm:
                                    o.advance_watermark(wm)
                    for heap, o in proc:
                        if heap:
                            if o.watermark < wm_now:
                                o.advance_watermark(wm_now)
                            o.fire_processing_timers()
                    if n >= check_at:
                        coordinator.poll()  # type: ignore[union-attr]  # None: check_at is maxsize
                        if coordinator.due(n):  # type: ignore[union-attr]  # as above
                            _catch_up(owned, wm_now)
                            coordinator.trigger(n)  # type: ignore[union-attr]  # as above
                        check_at = coordinator.next_check(n)  # type: ignore[union-attr]  # as above
                if ended:
                    polls = [x for x in polls if not readers[x[2]].finished]
            _catch_up(owned, wm_now)
            return False
        finally:
            self._records_in = n
            self._late += late

    def _end_of_input(self) -> None:
        """Flink's end of input: the max watermark fires every event-time timer, then a final
        checkpoint commits the remaining output."""
        self._watermark = MAX_WATERMARK
        for s in self.subtasks:
            s.operator.advance_watermark(MAX_WATERMARK)
        if self.coordinator is not None:
            flight = self.coordinator.trigger(self._records_in, trigger="final")
            self.coordinator.wait(flight)
        else:
            for s in self.subtasks:
                s.writer.prepare_commit(0)
                s.writer.notify_checkpoint_complete(0)
        self._finished = True

    # --- on demand ---

    def checkpoint(self) -> SnapshotRecord:
        """A checkpoint now (between records), waited for and notified."""
        return self._snapshot(SnapshotKind.CHECKPOINT, None)

    def savepoint(self, directory: str | Path | None = None) -> SnapshotRecord:
        """A savepoint now (canonical, self-contained), in ``directory``: a URL, a path under the
        checkpoint root (str), a local directory (Path), or the storage's default."""
        if isinstance(directory, Path):
            directory = directory.resolve().as_uri()
        return self._snapshot(SnapshotKind.SAVEPOINT, directory)

    def _snapshot(self, kind: str, directory: str | None) -> SnapshotRecord:
        self._ensure_running()
        if self.coordinator is None:
            raise InvalidJob(
                f"job {self.job.name!r} has no checkpoint storage: pass catalog and storage to "
                "JobRunner to take snapshots"
            )
        flight = self.coordinator.trigger(
            self._records_in, kind=kind, savepoint_dir=directory, trigger="manual"
        )
        return self.coordinator.wait(flight)

    def kill(self) -> None:
        """Stop as a crash would (see :meth:`run_until`)."""
        if self._killed or self._closed:
            return
        self._killed = True
        if self.coordinator is not None:
            # Their files belong to the checkpoint layer; let them land so a restore sees a
            # settled catalog, but tell nobody (a crash between completion and notification).
            self.coordinator.wait_all(notify=False)
        for s in self.subtasks:
            s.writer.abort()
            s.reader.close()
        self._close_backends()

    # --- results and state ---

    def result(self) -> JobResult:
        stats = self.coordinator.stats if self.coordinator is not None else CheckpointStats()
        return JobResult(
            job=self.job.name,
            parallelism=self.parallelism,
            records_in=self._records_in,
            records_out=sum(s.writer.written for s in self.subtasks),
            records_skipped=sum(s.reader.records_skipped for s in self.subtasks),
            late_records=self._late,
            timers_fired=sum(s.operator.timers_fired for s in self.subtasks),
            finished=self._finished,
            killed=self._killed,
            watermark=self._watermark,
            restored_from=self.restored_from,
            checkpoints=list(stats.completed),
            savepoints=list(stats.savepoints),
            failed_checkpoints=list(stats.failed),
            timings={
                **self._timings,
                "checkpoint_sync_ms": list(stats.sync_ms),
                "checkpoint_waits": stats.waited,
            },
        )

    def state_entries(self) -> list[StateEntry]:
        """Every canonical keyed-state row of every subtask (timers included), now."""
        if self._killed or self._closed or not self._started:
            raise JobError(f"job {self.job.name!r} holds no live state (not started, or stopped)")
        rows: list[StateEntry] = []
        for s in self.subtasks:
            with s.keyed.snapshot_view() as view:
                rows.extend(view.iter_entries())
        return rows

    def partitions(self) -> list[list[str]]:
        """The partitions each source subtask reads."""
        return [s.reader.partitions for s in self.subtasks]

    def operator_state(self, subtask: int) -> Sequence[OperatorStateBackend]:
        s = self.subtasks[subtask]
        s.reader.sync_offsets()
        return (s.source_state, s.sink_state)

    # --- shutdown ---

    def _close_backends(self) -> None:
        for s in self.subtasks:
            with contextlib.suppress(Exception):
                s.keyed.close()
        if self.manager is not None:
            self.manager.close(wait=True)

    def close(self) -> None:
        if self._closed:
            return
        if not self._killed:
            if self.coordinator is not None:
                self.coordinator.wait_all(notify=True)
            for s in self.subtasks:
                s.operator.close()
                s.writer.abort()
                s.reader.close()
            self._close_backends()
        self._closed = True

    def __enter__(self) -> JobRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
