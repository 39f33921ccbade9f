"""Compaction on Spark: a heap delta chain folded into one canonical checkpoint that restores equal
to the chain, replaces it for ``latest``, releases it through the catalog, and leaves the running
job's later delta checkpoints correct."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import CheckpointManager, HeapBackendFactory
from state_engine.errors import InvalidJobParams, MaintenanceJobFailed
from state_engine.jobs import compaction
from state_engine.jobs.snapshot_read import fold_range
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.maintenance.output import begin_output
from state_engine.maintenance.ranges import RangeOutput, WriteRange
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Job,
    JobRunner,
    RecordTimestampClock,
)
from state_engine.serde import StrSerializer
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    CanonicalWriter,
    read_entries,
    write_operator_state,
)
from state_engine.snapshot.delta import (
    CLEAR,
    DELETE,
    DELTA_SCHEMA,
    PUT,
    fold,
    read_folded,
)
from state_engine.snapshot.metadata import (
    FileKind,
    OperatorSnapshot,
    SnapshotMetadata,
    read_metadata,
    verify,
)
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat
from state_engine.state.meta import StateEntry
from tests.jobs.jobdata import MAX_P, OP, job_rows
from tests.runtime.sk_runtime_jobs import UserActivity, make_source, multiset, state_set, user_of

PARTITIONS = 4
PER_PARTITION = 150
EVERY = 60


# --- the vectorised fold against the reference fold (no Spark) ---


def _random_chain(seed: int) -> tuple[list[tuple], list[list[tuple]]]:
    rnd = random.Random(seed)
    keys = [(kg, f"k{kg}-{i}".encode()) for kg in range(4) for i in range(3)]
    states = ["v", "m"]
    base = {}
    for kg, k in keys:
        for st in states:
            for uk in [None] if st == "v" else [b"a", b"b"]:
                if rnd.random() < 0.7:
                    base[(kg, k, b"", st, uk)] = (kg, 7, k, b"", st, uk, rnd.randbytes(3), None)
    base_rows = sorted(base.values(), key=lambda r: r[0])
    deltas = []
    for _ in range(rnd.randint(1, 4)):
        rows, seq = [], 0
        for _ in range(rnd.randint(0, 12)):
            kg, k = rnd.choice(keys)
            st = rnd.choice(states)
            op = rnd.choice([PUT, PUT, DELETE, CLEAR])
            uk = None if st == "v" or op == CLEAR else rnd.choice([b"a", b"b", b"c"])
            seq += rnd.choice([0, 1])  # equal seqs resolve by file order
            value = rnd.randbytes(3) if op == PUT else b""
            rows.append((kg, 7, k, b"", st, uk, value, None, op, seq))
        deltas.append(sorted(rows, key=lambda r: r[0]))
    return base_rows, deltas


def _batch(rows: list[tuple], schema: pa.Schema) -> list[pa.RecordBatch]:
    if not rows:
        return []
    cols = list(zip(*rows, strict=True))
    return [pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(cols, schema,
                                                                             strict=True)],
                                       schema=schema)]  # fmt: skip


@pytest.mark.parametrize("seed", range(60))
def test_the_vectorised_fold_equals_the_reference_fold(seed: int) -> None:
    base, deltas = _random_chain(seed)
    want = fold(base, deltas)
    got_batches = list(
        fold_range(_batch(base, KEYED_SCHEMA), [_batch(d, DELTA_SCHEMA) for d in deltas])
    )
    got = [tuple(r.values()) for b in got_batches for r in b.to_pylist()]
    kgs = [r[0] for r in got]
    assert kgs == sorted(kgs)  # key-group order for the writer
    assert sorted(got, key=repr) == sorted((tuple(e) for e in want), key=repr)


# --- Spark ---


def _job(sink: Any, every: int | None = EVERY) -> Job:
    return Job(
        "proof",
        make_source(PARTITIONS, PER_PARTITION),
        user_of,
        UserActivity(),
        sink,
        parallelism=2,
        backend=HeapBackendFactory(track_changes=True),
        clock=RecordTimestampClock(),
        checkpoint_interval_records=every,
        checkpoint_format="delta",
    )


def _restored_state(catalog: Catalog, storage: str, snapshot: Any, p: int = 2) -> set:
    mgr = CheckpointManager(catalog, storage, "proof", max_parallelism=128, parallelism=p)
    try:
        restored = mgr.restore(snapshot, parallelism=p, factory=HeapBackendFactory())
        rows: list[StateEntry] = []
        for st in restored.subtasks:
            for b in st.keyed.values():
                with b.snapshot_view() as view:
                    rows.extend(view.iter_entries())
        return state_set(rows)
    finally:
        mgr.close()


@pytest.mark.spark
def test_a_delta_chain_compacts_into_a_checkpoint_that_replaces_it(
    spark: Any, catalog: Catalog, tmp_path: Path
) -> None:
    storage = str(tmp_path / "checkpoints")
    ref_out = CollectedOutput()
    with JobRunner(_job(CollectSink(ref_out), None)) as ref:
        ref.run()
        ref_state = state_set(ref.state_entries())

    out = CollectedOutput()
    runner = JobRunner(_job(CollectSink(out)), catalog=catalog, storage=storage)
    runner.run_until(records=400, kill=False)  # paused: the job keeps its in-memory chain
    chain = runner.checkpoint()  # waited for: no checkpoint of the job is in flight
    latest = catalog.latest_snapshot("proof")
    assert latest is not None and latest.id == chain.id
    meta = read_metadata(SnapshotDir.from_url(chain.location))
    assert chain.format == "DELTA"
    assert any(f.kind is FileKind.DELTA for f in meta.files)  # a real chain, not just a base
    chain_state = _restored_state(catalog, storage, chain.id)

    report = compaction.run(
        spark, catalog, job="proof", target_file_bytes=4096, row_group_bytes=1024, run_id="c1"
    )
    assert report["input_snapshot_id"] == chain.id
    new = catalog.get_snapshot(report["output_snapshot_id"])
    assert new.status == "COMPLETED" and new.kind == "CHECKPOINT" and new.format == "CANONICAL"
    assert new.checkpoint_id > chain.checkpoint_id
    latest = catalog.latest_snapshot("proof")
    assert latest is not None and latest.id == new.id  # restore("latest") picks it
    new_snap = SnapshotDir.from_url(new.location)
    new_meta = read_metadata(new_snap)
    verify(new_snap, new_meta, deep=True)
    assert {f.kind for f in new_meta.files} <= {FileKind.KEYED, FileKind.OPERATOR}
    assert report["stats"]["input_format"] == "DELTA"
    chain_rows = set(read_folded(SnapshotDir.from_url(chain.location), meta, (0, 127),
                                 operator="process"))  # fmt: skip
    new_rows = list(read_entries(new_snap, new_meta, (0, 127), operator="process"))
    assert set(new_rows) == chain_rows and len(new_rows) == len(chain_rows)
    assert report["rows_out"] == new.entries == len(chain_rows)
    assert _restored_state(catalog, storage, new.id) == chain_state
    assert _restored_state(catalog, storage, new.id, p=3) == chain_state
    # bin-packing: more than one file per subtask at a 4 KiB target
    assert report["stats"]["output_files"] > 2
    # the chain is released through the catalog; nothing was deleted by the job
    assert catalog.get_snapshot(chain.id).status == "SUBSUMED"
    assert report["stats"]["release"]["released"] is True
    for f in meta.files:
        assert SnapshotDir.from_url(chain.location).size_of(f.path) == f.size

    # the running job goes on with delta checkpoints on its own chain; they stay restorable
    result = runner.run()
    runner.close()
    assert result.finished and not result.failed_checkpoints
    assert state_set_of_latest(catalog, storage) == ref_state
    assert multiset(out.records) == multiset(ref_out.records)

    # same run id: nothing new
    again = compaction.run(spark, catalog, job="proof", snapshot=chain.id, run_id="c1")
    assert again["skipped"] is True and again["output_snapshot_id"] == new.id


def state_set_of_latest(catalog: Catalog, storage: str) -> set:
    return _restored_state(catalog, storage, "latest")


def _small_files_snapshot(catalog: Catalog, storage: CheckpointStorage) -> tuple[Any, list]:
    names = [f"user-{i}" for i in range(400)]
    rows, states, op_rows = job_rows(names, 2)
    catalog.register_job("small", max_parallelism=MAX_P, location=storage.url_of("small"))
    out = begin_output(catalog, storage, "small", kind="CHECKPOINT", parallelism=2,
                       max_parallelism=MAX_P, tag="periodic")  # fmt: skip
    outputs = []
    for index in range(2):
        rng = compute_key_group_range_for_operator_index(MAX_P, 2, index)
        with CanonicalWriter(out.snapshot, subtask=index, max_parallelism=MAX_P,
                             key_group_range=(rng.start, rng.end), row_group_bytes=512,
                             target_file_bytes=2048) as w:  # fmt: skip
            w.write(r for r in rows if rng.start <= r.key_group <= rng.end)
        written = w.finish()
        outputs.append(RangeOutput(WriteRange(OP, index, rng.start, rng.end), written.files,
                                   written.key_group_stats))  # fmt: skip
    op_file = write_operator_state(out.snapshot, op_rows)
    template = SnapshotMetadata(
        job="small", checkpoint_id=out.record.checkpoint_id, kind=out.kind,
        format=SnapshotFormat.CANONICAL, max_parallelism=MAX_P, parallelism=2,
        operators=(OperatorSnapshot(OP, StrSerializer().snapshot().to_dict(), states, ()),),
        files=(),
    )  # fmt: skip
    record = out.commit(out.metadata(template, outputs, {OP: [op_file]}), outputs)
    return record, rows


@pytest.mark.spark
def test_many_small_canonical_files_become_few(spark: Any, catalog: Catalog, storage) -> None:
    record, rows = _small_files_snapshot(catalog, storage)
    before = read_metadata(SnapshotDir.from_url(record.location))
    n_before = sum(1 for f in before.files if f.kind is FileKind.KEYED)
    assert n_before > 10
    report = compaction.run(spark, catalog, snapshot=record.id, target_file_bytes=1 << 20)
    new = catalog.get_snapshot(report["output_snapshot_id"])
    snap = SnapshotDir.from_url(new.location)
    meta = read_metadata(snap)
    keyed = [f for f in meta.files if f.kind is FileKind.KEYED]
    assert len(keyed) == 2  # one per subtask: a file never spans two subtasks
    assert list(read_entries(snap, meta, (0, MAX_P - 1), operator=OP)) == rows
    assert catalog.get_snapshot(record.id).status == "SUBSUMED"


@pytest.mark.spark
def test_a_failing_task_leaves_no_visible_snapshot_and_the_retry_succeeds(
    spark: Any, catalog: Catalog, storage
) -> None:
    record, rows = _small_files_snapshot(catalog, storage)
    snap = SnapshotDir.from_url(record.location)
    meta = read_metadata(snap)
    victim = next(f for f in meta.files if f.kind is FileKind.KEYED)
    path = snap.resolve(victim.path)
    good = snap.fs.cat_file(path)
    snap.fs.pipe_file(path, b"PAR1 not parquet at all" + b"\0" * (len(good) - 23))
    with pytest.raises(MaintenanceJobFailed):
        compaction.run(spark, catalog, snapshot=record.id, run_id="flaky")
    run = catalog.get_run("flaky")
    assert run.status == "FAILED" and run.error
    attempts = [s for s in catalog.list_snapshots("small") if s.id != record.id]
    assert [s.status for s in attempts] == ["FAILED"]
    assert not snap.fs.exists(SnapshotDir.from_url(attempts[0].location).path)
    assert catalog.get_snapshot(record.id).status == "COMPLETED"  # input untouched
    snap.fs.pipe_file(path, good)
    report = compaction.run(spark, catalog, snapshot=record.id, run_id="flaky")
    assert catalog.get_run("flaky").attempts == 2
    done = [s for s in catalog.list_snapshots("small", status="COMPLETED")]
    assert [s.id for s in done] == [report["output_snapshot_id"]]
    out = catalog.get_snapshot(report["output_snapshot_id"])
    out_snap = SnapshotDir.from_url(out.location)
    out_meta = read_metadata(out_snap)
    assert list(read_entries(out_snap, out_meta, (0, MAX_P - 1), operator=OP)) == rows


@pytest.mark.spark
def test_bad_input_is_refused_and_recorded(spark: Any, catalog: Catalog, storage) -> None:
    record, _ = _small_files_snapshot(catalog, storage)
    with pytest.raises(InvalidJobParams, match="target_file_bytes"):
        compaction.run(spark, catalog, snapshot=record.id, target_file_bytes=10, run_id="tiny")
    # a bad argument reached no job's state: not a run (issue 33); a PENDING input is recorded
    assert [r.run_id for r in catalog.list_runs()] == []
    pending = catalog.begin_snapshot("small", location=storage.url_of("small/x"), parallelism=1)
    from state_engine.errors import SnapshotNotUsable

    with pytest.raises(SnapshotNotUsable, match="PENDING"):
        compaction.run(spark, catalog, snapshot=pending.id, run_id="pend")
    assert "PENDING" in (catalog.get_run("pend").error or "")
    assert catalog.get_snapshot(record.id).status == "COMPLETED"
