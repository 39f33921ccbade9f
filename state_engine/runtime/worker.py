"""One worker process of a process-parallel job: some keyed subtasks, and every source reader.

Every worker reads every source partition in the runner's order and keeps the records whose key
group one of its subtasks owns (the others are skipped after routing). So each worker sees the
stream exactly as the single-thread runner does: the record count is the barrier, and "snapshot
at record N" aligns every channel without a barrier travelling through one. The parent
(:mod:`state_engine.runtime.worker_pool`) tells the workers how far to run, when to take a
snapshot's synchronous phase, where to write its files and when a checkpoint completed.

The worker writes its subtasks' snapshot files itself (heap views on local storage in a child
forked at the barrier, as the manager does; RocksDB uploads on a thread), reporting each file
before it creates it, then what it wrote; the parent's checkpoint manager completes the
checkpoint (metadata, catalog) once every subtask's files are in.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from state_engine import faults
from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.backends.rocksdb.snapshot import NativeSnapshotStrategy
from state_engine.checkpoint.forked import ForkedWrite, can_fork, reap_exited
from state_engine.checkpoint.spool import Spool, spool_for
from state_engine.collector import hold_frozen
from state_engine.runtime.job import Job
from state_engine.runtime.keyed_operator import KeyedProcessOperator
from state_engine.runtime.runner import JobRunner, _Subtask, build_subtask
from state_engine.runtime.sinks import Committable, Sink, SinkTransactions
from state_engine.runtime.source_reader import SourceReader
from state_engine.runtime.watermarks import MAX_WATERMARK
from state_engine.snapshot.registry import SharedStateRegistry
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot.strategy import CanonicalCapture, Capture, WriteContext
from state_engine.snapshot_enums import SnapshotFormat
from state_engine.state.meta import StateEntry


@dataclass
class RestoreSpec:
    catalog_url: str
    storage_root: str
    storage_options: dict[str, Any]
    snapshot_id: int


@dataclass
class WorkerSpec:
    job: Job
    parallelism: int
    owned: list[int]
    attempt: str
    restore: RestoreSpec | None = None
    #: the parent's STATEKEEPER_* variables now (a forkserver child has the server's)
    env: dict[str, str] = field(default_factory=dict)
    #: the parent's working directory now (relative source, sink and storage paths)
    cwd: str | None = None


@dataclass
class CaptureInfo:
    """What the parent's manager needs of one captured keyed backend."""

    key_group_range: tuple[int, int]
    max_parallelism: int
    key_serializer: dict[str, Any]
    states: dict[str, dict[str, Any]]


@dataclass
class SubtaskSync:
    """The synchronous phase of one subtask at a barrier."""

    index: int
    keyed: dict[str, CaptureInfo]
    operator: dict[str, tuple[list[Any], dict[str, dict[str, Any]]]]
    committables: list[Committable]


@dataclass
class WriteSpec:
    """Where the parent's manager wants one capture written (its WriteContext, picklable)."""

    url: str
    storage_options: dict[str, Any]
    allow_shared: bool
    checkpoint_id: int
    savepoint: bool
    incremental: bool
    row_group_bytes: int
    shared_files: list[Any] = field(default_factory=list)  # SnapshotFile


@dataclass
class Progress:
    records_in: int
    reached: bool
    watermark: int
    records_out: int
    records_skipped: int
    timers_fired: int
    late_records: int
    cpu_s: float = 0.0  # CPU seconds this worker's thread spent running records


