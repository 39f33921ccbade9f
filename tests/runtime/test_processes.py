"""Process-parallel execution: the same output, state, counters and checkpoints as the
single-thread runner, savepoints across modes, how the mode is chosen, and what it refuses."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.errors import InvalidJob, JobError
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Context,
    Job,
    JobRunner,
    KeyedProcessFunction,
    RecordTimestampClock,
)
from state_engine.runtime.worker_pool import ProcessJobRunner, worker_count
from tests.runtime.sk_runtime_jobs import (
    UserActivity,
    make_source,
    multiset,
    proof_job,
    state_set,
    user_of,
)


def run_job(job: Job, out: CollectedOutput, **runner: Any) -> tuple[Any, Any, Any]:
    with JobRunner(job, **runner) as r:
        result = r.run()
        return multiset(out.records), state_set(r.state_entries()), result


@pytest.mark.parametrize(("p", "kind"), [(2, "heap"), (3, "rocksdb")])
def test_workers_give_the_single_thread_runs_output_state_counters_and_checkpoints(
    tmp_path: Path, catalog: Any, p: int, kind: str
) -> None:
    runs = {}
    for mode in ("threads", "processes"):
        backend = HeapBackendFactory() if kind == "heap" else RocksDBBackendFactory(tmp_path / mode)
        out = CollectedOutput()
        job = proof_job(p, backend, out, mode, checkpoint_interval_records=130).with_(
            name=f"proof-{mode}"
        )
        runs[mode] = run_job(job, out, catalog=catalog, storage=str(tmp_path / "ck"))
    (t_out, t_state, t_res), (p_out, p_state, p_res) = runs["threads"], runs["processes"]
    assert p_out == t_out and p_state == t_state
    assert p_res.timings["workers"] == worker_count(p)
    for field in ("records_in", "records_out", "timers_fired", "late_records", "finished"):
        assert getattr(p_res, field) == getattr(t_res, field), field
    # barriers at the same record counts: as many checkpoints, every one completed
    assert len(p_res.checkpoints) == len(t_res.checkpoints) == 600 // 130 + 1
    assert not p_res.failed_checkpoints


def test_checkpoints_due_by_time_in_processes_come_between_runs_of_records(
    tmp_path: Path, catalog: Any
) -> None:
    """A time interval in process mode: the parent asks the workers for at most
    TIME_CHECK_RECORDS records at a time and checkpoints when the interval has passed. An
    interval of a nanosecond has always passed, so the barriers fall exactly there."""
    from state_engine.runtime.worker_pool import TIME_CHECK_RECORDS

    per_partition = TIME_CHECK_RECORDS + TIME_CHECK_RECORDS // 4  # 2.5 batches over 2 partitions
    runs = {}
    for mode, interval in (("threads", None), ("processes", 1e-9)):
        out = CollectedOutput()
        job = Job(
            f"timed-{mode}",
            make_source(2, per_partition),
            user_of,
            UserActivity(),
            CollectSink(out),
            parallelism=2,
            backend=HeapBackendFactory(),
            clock=RecordTimestampClock(),
            execution=mode,
            checkpoint_interval_seconds=interval,
        )
        storage = {"catalog": catalog, "storage": str(tmp_path / "ck")} if interval else {}
        runs[mode] = run_job(job, out, **storage)
    (t_out, t_state, _), (p_out, p_state, p_res) = runs["threads"], runs["processes"]
    assert p_out == t_out and p_state == t_state
    total = 2 * per_partition
    assert len(p_res.checkpoints) == total // TIME_CHECK_RECORDS + 1  # and the final one
    assert not p_res.failed_checkpoints


def test_a_savepoint_taken_in_processes_restores_in_threads_at_another_parallelism(
    tmp_path: Path, catalog: Any
) -> None:
    out = CollectedOutput()
    ref_out, ref_state, _ = run_job(proof_job(2, None, out, "threads"), out)
    target = CollectedOutput()
    storage = str(tmp_path / "ck")
    first = JobRunner(
        proof_job(2, RocksDBBackendFactory(tmp_path / "a"), target, "processes"),
        catalog=catalog,
        storage=storage,
    )
    assert isinstance(first, ProcessJobRunner)
    assert first.run_until(records=270, kill=False).records_in == 270
    checkpoint = first.checkpoint()
    savepoint = first.savepoint(tmp_path / "sp")
    assert checkpoint.kind == "CHECKPOINT" and savepoint.kind == "SAVEPOINT"
    committed = len(target.records)  # the checkpoint committed the output up to it
    first.kill()
    assert committed > 0 and len(target.records) == committed
    second = JobRunner(
        proof_job(3, HeapBackendFactory(), target, "threads"),
        catalog=catalog,
        storage=storage,
        restore_from=(tmp_path / "sp").as_uri(),
    )
    with second:
        assert second.run().records_in == 600 - 270
        assert state_set(second.state_entries()) == ref_state
    assert multiset(target.records) == ref_out


def test_a_paused_and_continued_run_in_processes_equals_one_run() -> None:
    out, again = CollectedOutput(), CollectedOutput()
    with JobRunner(proof_job(3, None, out, "processes")) as runner:
        assert runner.run_until(records=250, kill=False).records_in == 250
        runner.run_until(records=400, kill=False)
        result = runner.run()
        assert sorted(p for ps in runner.partitions() for p in ps) == [f"gen-{i}" for i in range(4)]
    assert result.finished and result.records_in == 600
    JobRunner(proof_job(2, None, again, "threads")).run()
    assert multiset(out.records) == multiset(again.records)


def test_a_killed_run_in_processes_commits_nothing_and_holds_no_state() -> None:
    out = CollectedOutput()
    runner = JobRunner(proof_job(2, None, out, "processes"))
    assert isinstance(runner, ProcessJobRunner)
    result = runner.run_until(records=300)
    assert result.killed and result.records_in == 300 and result.records_out > 0
    assert out.records == []
    assert all(not _alive(pid) for pid in runner.worker_pids)
    with pytest.raises(JobError, match="killed"):
        runner.run()
    with pytest.raises(JobError, match="no live state"):
        runner.state_entries()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("zombie") < 0


def test_the_execution_comes_from_the_job_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = proof_job(2, None, CollectedOutput(), "threads").with_(execution=None)
    assert type(JobRunner(job)) is JobRunner
    monkeypatch.setenv("STATEKEEPER_EXECUTION", "processes")
    assert job.execution_mode == "processes"
    runner = JobRunner(job)
    assert isinstance(runner, ProcessJobRunner)
    runner.close()  # never started: no workers
    assert type(JobRunner(job.with_(execution="threads"))) is JobRunner
    monkeypatch.setenv("STATEKEEPER_EXECUTION", "gpu")
    with pytest.raises(InvalidJob, match="STATEKEEPER_EXECUTION"):
        JobRunner(job)


def test_what_processes_refuse(tmp_path: Path, catalog: Any) -> None:
    out = CollectedOutput()
    with pytest.raises(InvalidJob, match="execution"):
        proof_job(2, None, out, "cluster")
    with pytest.raises(InvalidJob, match="does not pickle"):
        JobRunner(proof_job(2, None, out, "processes").with_(key_selector=lambda r: r["user"]))
    delta = proof_job(2, None, out, "processes", checkpoint_interval_records=100)
    with pytest.raises(InvalidJob, match="delta"):
        JobRunner(
            delta.with_(checkpoint_format="delta"), catalog=catalog, storage=str(tmp_path / "c")
        )
    overlapping = delta.with_(max_concurrent_checkpoints=2)
    with pytest.raises(InvalidJob, match="max_concurrent_checkpoints=2 runs with execution='thr"):
        JobRunner(overlapping, catalog=catalog, storage=str(tmp_path / "c"))
    memory = JobRunner(delta, catalog=catalog, storage="memory://ck")
    with pytest.raises(InvalidJob, match="every process reaches"):
        memory.run()


_PRELOADED_SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
with open({runs!r}, "a") as f:  # one line each time this script's top level runs
    f.write(__name__ + "\\n")


def answer(queue):
    queue.put((os.getpid(), "STATEKEEPER_FORKSERVER_MAIN" in os.environ))


if __name__ == "__main__":
    from state_engine.runtime.worker_pool import _context, prestart

    prestart(preload=["__main__"])
    ctx = _context()
    queue = ctx.Queue()
    workers = [ctx.Process(target=answer, args=(queue,)) for _ in range(3)]
    for w in workers:
        w.start()
    got = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    # nobody else is handed the script to load: not this process' later children, not workers
    leaked = "STATEKEEPER_FORKSERVER_MAIN" in os.environ or any(env for _, env in got)
    print(len({{pid for pid, _ in got}}), leaked)
"""


