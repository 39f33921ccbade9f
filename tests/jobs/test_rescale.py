"""Rescale on Spark, proven with the runtime: a job runs at parallelism 2, checkpoints and dies; the
checkpoint is rescaled to 3 (same max parallelism: metadata only) or to 4 with a new max
parallelism (re-bucketed by key hash); the job restored from the output at the new parallelism
finishes with exactly the output and final state of a run that was never rescaled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from state_engine.backends.operator_state import redistribute
from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.errors import (
    InvalidParallelism,
    MaintenanceJobFailed,
    NoSuchJob,
    SnapshotNotUsable,
)
from state_engine.jobs import rescale
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Job,
    JobRunner,
    RecordTimestampClock,
)
from state_engine.snapshot.metadata import FileKind, read_metadata, verify
from state_engine.snapshot.operator_rows import OperatorStateRow
from state_engine.snapshot.storage import SnapshotDir
from tests.jobs.jobdata import MAX_P, OP, make_snapshot
from tests.runtime.sk_runtime_jobs import UserActivity, make_source, multiset, state_set, user_of

PARTITIONS = 4
PER_PARTITION = 150
EVERY = 150
KILL_AT = 400


def _job(p: int, sink: Any, backend: Any = None, every: int | None = EVERY, **kw: Any) -> Job:
    return Job(
        "proof",
        make_source(PARTITIONS, PER_PARTITION),
        user_of,
        UserActivity(),
        sink,
        parallelism=p,
        backend=backend,
        clock=RecordTimestampClock(),
        checkpoint_interval_records=every,
        **kw,
    )


@pytest.fixture(scope="module")
def never_rescaled() -> tuple[Counter[str], set]:
    out = CollectedOutput()
    with JobRunner(_job(2, CollectSink(out), every=None)) as runner:
        runner.run()
        return multiset(out.records), state_set(runner.state_entries())


def _killed_at_p2(catalog: Catalog, storage: str, target: CollectedOutput, fmt: str, backend):
    first = JobRunner(
        _job(2, CollectSink(target), backend, checkpoint_format=fmt),
        catalog=catalog,
        storage=storage,
    )
    killed = first.run_until(records=KILL_AT)
    assert killed.killed and killed.checkpoints
    return killed.checkpoints[-1]


def test_union_split_and_broadcast_survive_a_second_redistribution() -> None:
    rows = [
        [OperatorStateRow("s", "SPLIT", 0, 0, b"a"), OperatorStateRow("u", "UNION", 0, 0, b"x"),
         OperatorStateRow("b", "BROADCAST", 0, 0, b"k")],
        [OperatorStateRow("s", "SPLIT", 1, 0, b"b"), OperatorStateRow("u", "UNION", 1, 0, b"y"),
         OperatorStateRow("u", "UNION", 1, 1, b"z"),
         OperatorStateRow("b", "BROADCAST", 1, 0, b"k")],
    ]  # fmt: skip
    for new_p in (1, 3, 5):
        stored = rescale.redistribute_for_snapshot(rows, new_p)
        restored = redistribute(stored, new_p)  # what a restore at new_p does
        direct = redistribute(rows, new_p)  # what restoring the old snapshot would give
        assert restored == direct


@pytest.mark.spark
def test_same_max_parallelism_is_metadata_only_and_restores_at_p3(
    spark: Any, catalog: Catalog, tmp_path: Path, never_rescaled
) -> None:
    storage = str(tmp_path / "checkpoints")
    target = CollectedOutput()
    chk = _killed_at_p2(catalog, storage, target, "canonical", HeapBackendFactory())
    in_meta = read_metadata(SnapshotDir.from_url(chk.location))
    report = rescale.run(spark, catalog, job="proof", parallelism=3)
    assert report["input_snapshot_id"] == chk.id and report["stats"]["metadata_only"]
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert out.status == "COMPLETED" and out.kind == "CHECKPOINT" and out.parallelism == 3
    snap = SnapshotDir.from_url(out.location)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    keyed_in = {f.checksum for f in in_meta.files if f.kind is FileKind.KEYED}
    keyed_out = [f for f in meta.files if f.kind is FileKind.KEYED]
    # nothing keyed rewritten: the same files, reached in the input's directory
    assert {f.checksum for f in keyed_out} == keyed_in
    assert all(f.path.startswith(f"../chk-{chk.checkpoint_id}/") for f in keyed_out)
    assert report["stats"]["files_written"] == len(
        [f for f in meta.files if f.kind is FileKind.OPERATOR]
    )
    assert [s.key_group_range for s in meta.operator("process").subtasks] == [
        (0, 42), (43, 85), (86, 127)
    ]  # fmt: skip
    # the catalog holds the reused files as shared by both snapshots
    shared = {f.path for f in catalog.snapshot_files(out.id) if f.shared}
    assert len(shared) == len(keyed_in)
    assert shared <= {f.path for f in catalog.snapshot_files(chk.id)}

    second = JobRunner(
        _job(3, CollectSink(target), RocksDBBackendFactory(tmp_path / "b")),
        catalog=catalog,
        storage=storage,
        restore_from=out.id,
    )
    with second:
        done = second.run()
        assert done.finished and done.parallelism == 3
        assert done.restored_from.id == out.id
        state = state_set(second.state_entries())
    assert multiset(target.records) == never_rescaled[0]
    assert state == never_rescaled[1]


@pytest.mark.spark
def test_new_max_parallelism_rebuckets_and_restores_at_p4(
    spark: Any, catalog: Catalog, tmp_path: Path, never_rescaled
) -> None:
    storage = str(tmp_path / "checkpoints")
    target = CollectedOutput()
    chk = _killed_at_p2(catalog, storage, target, "native", RocksDBBackendFactory(tmp_path / "a"))
    report = rescale.run(
        spark, catalog, snapshot=chk.id, parallelism=4, max_parallelism=256, tasks=3
    )
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert out.kind == "SAVEPOINT" and out.max_parallelism == 256 and out.parallelism == 4
    assert catalog.get_job("proof").max_parallelism == 256
    assert report["stats"]["metadata_only"] is False
    snap = SnapshotDir.from_url(out.location, allow_shared=False)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    assert meta.max_parallelism == 256 and not any(f.shared for f in meta.files)

    second = JobRunner(
        _job(4, CollectSink(target), HeapBackendFactory(), max_parallelism=256),
        catalog=catalog,
        storage=storage,
        restore_from=out.id,
    )
    with second:
        done = second.run()
        assert done.finished and done.parallelism == 4
        state = state_set(second.state_entries())
    assert multiset(target.records) == never_rescaled[0]
    assert state == never_rescaled[1]

    # The older checkpoint is still at max parallelism 128 while the job is now at 256: a rescale
    # of it with no max parallelism targets the job's, so the job can restore what it writes.
    again = rescale.run(spark, catalog, snapshot=chk.id, parallelism=3, tasks=2, run_id="again")
    out2 = catalog.get_snapshot(again["output_snapshot_id"])
    assert out2.max_parallelism == 256 and again["stats"]["metadata_only"] is False
    third = JobRunner(
        _job(3, CollectSink(CollectedOutput()), HeapBackendFactory(), max_parallelism=256),
        catalog=catalog,
        storage=storage,
        restore_from=out2.id,
    )
    with third:
        assert third.run().finished
        assert state_set(third.state_entries()) == never_rescaled[1]


@pytest.mark.spark
def test_bad_input_is_refused_recorded_and_creates_nothing(
    spark: Any, catalog: Catalog, storage
) -> None:
    made = make_snapshot(catalog, storage)
    sid = made.record.id
    cases = [
        ({"parallelism": 0}, InvalidParallelism, "must be a whole number >= 1"),
        ({"parallelism": 129}, InvalidParallelism, "exceeds max parallelism 128"),
        ({"parallelism": 2, "max_parallelism": 0}, InvalidParallelism, "out of range"),
        ({"parallelism": 2, "max_parallelism": 40000}, InvalidParallelism, "out of range"),
        ({"parallelism": 8, "max_parallelism": 4}, InvalidParallelism, "exceeds max"),
    ]
    for i, (params, error, text) in enumerate(cases):
        with pytest.raises(error, match=text):
            rescale.run(spark, catalog, snapshot=sid, run_id=f"bad-{i}", **params)
    # argument errors: none of them is a run
    assert not {r.run_id for r in catalog.list_runs()} & {f"bad-{i}" for i in range(len(cases))}
    pending = catalog.begin_snapshot("orders", location=storage.url_of("orders/x"), parallelism=1)
    with pytest.raises(SnapshotNotUsable, match="PENDING"):
        rescale.run(spark, catalog, snapshot=pending.id, parallelism=2, run_id="pend")
    assert catalog.get_run("pend").status == "FAILED"
    with pytest.raises(NoSuchJob):
        rescale.run(spark, catalog, job="nojob", parallelism=2, run_id="nojob")
    assert "nojob" not in {r.run_id for r in catalog.list_runs()}
    assert [s.id for s in catalog.list_snapshots("orders")] == [pending.id, sid]
    assert catalog.get_job("orders").max_parallelism == MAX_P


@pytest.mark.spark
def test_a_failing_task_leaves_nothing_and_keeps_the_max_parallelism(
    spark: Any, catalog: Catalog, storage
) -> None:
    made = make_snapshot(catalog, storage)
    src = SnapshotDir.from_url(made.record.location)
    meta = read_metadata(src)
    victim = meta.files_of(OP, kinds=(FileKind.KEYED,))[0]
    path = src.resolve(victim.path)
    good = src.fs.cat_file(path)
    src.fs.pipe_file(path, b"\0" * len(good))
    with pytest.raises(MaintenanceJobFailed):
        rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3, max_parallelism=512,
                    run_id="r1")  # fmt: skip
    assert catalog.get_run("r1").status == "FAILED"
    assert catalog.get_job("orders").max_parallelism == MAX_P
    (attempt,) = [s for s in catalog.list_snapshots("orders") if s.id != made.record.id]
    assert attempt.status == "FAILED"
    assert not SnapshotDir.from_url(attempt.location).fs.exists(
        SnapshotDir.from_url(attempt.location).path
    )
    src.fs.pipe_file(path, good)
    report = rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3,
                         max_parallelism=512, run_id="r1")  # fmt: skip
    assert catalog.get_job("orders").max_parallelism == 512
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert out.status == "COMPLETED" and report["rows_out"] == len(made.rows)


@pytest.mark.spark
def test_native_and_savepoint_inputs_at_the_same_max_parallelism_are_refused(
    spark: Any, catalog: Catalog, tmp_path: Path, storage
) -> None:
    made = make_snapshot(catalog, storage, kind="SAVEPOINT")
    with pytest.raises(SnapshotNotUsable, match="savepoint"):
        rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3, run_id="sp")
    assert catalog.get_run("sp").status == "FAILED"
    chk = _killed_at_p2(
        catalog, str(tmp_path / "chk"), CollectedOutput(), "native",
        RocksDBBackendFactory(tmp_path / "a"),
    )  # fmt: skip
    with pytest.raises(SnapshotNotUsable, match="canonical savepoint of it first"):
        rescale.run(spark, catalog, snapshot=chk.id, parallelism=3, run_id="native")
    assert "savepoint" in (catalog.get_run("native").error or "")


@pytest.mark.spark
def test_a_metadata_only_rescale_waits_for_the_file_lease(
    spark: Any, catalog: Catalog, storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a deleting job holds the job's file lease, the rescale does not read the source's
    files into a new checkpoint (they could be deleted under it): it waits, then gives up."""
    from state_engine.errors import DeletionLeaseTimeout
    from state_engine.maintenance.deletion import FileLease

    made = make_snapshot(catalog, storage)
    monkeypatch.setattr(rescale, "LEASE_WAIT_S", 0.0)
    holder = FileLease(catalog, "orders", "expire", "holder", wait=0)
    with holder, pytest.raises(DeletionLeaseTimeout):
        rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3, run_id="waits")
    assert catalog.get_run("waits").status == "FAILED"
    assert [s.id for s in catalog.list_snapshots("orders")] == [made.record.id]
    report = rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3, run_id="waits")
    assert catalog.get_snapshot(report["output_snapshot_id"]).status == "COMPLETED"