class _ParentCommits(Sink):
    """The job's sink in a worker: writers as the job's, commits done by the parent (it holds
    the committables from the snapshot's synchronous phase and the external system's handle)."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner

    def writer(self, subtask_index: int, attempt: str) -> SinkTransactions:
        return self.inner.writer(subtask_index, attempt)

    def commit(self, committables: Sequence[Committable]) -> None:
        pass

    def recover(self, committables: Sequence[Committable]) -> None:
        pass


class WorkerRunner(JobRunner):
    """The subtasks ``spec.owned`` of the job, driven by the parent's commands."""

    def __init__(self, spec: WorkerSpec) -> None:
        job = spec.job.with_(
            checkpoint_interval_records=None,
            checkpoint_interval_seconds=None,
            execution="threads",
            sink=_ParentCommits(spec.job.sink),
        )
        super().__init__(job)
        self.spec = spec
        self.parallelism = spec.parallelism
        self.attempt = spec.attempt
        self.owned = list(spec.owned)
        self.readers: list[SourceReader] = []
        self.operators: list[KeyedProcessOperator | None] = []
        self.registry = SharedStateRegistry()
        self.restored_snapshot: Any = None
        self._captures: dict[tuple[int, str, int], Capture[Any]] = {}
        self._send_lock = threading.Lock()
        self._writes: list[threading.Thread] = []
        self.conn: Any = None

    # --- setup ---

    def _setup(self) -> None:
        job, p = self.job, self.parallelism
        factory = job.backend if job.backend is not None else HeapBackendFactory()
        restored: dict[int, Any] = {}
        if self.spec.restore is not None:
            restored = self._restore(factory)
        by_index: dict[int, _Subtask] = {}
        for i in self.owned:
            by_index[i] = build_subtask(
                job, i, p, factory, restored.get(i), self.clock, self.attempt
            )
        self.subtasks = [by_index[i] for i in self.owned]
        for i in range(p):
            s = by_index.get(i)
            if s is not None:
                self.readers.append(s.reader)
                self.operators.append(s.operator)
            else:  # a reader of another worker's subtask: positions come with "assign"
                self.readers.append(SourceReader(job.source, OperatorStateBackend(i, p)))
                self.operators.append(None)
        self._started = True

    def _restore(self, factory: Any) -> dict[int, Any]:
        from state_engine.catalog import Catalog
        from state_engine.checkpoint.manager import CheckpointManager

        r = self.spec.restore
        assert r is not None
        job = self.job
        catalog = Catalog.open(r.catalog_url, check_version=False)
        try:
            manager = CheckpointManager(
                catalog,
                CheckpointStorage(r.storage_root, r.storage_options),
                job.name,
                max_parallelism=job.max_parallelism,
                parallelism=self.parallelism,
                fork_writer=False,
            )
            try:
                result = self._restore_through(
                    manager, r.snapshot_id, factory, subtask_indexes=self.owned
                )
                # the checksums of the SSTs it downloaded: the next upload need not read them
                self.registry = manager.registry
            finally:
                manager.close(wait=True)
        finally:
            catalog.close()
        self.restored_snapshot = result.snapshot
        return {st.subtask_index: st for st in result.subtasks}

    def _routing(self) -> tuple[list[SourceReader], list[KeyedProcessOperator | None]]:
        return self.readers, self.operators

    # --- the command loop ---

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.conn.send(message)

    def serve(self, conn: Any) -> None:
        self.conn = conn
        self._setup()
        held = {
            s.index: [(part, s.reader.offset(part)) for part in s.reader.partitions]
            for s in self.subtasks
        }
        committables = [c for s in self.subtasks for c in s.writer.restored_committables()]
        self.send(("ok", (held, committables, self.restored_snapshot)))
        while True:
            command, *args = conn.recv()
            if command == "close":
                self._shutdown(graceful=args[0])
                self.send(("ok", None))
                return
            reply = getattr(self, "cmd_" + command)(*args)
            if reply is not None:
                self.send(("ok", reply))

    def cmd_assign(self, positions: dict[int, list[tuple[str, int]]], new: list[list[str]]) -> int:
        for i, reader in enumerate(self.readers):
            if self.operators[i] is None:
                reader.follow(positions.get(i, []))
            reader.assign(new[i])
        return 0

    def _progress(self, reached: bool) -> Progress:
        return Progress(
            records_in=self._records_in,
            reached=reached,
            watermark=self._watermark,
            records_out=sum(s.writer.written for s in self.subtasks),
            records_skipped=sum(s.reader.records_skipped for s in self.subtasks),
            timers_fired=sum(s.operator.timers_fired for s in self.subtasks),
            late_records=self._late,
            cpu_s=self._timings["run_cpu_s"],
        )

    def cmd_run(self, limit: int | None) -> Progress:
        return self._progress(self._pump(limit))

    def cmd_end(self) -> Progress:
        self._watermark = MAX_WATERMARK
        for s in self.subtasks:
            s.operator.advance_watermark(MAX_WATERMARK)
        return self._progress(False)

    def cmd_finish_plain(self) -> list[Committable]:
        """End without checkpoints: the rest of the output, for the parent to commit."""
        out: list[Committable] = []
        for s in self.subtasks:
            s.writer.prepare_commit(0)
            out.extend(s.writer._state.get())
            s.writer.notify_checkpoint_complete(0)
        return out

    def cmd_snapshot(self, barrier: int, fmt: SnapshotFormat) -> list[SubtaskSync]:
        """The synchronous phase of every subtask here: offsets, pre-commit, a fixed view."""
        uid = self.job.operator_uid
        out = []
        for s in self.subtasks:
            state = s.prepare_snapshot(barrier)
            backend = state.keyed[uid]
            # native if asked and the backend has it; else canonical (no delta: its chain
            # confirmation runs in the process that took the capture)
            native = backend.snapshot_strategy(fmt) if fmt is SnapshotFormat.NATIVE else None
            capture: Capture[Any]
            if isinstance(native, NativeSnapshotStrategy):
                capture = native.capture_at(uid, s.index, barrier)
            else:
                capture = CanonicalCapture(uid, s.index, backend, backend.snapshot_view())
            self._captures[(barrier, uid, s.index)] = capture
            operator = {
                name: (
                    list(b.snapshot_rows()),
                    {n: m.to_dict() for n, m in b.state_meta().items()},
                )
                for name, b in state.operator.items()
            }
            committables = [c for c in s.writer._state.get() if c["barrier"] == barrier]
            info = CaptureInfo(
                capture.key_group_range,
                capture.max_parallelism,
                capture.key_serializer,
                capture.states,
            )
            out.append(SubtaskSync(s.index, {uid: info}, operator, committables))
        return out

    def cmd_write(self, key: tuple[int, str, int], spec: WriteSpec) -> None:
        """Write one capture's files where the parent's manager says; reply when written."""
        capture = self._captures.pop(key)
        self.registry.clear()
        self.registry.register(spec.shared_files)
        snap = SnapshotDir.from_url(spec.url, spec.storage_options, allow_shared=spec.allow_shared)
        ctx = WriteContext(
            snapshot=snap,
            checkpoint_id=spec.checkpoint_id,
            savepoint=spec.savepoint,
            incremental=spec.incremental,
            cancelled=threading.Event(),
            registry=self.registry,
            row_group_bytes=spec.row_group_bytes,
        )

        def opened(path: str) -> None:
            self.send(("opened", key, path))

        work: Callable[[], Any]
        child: ForkedWrite[Any] | None = None
        spool: Spool | None = None
        if self.job.fork_writer and capture.forkable and can_fork(snap):
            try:
                capture.prepare(ctx)
                # on an object store the child writes into a local spool, uploaded below
                spool = spool_for(snap)
                into = ctx if spool is None else replace(ctx, snapshot=spool.snapshot)
                child = ForkedWrite(lambda report: capture.write_files(into, report))
            except OSError:
                child = None
                if spool is not None:
                    spool.remove()
            else:
                capture.release()
        if child is not None:
            forked, spooled = child, spool

            def work() -> Any:
                try:
                    written = forked.wait(cancelled=lambda: False, opened=opened)
                    if spooled is not None and written is not None:
                        spooled.upload(written.files, ctx.check)
                    return written
                finally:
                    if spooled is not None:
                        spooled.remove()
        else:

            def work() -> Any:
                try:
                    capture.prepare(ctx)
                    return capture.write_files(ctx, opened)
                finally:
                    capture.release()

        def run() -> None:
            try:
                result = capture.result(ctx, work())
                self.send(("written", key, result, None))
            except BaseException as exc:  # noqa: BLE001 - the parent fails the checkpoint
                self.send(("written", key, None, pickled_error(exc)))

        thread = threading.Thread(target=run, name=f"write-{key}", daemon=True)
        thread.start()
        self._writes = [t for t in self._writes if t.is_alive()] + [thread]
        return None

    def cmd_notify(self, barrier: int) -> None:
        for s in self.subtasks:
            s.writer.notify_checkpoint_complete(barrier)  # prunes; the parent committed
        return None

    def cmd_entries(self) -> list[StateEntry]:
        rows: list[StateEntry] = []
        for s in self.subtasks:
            with s.keyed.snapshot_view() as view:
                rows.extend(view.iter_entries())
        return rows

    def _shutdown(self, *, graceful: bool) -> None:
        for t in self._writes:
            t.join()
        for c in self._captures.values():
            with contextlib.suppress(Exception):
                c.release()
        for s in self.subtasks:
            if graceful:
                with contextlib.suppress(Exception):
                    s.operator.close()
            s.writer.abort()
            s.reader.close()
        for r in self.readers:
            r.close()
        for s in self.subtasks:
            with contextlib.suppress(Exception):
                s.keyed.close()
        reap_exited(block=True)