def test_a_prestarted_pool_loads_the_main_script_once_not_once_per_worker(tmp_path: Path) -> None:
    """``prestart(preload=["__main__"])``: the script runs as itself and once more in the process
    workers fork from; the workers find its functions there and do not run it again (Python
    before 3.13 never loaded __main__ there, so each worker ran the whole script)."""
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[2])
    runs = tmp_path / "runs.txt"
    script = tmp_path / "script.py"
    script.write_text(_PRELOADED_SCRIPT.format(repo=repo, runs=str(runs)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "False"]  # three workers ran the script's function
    assert runs.read_text().split() == ["__main__", "__mp_main__"]


class _FreezeCount(KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: Context) -> None:
        ctx.output(gc.get_freeze_count())


def test_workers_keep_what_they_inherited_out_of_the_cycle_collectors_scans(
    tmp_path: Path, catalog: Any
) -> None:
    # A worker is forked with the forkserver's modules (and a preloaded main script's data) in
    # memory: a collection walking those objects writes to their headers, copying every page
    # the fork shared, on every full collection. The worker freezes them first (gc.freeze, as
    # the gc docs advise for forked children) for its whole life: the forked writers of its
    # checkpoints (one every 5 records here), which freeze and unfreeze around their child,
    # end nothing of it. The single-thread runner leaves the user's process as it is.
    counts = {}
    for mode in ("threads", "processes"):
        out = CollectedOutput()
        job = Job(
            f"frozen-{mode}",
            make_source(2, 40),
            user_of,
            _FreezeCount(),
            CollectSink(out),
            parallelism=2,
            backend=HeapBackendFactory(),
            execution=mode,
        )
        if mode == "threads":
            with JobRunner(job) as r:
                r.run()
        else:
            job = job.with_(checkpoint_interval_records=5)
            with JobRunner(job, catalog=catalog, storage=str(tmp_path / "ck")) as r:
                assert len(r.run().checkpoints) == 80 // 5 + 1
        counts[mode] = out.records
    assert set(counts["threads"]) == {gc.get_freeze_count()}
    assert len(counts["processes"]) == 80
    assert min(counts["processes"]) > 0