def _keyed_rows(location: str) -> list[tuple]:
    from state_engine.jobs.snapshot_read import range_batches
    from state_engine.snapshot.storage import ReadStats

    snap = SnapshotDir.from_url(location, allow_shared=False)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    rows: list[tuple] = []
    for b in range_batches(snap, meta, OP, 0, meta.max_parallelism - 1, ReadStats()):
        rows.extend(zip(*(b.column(i).to_pylist() for i in range(b.num_columns)), strict=True))
    return rows


@pytest.mark.spark
def test_new_max_parallelism_one_wave_and_spill_write_the_same_rows(
    spark: Any, catalog: Catalog, storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from state_engine.keygroups import key_groups_for_hashes

    made = make_snapshot(catalog, storage)
    chosen: list[int] = []
    real = rescale.direct_groups

    def recording(*a: Any) -> Any:
        chosen.append(real(*a))
        return chosen[-1]

    monkeypatch.setattr(rescale, "direct_groups", recording)
    outs = []
    for bound in (rescale.DIRECT_GROUP_BYTES, 0):  # one wave, then spill and merge
        monkeypatch.setattr(rescale, "DIRECT_GROUP_BYTES", bound)
        report = rescale.run(spark, catalog, snapshot=made.record.id, parallelism=3,
                             max_parallelism=512, tasks=4)  # fmt: skip
        assert report["rows_in"] == len(made.rows) == report["rows_out"]
        out = catalog.get_snapshot(report["output_snapshot_id"])
        snap = SnapshotDir.from_url(out.location, allow_shared=False)
        assert not snap.fs.exists(snap.resolve(rescale.SPILL_DIR))
        outs.append(_keyed_rows(out.location))
    assert chosen[0] >= 1 and chosen[1] == 0
    direct, spilled = outs
    assert direct == spilled and len(direct) == len(made.rows)
    kg = [r[0] for r in direct]
    assert kg == sorted(kg)
    assert kg == key_groups_for_hashes(np.array([r[1] for r in direct]), 512).tolist()
