"""Process-parallel execution: a job's subtasks in up to min(parallelism, cores) worker processes.

The parent coordinates: it owns the checkpoint manager (catalog and ``_metadata``) and the sink's
commits; each worker (:mod:`state_engine.runtime.worker`) runs a contiguous share of the keyed
subtasks with their own backends, timers and sink writers. Every worker reads every source
partition in the single-thread runner's order and keeps the records of its key groups, so a
barrier is a record count, aligned on every channel by construction (``docs/architecture.md``,
"The runtime").

Why not route in the parent: reading and routing are ~36% of a record's cost at parallelism 1 on
bench/peers.py's counts workload and ~11% on the fraud workload, and one worker's share takes
0.72x / 0.55x of the parallelism-1 time, which bounds p=2 to ~1.4x and ~1.8x of p=1 on two idle
cores; routing in the parent would pay the read once but add a pickle and an unpickle per record
on a third process sharing the same cores (estimated no better on the counts workload).

A worker reports each file before creating it, so a worker that dies leaves nothing unknown; it
fails the run as a killed job, and a restore from the last completed checkpoint gives
exactly-once output.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing import spawn
from typing import TYPE_CHECKING, Any

from state_engine.backends.heap import HeapBackendFactory
from state_engine.checkpoint.state import SubtaskState
from state_engine.errors import InvalidJob, JobError
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.runtime import forkserver_main
from state_engine.runtime.coordinator import CheckpointCoordinator
from state_engine.runtime.runner import JobResult, JobRunner
from state_engine.runtime.sinks import Committable
from state_engine.runtime.watermarks import MAX_WATERMARK
from state_engine.runtime.worker import (
    CaptureInfo,
    Progress,
    RestoreSpec,
    SubtaskSync,
    WorkerSpec,
    WriteSpec,
    worker_main,
)
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.snapshot.strategy import Capture, SubtaskResult, WriteContext
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind
from state_engine.state.meta import StateEntry

if TYPE_CHECKING:
    from state_engine.catalog import SnapshotRecord

#: Records between two looks at a time-interval checkpoint (workers run this far in one go).
TIME_CHECK_RECORDS = 4096
#: How often the parent, waiting for its workers, finishes completed checkpoints (seconds).
_POLL_S = 0.02


def worker_count(parallelism: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(parallelism, cores))


def _context() -> Any:
    # RocksDB handles and threads do not survive fork: workers start from a clean process
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["state_engine.runtime.worker"])
        return ctx
    return multiprocessing.get_context("spawn")


def prestart(preload: Sequence[str] = ()) -> None:
    """Start the process worker processes are forked from now, and wait until it imported the
    runtime (once per parent process), rather than when the first process-parallel job
    starts: a standing pool, as Flink's task managers are up before a job is submitted.
    ``preload``: more modules it imports first (``"__main__"``: the parent's main script), so
    every worker starts with them (and what they load) in memory. No effect once started."""
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        modules = ["state_engine.runtime.worker", *preload]
        main_path = spawn.get_preparation_data("statekeeper").get("init_main_from_path")
        if "__main__" in preload and main_path is not None:
            # the forkserver of Python < 3.13 does not load __main__ itself (see forkserver_main)
            os.environ[forkserver_main.ENV_VAR] = json.dumps(
                {"main_path": main_path, "sys_path": sys.path}
            )
            modules.insert(0, forkserver_main.__name__)
        ctx.set_forkserver_preload(modules)
        proc = ctx.Process(target=_started, name="statekeeper-prestart")
        try:
            proc.start()  # starts the forkserver, with the environment as it is now
        finally:
            # only the forkserver reads it: other processes this one starts must not
            os.environ.pop(forkserver_main.ENV_VAR, None)
        proc.join()


def _started() -> None:
    """A worker that does nothing: its fork means the server has imported the runtime."""


class _Meta:
    """An operator state's meta as the manager reads it (``to_dict``)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def to_dict(self) -> dict[str, Any]:
        return self._d


class _RemoteOperatorState:
    """A worker subtask's operator state rows, copied at the barrier."""

    def __init__(self, rows: list[Any], metas: dict[str, dict[str, Any]]) -> None:
        self._rows = rows
        self._metas = metas

    def snapshot_rows(self) -> list[Any]:
        return self._rows

    def state_meta(self) -> dict[str, _Meta]:
        return {n: _Meta(m) for n, m in self._metas.items()}


class RemoteCapture(Capture[SubtaskResult]):
    """A capture a worker took at the barrier; its files are written by the worker."""

    forkable = False

    def __init__(self, pool: _Workers, key: tuple[int, str, int], info: CaptureInfo) -> None:
        self.operator_uid = key[1]
        self.subtask_index = key[2]
        self.backend = None  # type: ignore[assignment]  # no local backend: the worker holds it
        self.key_group_range = info.key_group_range
        self.max_parallelism = info.max_parallelism
        self.key_serializer = info.key_serializer
        self.states = info.states
        self._pool = pool
        self._key = key
        self.future: Future[SubtaskResult] = Future()

    def write_files(self, ctx: WriteContext, opened: Any) -> SubtaskResult:
        return self.future.result()

    def result(self, ctx: WriteContext, written: SubtaskResult) -> SubtaskResult:
        return written

    def release(self) -> None:
        pass


class RemoteBackend:
    """A keyed backend in a worker, as the checkpoint manager sees it at the barrier."""

    def __init__(self, pool: _Workers, barrier: int, uid: str, index: int, info: CaptureInfo):
        self._pool = pool
        self._barrier = barrier
        self._uid = uid
        self._index = index
        self._info = info
        self.max_parallelism = info.max_parallelism
        p = pool.parallelism
        self.key_group_range = compute_key_group_range_for_operator_index(
            info.max_parallelism, p, index
        )

    def remote_capture(
        self, fmt: Any, uid: str, index: int, record: Any, ctx: WriteContext
    ) -> Capture[Any]:
        key = (self._barrier, uid, index)
        capture = RemoteCapture(self._pool, key, self._info)
        self._pool.write(key, capture, ctx)
        return capture


class _RemoteSubtask:
    """Subtask ``index`` as the coordinator sees it (a barrier participant)."""

    def __init__(self, pool: _Workers, index: int) -> None:
        self.pool = pool
        self.index = index

    def prepare_snapshot(self, barrier: int) -> SubtaskState:
        sync = self.pool.sync_phase(barrier)[self.index]
        return SubtaskState(
            subtask_index=self.index,
            # RemoteBackend and _RemoteOperatorState stand in for the worker's backends (duck
            # typing: the manager finds RemoteBackend's remote_capture, and reads only
            # snapshot_rows/state_meta of operator state); SubtaskState's field types do not say so
            keyed={
                uid: RemoteBackend(self.pool, barrier, uid, self.index, info)  # type: ignore[misc]  # duck-typed
                for uid, info in sync.keyed.items()
            },
            operator={
                uid: _RemoteOperatorState(rows, metas)  # type: ignore[misc]  # duck-typed
                for uid, (rows, metas) in sync.operator.items()
            },
        )

    def notify_checkpoint_complete(self, barrier: int) -> None:
        self.pool.notify(self.index, barrier)


class _Workers:
    """The worker processes of one run and the parent's side of their pipes."""

    def __init__(self, runner: ProcessJobRunner, restore: RestoreSpec | None) -> None:
        job, p = runner.job, runner.parallelism
        self.job = job
        self.parallelism = p
        n = worker_count(p)
        self.owned: list[list[int]] = [[] for _ in range(n)]
        for i in range(p):
            self.owned[i * n // p].append(i)
        self.worker_of = {i: w for w, idx in enumerate(self.owned) for i in idx}
        self.kind = SnapshotKind.CHECKPOINT
        self.format = SnapshotFormat(job.checkpoint_format.upper())
        self.inbox: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.captures: dict[tuple[int, str, int], tuple[RemoteCapture, WriteContext]] = {}
        self.lock = threading.Lock()
        self.dead: dict[int, str] = {}
        self._sync: tuple[int, dict[int, SubtaskSync]] | None = None
        self.pending: dict[int, list[Committable]] = {i: [] for i in range(p)}
        self._notified: dict[int, int] = {}
        self.progress: list[Progress | None] = [None] * n
        #: how the workers reach the checkpoint storage (set by the runner)
        self.storage_options: dict[str, Any] = {}
        ctx = _context()
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        self.readers: list[threading.Thread] = []
        try:
            for w in range(n):
                ours, theirs = ctx.Pipe()
                env = dict(os.environ)  # as the job's process has it now (see worker._arm)
                spec = WorkerSpec(job, p, self.owned[w], runner.attempt, restore, env, os.getcwd())
                proc = ctx.Process(
                    target=worker_main, args=(theirs, spec), name=f"{job.name}-worker-{w}"
                )
                proc.daemon = True
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
            for w, conn in enumerate(self.conns):
                t = threading.Thread(
                    target=self._read, args=(w, conn), name=f"{job.name}-pipe-{w}", daemon=True
                )
                t.start()
                self.readers.append(t)
        except BaseException:
            self.stop(graceful=False)
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # --- the pipes ---

    def _read(self, w: int, conn: Any) -> None:
        """Worker ``w``'s messages: file reports straight to their capture, the rest inbox."""
        try:
            while True:
                msg = conn.recv()
                kind = msg[0]
                if kind == "opened":
                    entry = self.captures.get(msg[1])
                    if entry is not None:
                        entry[1].created.append(msg[2])
                elif kind == "written":
                    with self.lock:
                        entry = self.captures.pop(msg[1], None)
                    if entry is not None:
                        if msg[3] is None:
                            entry[0].future.set_result(msg[2])
                        else:
                            entry[0].future.set_exception(_error(msg[3], w))
                else:
                    self.inbox.put((w, msg))
        except (EOFError, OSError):
            pass
        self._died(w)

    def _died(self, w: int) -> None:
        proc = self.procs[w]
        with contextlib.suppress(Exception):
            proc.join(timeout=5)
        why = f"worker process {w} (pid {proc.pid}) ended ({_exit(proc.exitcode)})"
        with self.lock:
            self.dead[w] = why
            lost = [k for k in self.captures if self.worker_of[k[2]] == w]
            entries = [self.captures.pop(k) for k in lost]
        for capture, _ in entries:
            capture.future.set_exception(JobError(why + " while writing its snapshot files"))
        self.inbox.put((w, ("died", why)))

    def send(self, w: int, message: tuple[Any, ...]) -> None:
        if w in self.dead:
            raise JobError(self.dead[w])
        try:
            self.conns[w].send(message)
        except (OSError, EOFError) as exc:
            # a broken pipe: the worker ended; say how (its exit status), as its reader does
            proc = self.procs[w]
            with contextlib.suppress(Exception):
                proc.join(timeout=5)
            why = f"worker process {w} (pid {proc.pid}) ended ({_exit(proc.exitcode)})"
            raise JobError(f"{why}; sending to it failed ({exc})") from exc

    def ask(self, message: tuple[Any, ...], workers: Sequence[int] | None = None,
            poll: Any = None) -> dict[int, Any]:  # fmt: skip
        """Send ``message`` to every worker (or those given) and wait for each reply; ``poll``
        runs while waiting (the coordinator finishing snapshots)."""
        todo = list(range(len(self.conns))) if workers is None else list(workers)
        for w in todo:
            self.send(w, message)
        replies: dict[int, Any] = {}
        while len(replies) < len(todo):
            try:
                w, msg = self.inbox.get(timeout=_POLL_S if poll is not None else None)
            except queue.Empty:
                poll()
                continue
            if msg[0] == "ok":
                replies[w] = msg[1]
            elif msg[0] == "error":
                raise _error(msg[1], w)
            else:  # died
                raise JobError(msg[1])
        if poll is not None:
            poll()
        return replies

    # --- checkpoints ---

    def sync_phase(self, barrier: int) -> dict[int, SubtaskSync]:
        """Every subtask's synchronous phase at ``barrier`` (asked of the workers once)."""
        if self._sync is None or self._sync[0] != barrier:
            fmt = SnapshotFormat.CANONICAL if self.kind is SnapshotKind.SAVEPOINT else self.format
            got = self.ask(("snapshot", barrier, fmt))
            by_index = {s.index: s for syncs in got.values() for s in syncs}
            for s in by_index.values():
                self.pending[s.index].extend(s.committables)
            self._sync = (barrier, by_index)
        return self._sync[1]

    def write(self, key: tuple[int, str, int], capture: RemoteCapture, ctx: WriteContext) -> None:
        snap = ctx.snapshot
        files = [f for p in ctx.registry.paths() if (f := ctx.registry.lookup(p)) is not None]
        spec = WriteSpec(
            url=snap.url,
            storage_options=self.storage_options,
            allow_shared=snap.allow_shared,
            checkpoint_id=ctx.checkpoint_id,
            savepoint=ctx.savepoint,
            incremental=ctx.incremental,
            row_group_bytes=ctx.row_group_bytes,
            shared_files=files,
        )
        w = self.worker_of[key[2]]
        with self.lock:
            if w in self.dead:
                raise JobError(self.dead[w])
            self.captures[key] = (capture, ctx)
        self.send(w, ("write", key, spec))

    def notify(self, index: int, barrier: int) -> None:
        """Checkpoint ``barrier`` completed: commit subtask ``index``'s output up to it."""
        pending = self.pending[index]
        done = [c for c in pending if c["barrier"] <= barrier]
        if done:
            self.job.sink.commit(done)
            self.pending[index] = [c for c in pending if c["barrier"] > barrier]
        w = self.worker_of[index]
        if self._notified.get(w, 0) < barrier and w not in self.dead:
            self._notified[w] = barrier
            with contextlib.suppress(JobError):
                self.send(w, ("notify", barrier))

    # --- shutdown ---

    def stop(self, *, graceful: bool) -> None:
        """Stop every worker: ``graceful`` closes functions and backends; otherwise killed."""
        if graceful:
            with contextlib.suppress(JobError):
                self.ask(("close", True), [w for w in range(len(self.conns)) if w not in self.dead])
        for proc in self.procs:
            if proc.is_alive() and not graceful:
                proc.kill()
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.close()
        for t in self.readers:
            t.join(timeout=5)


def _error(payload: bytes, w: int) -> BaseException:
    exc: BaseException | None
    text: str
    exc, text = pickle.loads(payload)  # the worker pickled (its exception or None, traceback)
    if exc is None:
        return JobError(f"worker process {w} failed:\n{text}")
    exc.add_note(f"raised in worker process {w}:\n{text}")
    return exc


def _exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


class ProcessJobRunner(JobRunner):
    """:class:`JobRunner` with the subtasks in worker processes (``Job(execution="processes")``).

    Same results as the single-thread runner: the same records reach each subtask in the same
    order and checkpoints fall on the same record counts. ``checkpoint_format="delta"`` is not
    available here (its change tracking lives with the manager): use canonical or native; nor
    is ``max_concurrent_checkpoints`` above 1 (one checkpoint at a time).
    """

    def __init__(self, job: Any, **kwargs: Any) -> None:
        super().__init__(job, **kwargs)
        if SnapshotFormat.from_option(job.checkpoint_format) is SnapshotFormat.DELTA:
            raise InvalidJob(
                f"job {job.name!r}: checkpoint_format 'delta' runs with execution='threads' "
                "only; use 'canonical' or 'native' with execution='processes'"
            )
        if job.max_concurrent_checkpoints != 1:
            raise InvalidJob(
                f"job {job.name!r}: max_concurrent_checkpoints={job.max_concurrent_checkpoints!r} "
                "runs with execution='threads' only; worker processes take one checkpoint at a "
                "time (leave it at 1)"
            )
        try:
            pickle.dumps(job)
        except Exception as exc:  # noqa: BLE001 - pickle raises several types
            raise InvalidJob(
                f"job {job.name!r}: execution='processes' sends the job to worker processes, "
                f"but it does not pickle ({type(exc).__name__}: {exc}); define its functions and "
                "classes at module level (no lambdas or local classes), or run it with "
                "execution='threads'"
            ) from None
        self.workers: _Workers | None = None
        self._partitions: list[list[str]] = []
        self._stopped = False

    # --- setup ---

    def _setup(self) -> None:
        started = time.perf_counter()
        job, p = self.job, self.parallelism
        factory = job.backend if job.backend is not None else HeapBackendFactory()
        restore: RestoreSpec | None = None
        storage: CheckpointStorage | None = None
        if self.catalog is not None and self.storage is not None:
            self.manager = self._new_manager(self.catalog, self.storage)
            storage = self.manager.storage
            if storage.store.protocol == "memory":
                self.manager.close()
                raise InvalidJob(
                    f"job {job.name!r}: execution='processes' needs checkpoint storage every "
                    f"process reaches; {storage.root_url} is in this process only"
                )
            if self.restore_from is not None:
                # which snapshot, and the manager's own bookkeeping; the workers read the state
                result = self._restore_through(
                    self.manager, self.restore_from, factory, subtask_indexes=[]
                )
                self.restored_from = result.snapshot
                restore = RestoreSpec(
                    self.catalog.engine.url.render_as_string(hide_password=False),
                    storage.root_url,
                    storage.storage_options,
                    result.snapshot.id,
                )
        workers = self.workers = _Workers(self, restore)
        if storage is not None:
            workers.storage_options = storage.storage_options
        try:
            got = self._setup_replies(workers)  # each worker reports once it is set up
            positions: dict[int, list[tuple[str, int]]] = {}
            committables: list[Committable] = []
            for held, restored, _snapshot in got.values():
                positions.update(held)
                committables.extend(restored)
            held_parts = {part for ps in positions.values() for part, _ in ps}
            new: list[list[str]] = [[] for _ in range(p)]
            fresh = [part for part in job.source.partitions() if part not in held_parts]
            for j, part in enumerate(fresh):
                new[j % p].append(part)
            self._partitions = [
                [part for part, _ in positions.get(i, [])] + new[i] for i in range(p)
            ]
            workers.ask(("assign", positions, new))
            job.sink.recover(committables)
        except BaseException:
            self._stop_workers(graceful=False)
            if self.manager is not None:
                self.manager.close(wait=True)
            raise
        if self.manager is not None:
            self.coordinator = CheckpointCoordinator(
                self.manager,
                [_RemoteSubtask(workers, i) for i in range(p)],
                interval_records=job.checkpoint_interval_records,
                interval_seconds=job.checkpoint_interval_seconds,
            )
        self._started = True
        self._timings["setup_s"] = time.perf_counter() - started
        self._timings["restored_committables"] = len(committables)
        self._timings["workers"] = len(workers.procs)

    @staticmethod
    def _setup_replies(workers: _Workers) -> dict[int, Any]:
        replies: dict[int, Any] = {}
        while len(replies) < len(workers.conns):
            w, msg = workers.inbox.get()
            if msg[0] == "ok":
                replies[w] = msg[1]
            elif msg[0] == "error":
                raise _error(msg[1], w)
            else:
                raise JobError(msg[1])
        return replies

    # --- running ---

    def _pump(self, limit: int | None) -> bool:
        started = time.perf_counter()
        try:
            return self._run_workers(limit)
        except BaseException:
            self._fail()
            raise
        finally:
            self._timings["run_s"] += time.perf_counter() - started

    def _run_workers(self, limit: int | None) -> bool:
        workers, coordinator = self.workers, self.coordinator
        assert workers is not None
        poll = coordinator.poll if coordinator is not None else None
        while True:
            n = self._records_in
            target = limit
            if coordinator is not None:
                nxt = coordinator.next_barrier()
                if coordinator.interval_seconds is not None:
                    nxt = min(nxt or n + TIME_CHECK_RECORDS, n + TIME_CHECK_RECORDS)
                if nxt is not None and (target is None or nxt < target):
                    target = nxt
            got = workers.ask(("run", target), poll=poll)
            self._take(got)
            n = self._records_in
            reached = all(pr.reached for pr in got.values())
            if coordinator is not None and reached:
                coordinator.poll()
                if coordinator.due(n):
                    workers.kind = SnapshotKind.CHECKPOINT
                    coordinator.trigger(n)
            if not reached:
                return False
            if limit is not None and n >= limit:
                return True

    def _take(self, got: dict[int, Progress]) -> None:
        assert self.workers is not None
        counts = {pr.records_in for pr in got.values()}
        if len(counts) != 1:
            raise JobError(
                f"job {self.job.name!r}: the workers disagree on the records read ({counts}); "
                "the source must give the same records on every read"
            )
        for w, pr in got.items():
            self.workers.progress[w] = pr
        self._records_in = counts.pop()
        self._watermark = max(pr.watermark for pr in got.values())

    def _end_of_input(self) -> None:
        assert self.workers is not None
        try:
            self._take(self.workers.ask(("end",)))
            self._watermark = MAX_WATERMARK
            if self.coordinator is not None:
                self.workers.kind = SnapshotKind.CHECKPOINT
                flight = self.coordinator.trigger(self._records_in, trigger="final")
                self.coordinator.wait(flight)
            else:
                got = self.workers.ask(("finish_plain",))
                self.job.sink.commit([c for cs in got.values() for c in cs])
        except BaseException:
            self._fail()
            raise
        self._finished = True

    def _snapshot(self, kind: str, directory: str | None) -> SnapshotRecord:
        self._ensure_running()
        if self.workers is not None:
            self.workers.kind = SnapshotKind(kind.upper())
        try:
            return super()._snapshot(kind, directory)
        finally:
            if self.workers is not None:
                self.workers.kind = SnapshotKind.CHECKPOINT

    # --- failure and shutdown ---

    def _fail(self) -> None:
        """A worker died or failed: stop as a killed job (the caller raises)."""
        if self._killed or self._closed:
            return
        self._killed = True
        self._stop_workers(graceful=False)
        if self.coordinator is not None:
            with contextlib.suppress(Exception):
                self.coordinator.wait_all(notify=False)
        if self.manager is not None:
            self.manager.close(wait=True)

    def _stop_workers(self, *, graceful: bool) -> None:
        if self.workers is not None and not self._stopped:
            self._stopped = True
            self.workers.stop(graceful=graceful)

    def kill(self) -> None:
        if self._killed or self._closed:
            return
        self._killed = True
        if self.coordinator is not None:
            # the in-flight snapshot's files land (the workers still run), nobody is told
            with contextlib.suppress(Exception):
                self.coordinator.wait_all(notify=False)
        self._stop_workers(graceful=False)
        if self.manager is not None:
            self.manager.close(wait=True)

    def close(self) -> None:
        if self._closed:
            return
        if not self._killed and self._started:
            try:
                if self.coordinator is not None:
                    self.coordinator.wait_all(notify=True)
            finally:
                self._stop_workers(graceful=True)
                if self.manager is not None:
                    self.manager.close(wait=True)
        elif not self._killed and self.manager is not None:
            self.manager.close(wait=True)
        self._closed = True

    # --- results and state ---

    def result(self) -> JobResult:
        base = super().result() if self.workers is None else None
        if base is not None:
            return base
        assert self.workers is not None
        progress = [pr for pr in self.workers.progress if pr is not None]
        result = JobResult(
            job=self.job.name,
            parallelism=self.parallelism,
            records_in=self._records_in,
            records_out=sum(pr.records_out for pr in progress),
            records_skipped=sum(pr.records_skipped for pr in progress),
            late_records=sum(pr.late_records for pr in progress),
            timers_fired=sum(pr.timers_fired for pr in progress),
            finished=self._finished,
            killed=self._killed,
            watermark=self._watermark,
            restored_from=self.restored_from,
        )
        self._timings["worker_cpu_s"] = [round(pr.cpu_s, 3) for pr in progress]
        if self.coordinator is not None:
            stats = self.coordinator.stats
            result.checkpoints = list(stats.completed)
            result.savepoints = list(stats.savepoints)
            result.failed_checkpoints = list(stats.failed)
            result.timings = {**self._timings, "checkpoint_sync_ms": list(stats.sync_ms)}
        else:
            result.timings = {**self._timings, "checkpoint_sync_ms": []}
        return result

    def state_entries(self) -> list[StateEntry]:
        if self._killed or self._closed or not self._started or self.workers is None:
            raise JobError(f"job {self.job.name!r} holds no live state (not started, or stopped)")
        got = self.workers.ask(("entries",))
        return [e for w in sorted(got) for e in got[w]]

    def partitions(self) -> list[list[str]]:
        return [list(ps) for ps in self._partitions]

    def operator_state(self, subtask: int) -> Any:
        raise JobError(
            f"job {self.job.name!r} runs its subtasks in worker processes: their operator state "
            "is there (take a checkpoint and read it, or run with execution='threads')"
        )

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (empty before the job started)."""
        return self.workers.pids if self.workers is not None else []


JobRunner.process_runner = ProcessJobRunner