def pickled_error(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        payload = pickle.dumps((exc, text))
        pickle.loads(payload)
        return payload
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        return pickle.dumps((None, text))


def _arm(env: dict[str, str]) -> None:
    """Take the job process's environment as it was when the job started, and arm its crash
    points here. A worker is forked from the pool's forkserver, which kept the environment of
    when it started: storage credentials (``AWS_*``...), ``STATEKEEPER_*`` settings and crash
    points set since would otherwise never reach it (the fault module read the old one too)."""
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    os.environ.update(env)
    faults._ARMED = faults.parse(os.environ.get(faults.ENV_VAR, ""))
    faults._HITS.clear()


def worker_main(conn: Any, spec: WorkerSpec) -> None:
    """The entry point of a worker process."""
    runner: WorkerRunner | None = None
    # What the worker inherited from the forkserver (the runtime's modules, a preloaded main
    # script's data) lives as long as the worker: keep it out of the cycle collector's full
    # scans, which would also write to (and so copy) every page the fork shared (the gc docs'
    # advice for forked children; measured 4-7% of a fraud-workload worker's time). Held for
    # the worker's life: the forked checkpoint writers' holds nest inside it.
    hold_frozen()
    try:
        _arm(spec.env)
        if spec.cwd is not None:
            os.chdir(spec.cwd)
        runner = WorkerRunner(spec)
        runner.serve(conn)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent is gone or stopped us
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the job
        with contextlib.suppress(Exception):
            if runner is not None:
                runner.send(("error", pickled_error(exc)))
            else:
                conn.send(("error", pickled_error(exc)))
    finally:
        with contextlib.suppress(Exception):
            conn.close()
