"""The proof: a job killed midway and restored from its checkpoint, at another parallelism, on
either backend, from canonical or native snapshots, produces exactly the output and the final
state of a run that was never interrupted."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.rocksdb import RocksDBBackendFactory
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    FileSink,
    Job,
    JobRunner,
    RecordTimestampClock,
)
from state_engine.runtime.sinks import Sink
from tests.runtime.sk_runtime_jobs import UserActivity, make_source, multiset, state_set, user_of

PARTITIONS = 4
SMALL = 150  # records per partition in the matrix
EVERY = 150  # records between checkpoints
KILL_AT = 400


def proof_job(
    p: int,
    backend: Any,
    sink: Sink,
    *,
    per_partition: int = SMALL,
    fmt: str = "canonical",
    every: int = EVERY,
    execution: str = "threads",
) -> Job:
    return Job(
        "proof",
        make_source(PARTITIONS, per_partition),
        user_of,
        UserActivity(),
        sink,
        parallelism=p,
        backend=backend,
        clock=RecordTimestampClock(),
        checkpoint_interval_records=every,
        checkpoint_format=fmt,
        execution=execution,
    )


def reference(per_partition: int) -> tuple[Counter[str], set[tuple[Any, ...]]]:
    out = CollectedOutput()
    job = proof_job(2, None, CollectSink(out), per_partition=per_partition)
    with JobRunner(job.with_(checkpoint_interval_records=None)) as runner:
        runner.run()
        return multiset(out.records), state_set(runner.state_entries())


@pytest.fixture(scope="module")
def small_reference() -> tuple[Counter[str], set[tuple[Any, ...]]]:
    return reference(SMALL)


def backend_of(kind: str, base: Path) -> Any:
    return HeapBackendFactory() if kind == "heap" else RocksDBBackendFactory(base)


def kill_and_restore(
    tmp_path: Path,
    catalog: Any,
    *,
    before: str,
    fmt: str,
    after: str,
    new_p: int,
    sink_kind: str,
    per_partition: int = SMALL,
    kill_at: int = KILL_AT,
    every: int = EVERY,
    execution: str = "threads",
) -> tuple[Counter[str], set[tuple[Any, ...]]]:
    storage = str(tmp_path / "checkpoints")
    target = CollectedOutput()

    def sink() -> Sink:  # a new sink object per run; what it writes to outlives the kill
        return FileSink(tmp_path / "out") if sink_kind == "file" else CollectSink(target)

    def committed() -> list[Any]:
        return (
            FileSink(tmp_path / "out").read_committed() if sink_kind == "file" else target.records
        )

    first = JobRunner(
        proof_job(2, backend_of(before, tmp_path / "a"), sink(), per_partition=per_partition,
                  fmt=fmt, every=every, execution=execution),
        catalog=catalog,
        storage=storage,
    )  # fmt: skip
    killed = first.run_until(records=kill_at)
    assert killed.killed and not killed.finished and not killed.failed_checkpoints
    assert [c.checkpoint_id for c in killed.checkpoints] == list(range(1, kill_at // every + 1))
    assert {c.format for c in killed.checkpoints} == {fmt.upper()}
    # Output up to the last notified checkpoint is out; the last checkpoint completed but its
    # notification died with the job, so its output is not.
    before_restore = len(committed())
    assert 0 < before_restore < killed.records_out

    second = JobRunner(
        proof_job(new_p, backend_of(after, tmp_path / "b"), sink(), per_partition=per_partition,
                  fmt=fmt, every=every, execution=execution),
        catalog=catalog,
        storage=storage,
        restore_from="latest",
    )  # fmt: skip
    with second:
        done = second.run()
        assert done.finished and done.parallelism == new_p and not done.failed_checkpoints
        assert done.restored_from.checkpoint_id == killed.checkpoints[-1].checkpoint_id
        assert done.timings["restored_committables"] > 0
        assert (
            done.records_in
            == PARTITIONS * per_partition - killed.checkpoints[-1].checkpoint_id * every
        )
        assert sorted(p for ps in second.partitions() for p in ps) == sorted(
            make_source(PARTITIONS, 1).partitions()
        )
        state = state_set(second.state_entries())
    if sink_kind == "file":
        assert not list((tmp_path / "out" / ".staging").iterdir())
    return multiset(committed()), state


MATRIX = [
    pytest.param("heap", "canonical", "heap", 1, "collect"),
    pytest.param("heap", "canonical", "heap", 3, "file"),
    pytest.param("heap", "canonical", "rocksdb", 4, "collect"),
    pytest.param("heap", "delta", "heap", 3, "collect"),
    pytest.param("rocksdb", "canonical", "rocksdb", 3, "collect"),
    pytest.param("rocksdb", "canonical", "heap", 1, "file"),
    pytest.param("rocksdb", "native", "rocksdb", 1, "file"),
    pytest.param("rocksdb", "native", "rocksdb", 4, "collect"),
]


#: The matrix again with the subtasks in worker processes (delta checkpoints run in threads only).
PROCESS_MATRIX = [p for p in MATRIX if p.values[1] != "delta"]


@pytest.mark.parametrize(
    ("execution", "before", "fmt", "after", "new_p", "sink_kind"),
    [
        pytest.param("threads", *p.values, id="threads-" + "-".join(map(str, p.values)))
        for p in MATRIX
    ]
    + [
        pytest.param("processes", *p.values, id="processes-" + "-".join(map(str, p.values)))
        for p in PROCESS_MATRIX
    ],
)
def test_killed_and_restored_at_another_parallelism_equals_the_uninterrupted_run(
    tmp_path: Path,
    catalog: Any,
    small_reference: tuple[Counter[str], set[tuple[Any, ...]]],
    execution: str,
    before: str,
    fmt: str,
    after: str,
    new_p: int,
    sink_kind: str,
) -> None:
    output, state = kill_and_restore(
        tmp_path,
        catalog,
        before=before,
        fmt=fmt,
        after=after,
        new_p=new_p,
        sink_kind=sink_kind,
        execution=execution,
    )
    ref_output, ref_state = small_reference
    assert output == ref_output  # every record exactly once: no loss, no duplicate
    assert state == ref_state


def test_a_relocated_savepoint_restores_at_a_new_parallelism(
    tmp_path: Path, catalog: Any, small_reference: tuple[Counter[str], set[tuple[Any, ...]]]
) -> None:
    target = CollectedOutput()
    rocks = RocksDBBackendFactory(tmp_path / "a")
    job = proof_job(2, rocks, CollectSink(target)).with_(checkpoint_interval_records=None)
    first = JobRunner(job, catalog=catalog, storage=str(tmp_path / "checkpoints"))
    first.run_until(records=270, kill=False)
    savepoint = first.savepoint(tmp_path / "savepoints" / "sp-1")
    first.kill()
    assert savepoint.kind == "SAVEPOINT" and target.records == []  # savepoints do not commit
    moved = tmp_path / "elsewhere" / "sp-1"
    shutil.copytree(tmp_path / "savepoints" / "sp-1", moved)
    shutil.rmtree(tmp_path / "savepoints")
    second = JobRunner(
        job.with_(parallelism=3, backend=HeapBackendFactory()),
        catalog=catalog,
        storage=str(tmp_path / "checkpoints"),
        restore_from=moved.as_uri(),
    )
    with second:
        result = second.run()
        assert result.records_in == PARTITIONS * SMALL - 270
        assert state_set(second.state_entries()) == small_reference[1]
    assert multiset(target.records) == small_reference[0]


def test_the_full_stream_killed_at_p2_finishes_at_p4(tmp_path: Path, catalog: Any) -> None:
    """A few thousand records: the uninterrupted reference against a kill at parallelism 2 and
    a restore at parallelism 4 (RocksDB, native snapshots, file sink)."""
    per_partition = 750
    ref_output, ref_state = reference(per_partition)
    assert sum(ref_output.values()) > 2000
    output, state = kill_and_restore(
        tmp_path,
        catalog,
        before="rocksdb",
        fmt="native",
        after="rocksdb",
        new_p=4,
        sink_kind="file",
        per_partition=per_partition,
        kill_at=1900,
        every=600,
    )
    assert output == ref_output
    assert state == ref_state


def test_a_delta_job_on_the_default_heap_writes_deltas_after_its_first_base(
    tmp_path: Path, catalog: Any
) -> None:
    from state_engine.snapshot.metadata import FileKind, read_metadata
    from state_engine.snapshot.storage import CheckpointStorage

    job = proof_job(2, None, CollectSink(CollectedOutput()), fmt="delta").with_(retained=10)
    with JobRunner(job, catalog=catalog, storage=str(tmp_path / "checkpoints")) as runner:
        result = runner.run()
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    kinds = [
        {f.kind for f in read_metadata(storage.snapshot(c.location)).files}
        for c in result.checkpoints
    ]
    assert len(kinds) >= 3 and FileKind.DELTA not in kinds[0]
    # changes only, not a base each time
    assert any(FileKind.DELTA in k for k in kinds[1:])


def test_a_worker_process_sigkilled_mid_checkpoint_fails_the_run_and_a_restore_is_exact(
    tmp_path: Path,
    catalog: Any,
    small_reference: tuple[Counter[str], set[tuple[Any, ...]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RocksDB native incremental checkpoints, p=2 in two workers: each worker SIGKILLs itself
    after its 10th upload of a shared SST, which falls in checkpoint 2 (checkpoint 1 uploads 9
    per subtask). The run fails as a killed job, checkpoint 2 never completes, and a restore from
    checkpoint 1 finishes with exactly the uninterrupted run's output and state."""
    from state_engine.errors import JobError
    from state_engine.faults import ENV_VAR

    target = CollectedOutput()
    storage = str(tmp_path / "checkpoints")
    job = proof_job(
        2, RocksDBBackendFactory(tmp_path / "a"), CollectSink(target), fmt="native",
        execution="processes",
    ).with_(incremental=True)  # fmt: skip
    monkeypatch.setenv(ENV_VAR, "checkpoint.native.after_shared_upload:10")
    first = JobRunner(job, catalog=catalog, storage=storage)
    with pytest.raises(JobError, match="killed by signal 9"):
        first.run()
    monkeypatch.delenv(ENV_VAR)
    failed = first.result()
    assert failed.killed and not failed.finished
    assert [c.checkpoint_id for c in failed.checkpoints] == [1]
    statuses = {s.checkpoint_id: s.status for s in catalog.list_snapshots("proof")}
    assert statuses[1] == "COMPLETED" and statuses[2] != "COMPLETED"
    first.close()

    second = JobRunner(
        job.with_(backend=RocksDBBackendFactory(tmp_path / "b")),
        catalog=catalog,
        storage=storage,
        restore_from="latest",
    )
    with second:
        done = second.run()
        assert done.finished and done.restored_from.checkpoint_id == 1
        assert done.records_in == PARTITIONS * SMALL - EVERY
        state = state_set(second.state_entries())
    assert multiset(target.records) == small_reference[0]
    assert state == small_reference[1]
