"""Savepoint capture on Spark: from native RocksDB and heap delta checkpoints to a relocatable
canonical savepoint that restores into both backends, moved or not; expired entries dropped on
request; a failing task leaves nothing visible."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import (
    CheckpointManager,
    HeapBackendFactory,
    RocksDBBackendFactory,
)
from state_engine.errors import MaintenanceJobFailed, NoSuchSnapshot
from state_engine.jobs import savepoint
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Job,
    JobRunner,
    RecordTimestampClock,
)
from state_engine.snapshot.canonical import read_entries
from state_engine.snapshot.metadata import FileKind, read_metadata, verify
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import SnapshotKind, SnapshotStatus
from state_engine.state import ManualClock
from state_engine.state.meta import StateEntry
from tests.jobs.jobdata import MAX_P, OP, T0, TTL_MS, make_snapshot
from tests.runtime.sk_runtime_jobs import UserActivity, make_source, state_set, user_of

pytestmark = pytest.mark.spark
CLOCK_MS = 1_700_000_000_000  # before every TTL of the proof job ran out: restores drop nothing


def _proof(backend: Any, fmt: str) -> Job:
    return Job(
        "proof",
        make_source(4, 120),
        user_of,
        UserActivity(),
        CollectSink(CollectedOutput()),
        parallelism=2,
        backend=backend,
        clock=RecordTimestampClock(),
        checkpoint_interval_records=50,
        checkpoint_format=fmt,
        incremental=True,
    )


def _restore(catalog: Catalog, storage: str, what: Any, factory: Any, p: int) -> set:
    mgr = CheckpointManager(catalog, storage, "proof", max_parallelism=128, parallelism=p)
    try:
        restored = mgr.restore(what, parallelism=p, factory=factory, clock=ManualClock(CLOCK_MS))
        rows: list[StateEntry] = []
        for st in restored.subtasks:
            for b in st.keyed.values():
                with b.snapshot_view() as view:
                    rows.extend(view.iter_entries())
                b.close()
        return state_set(rows)
    finally:
        mgr.close()


# the delta path reads through the same fold as compaction (tested there against the reference)
@pytest.mark.parametrize("fmt", ["native"])
def test_a_checkpoint_of_any_format_becomes_a_relocatable_canonical_savepoint(
    spark: Any, catalog: Catalog, tmp_path: Path, fmt: str
) -> None:
    storage = str(tmp_path / "checkpoints")
    backend = (
        RocksDBBackendFactory(tmp_path / "rocks")
        if fmt == "native"
        else HeapBackendFactory(track_changes=True)
    )
    runner = JobRunner(_proof(backend, fmt), catalog=catalog, storage=storage)
    runner.run_until(records=300, kill=False)
    chk = runner.checkpoint()
    live = state_set(runner.state_entries())
    runner.kill()
    chk_meta = read_metadata(SnapshotDir.from_url(chk.location))
    kinds = {f.kind for f in chk_meta.files}
    assert (FileKind.NATIVE_SST in kinds) if fmt == "native" else (FileKind.DELTA in kinds)

    target = (tmp_path / "savepoints" / "sp-1").as_uri()
    report = savepoint.run(spark, catalog, snapshot=chk.id, savepoint_dir=target, tasks=3)
    sp = catalog.get_snapshot(report["output_snapshot_id"])
    assert sp.kind == "SAVEPOINT" and sp.format == "CANONICAL" and sp.status == "COMPLETED"
    assert sp.location.rstrip("/").endswith("savepoints/sp-1")
    snap = SnapshotDir.from_url(sp.location, allow_shared=False)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    assert meta.kind is SnapshotKind.SAVEPOINT and not any(f.shared for f in meta.files)
    rows = list(read_entries(snap, meta, (0, 127), operator="process"))
    assert state_set(rows) == live and report["rows_out"] == len(rows) == sp.entries
    assert report["stats"]["input_format"] == fmt.upper()

    want = _restore(catalog, storage, chk.id, HeapBackendFactory(), 3)
    assert _restore(catalog, storage, sp.id, HeapBackendFactory(), 3) == want
    assert _restore(catalog, storage, sp.id, RocksDBBackendFactory(tmp_path / "r1"), 1) == want
    # moved elsewhere (the original deleted), it still restores, by its new URL
    moved = tmp_path / "elsewhere" / "sp-moved"
    shutil.copytree(tmp_path / "savepoints" / "sp-1", moved)
    shutil.rmtree(tmp_path / "savepoints")
    got = _restore(catalog, storage, moved.as_uri(), RocksDBBackendFactory(tmp_path / "r2"), 4)
    assert got == want


def test_expired_entries_are_dropped_when_asked(spark: Any, catalog: Catalog, storage) -> None:
    made = make_snapshot(catalog, storage)
    report = savepoint.run(
        spark, catalog, job="orders", at=T0 + TTL_MS, watermark=T0 + TTL_MS, tasks=2
    )
    sp = catalog.get_snapshot(report["output_snapshot_id"])
    assert "/savepoints/" in sp.location  # the storage layout's default savepoint directory
    snap = SnapshotDir.from_url(sp.location, allow_shared=False)
    got = list(read_entries(snap, read_metadata(snap), (0, MAX_P - 1), operator=OP))
    limit = {"count": T0 + TTL_MS, "tags": T0 + TTL_MS}
    want = [
        r
        for r in made.rows
        if not (r.expires_at is not None and r.state in limit and r.expires_at <= limit[r.state])
    ]
    assert 0 < len(want) < len(made.rows) and got == want
    assert sum(report["stats"]["dropped"].values()) == len(made.rows) - len(want)
    # without a time nothing is dropped
    full = savepoint.run(spark, catalog, snapshot=made.record.id, tasks=2)
    assert full["rows_out"] == len(made.rows) and full["stats"]["dropped"] == {}


def test_a_failing_task_leaves_no_savepoint_and_the_retry_writes_one(
    spark: Any, catalog: Catalog, tmp_path: Path
) -> None:
    storage = str(tmp_path / "checkpoints")
    runner = JobRunner(
        _proof(RocksDBBackendFactory(tmp_path / "rocks"), "native"), catalog=catalog,
        storage=storage,
    )  # fmt: skip
    runner.run_until(records=200, kill=False)
    chk = runner.checkpoint()
    runner.kill()
    src = SnapshotDir.from_url(chk.location)
    meta = read_metadata(src)
    sst = next(f for f in meta.files if f.kind is FileKind.NATIVE_SST)
    path = src.resolve(sst.path)
    good = src.fs.cat_file(path)
    src.fs.pipe_file(path, b"\0" * len(good))  # same size, garbage: the DB cannot open
    target = (tmp_path / "sp").as_uri()
    with pytest.raises(MaintenanceJobFailed):
        savepoint.run(spark, catalog, snapshot=chk.id, savepoint_dir=target, run_id="sp-r")
    run = catalog.get_run("sp-r")
    assert run.status == "FAILED" and run.error
    (attempt,) = [s for s in catalog.list_snapshots("proof") if s.kind == "SAVEPOINT"]
    assert attempt.status == "FAILED" and not (tmp_path / "sp").exists()
    src.fs.pipe_file(path, good)
    report = savepoint.run(spark, catalog, snapshot=chk.id, savepoint_dir=target, run_id="sp-r")
    assert catalog.get_run("sp-r").attempts == 2
    done = [s for s in catalog.list_snapshots("proof", status="COMPLETED") if s.kind == "SAVEPOINT"]
    assert [s.id for s in done] == [report["output_snapshot_id"]]
    again = savepoint.run(spark, catalog, snapshot=chk.id, savepoint_dir=target, run_id="sp-r")
    assert again["skipped"] is True


def test_an_unknown_snapshot_is_not_a_run(spark: Any, catalog: Catalog, snapshot) -> None:
    from state_engine.errors import NoSuchRun

    with pytest.raises(NoSuchSnapshot):
        savepoint.run(spark, catalog, snapshot=9999, run_id="ghost")
    with pytest.raises(NoSuchRun):
        catalog.get_run("ghost")


def test_a_retry_into_a_fixed_savepoint_dir_cleans_the_first_attempt_and_succeeds(
    spark: Any, catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage((tmp_path / "checkpoints").as_uri())
    made = make_snapshot(catalog, storage)
    target = (tmp_path / "sp").as_uri()
    real = catalog.complete_snapshot

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise OSError("catalog connection dropped")

    # the first attempt attached its files and wrote _metadata into the fixed directory, then
    # failed at the compare-and-swap
    monkeypatch.setattr(catalog, "complete_snapshot", lost)
    with pytest.raises(MaintenanceJobFailed, match="connection dropped"):
        savepoint.run(spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx")
    (first,) = [s for s in catalog.list_snapshots("orders") if s.kind is SnapshotKind.SAVEPOINT]
    assert first.status is SnapshotStatus.FAILED and not (tmp_path / "sp").exists()
    assert catalog.snapshot_files(first.id) == []  # forgotten: the names may be written again

    monkeypatch.setattr(catalog, "complete_snapshot", real)
    report = savepoint.run(
        spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx"
    )
    assert report["status"] == "SUCCEEDED" and report["attempt"] == 2
    done = catalog.get_snapshot(report["output_snapshot_id"])
    assert done.status is SnapshotStatus.COMPLETED
    assert done.location.rstrip("/") == target.rstrip("/")
    assert done.entries == len(made.rows)
    out = SnapshotDir.from_url(done.location)
    meta = read_metadata(out)
    verify(out, meta, deep=True)
    got = list(read_entries(out, meta, (0, MAX_P - 1), operator=OP))
    assert sorted(got) == sorted(made.rows)
    again = savepoint.run(
        spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx"
    )
    assert again["skipped"] is True


def test_a_third_attempt_keeps_the_savepoint_the_second_committed_in_the_same_dir(
    spark: Any, catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 fails (its row FAILED, directory removed); attempt 2 commits the savepoint
    into the same fixed directory, but its driver dies before the run is recorded; attempt 3
    cleans attempt 1 again and must not remove the directory attempt 2's savepoint lives in."""
    storage = CheckpointStorage((tmp_path / "checkpoints").as_uri())
    made = make_snapshot(catalog, storage)
    target = (tmp_path / "sp").as_uri()
    real_complete, real_finish = catalog.complete_snapshot, catalog.finish_run

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise OSError("catalog connection dropped")

    monkeypatch.setattr(catalog, "complete_snapshot", lost)
    with pytest.raises(MaintenanceJobFailed):
        savepoint.run(spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx")
    monkeypatch.setattr(catalog, "complete_snapshot", real_complete)
    monkeypatch.setattr(catalog, "finish_run", lost)
    with pytest.raises(OSError, match="connection dropped"):
        savepoint.run(spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx")
    monkeypatch.setattr(catalog, "finish_run", real_finish)
    (done,) = catalog.list_snapshots("orders", status="COMPLETED", kind="SAVEPOINT")

    report = savepoint.run(
        spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="fx"
    )
    assert report["status"] == "SUCCEEDED" and report["output_snapshot_id"] == done.id
    assert catalog.get_snapshot(done.id).status is SnapshotStatus.COMPLETED
    out = SnapshotDir.from_url(done.location)
    verify(out, read_metadata(out), deep=True)


def test_a_retry_after_a_crash_past_metadata_reuses_the_fixed_savepoint_dir(
    spark: Any, catalog: Catalog, tmp_path: Path
) -> None:
    from state_engine.maintenance.output import begin_output
    from state_engine.maintenance.run import run_tag
    from state_engine.snapshot.metadata import write_metadata

    storage = CheckpointStorage((tmp_path / "checkpoints").as_uri())
    made = make_snapshot(catalog, storage)
    target = (tmp_path / "sp").as_uri()
    # the first attempt was killed after its _metadata was written: PENDING, files attached
    catalog.start_run("crashed", "savepoint", job="orders", input_snapshot_id=made.record.id)
    dead = begin_output(
        catalog, storage, "orders", tag=run_tag("crashed"), kind=SnapshotKind.SAVEPOINT,
        parallelism=2, max_parallelism=MAX_P, savepoint_dir=target,
    )  # fmt: skip
    meta = dead.metadata(read_metadata(SnapshotDir.from_url(made.record.location)), [])
    dead.pending.attach(meta)
    write_metadata(dead.snapshot, None, meta)
    report = savepoint.run(
        spark, catalog, snapshot=made.record.id, savepoint_dir=target, run_id="crashed"
    )
    assert report["status"] == "SUCCEEDED" and report["attempt"] == 2
    assert catalog.get_snapshot(dead.record.id).status is SnapshotStatus.FAILED
    done = catalog.get_snapshot(report["output_snapshot_id"])
    assert done.status is SnapshotStatus.COMPLETED and done.location == dead.snapshot.url
    out = SnapshotDir.from_url(done.location)
    verify(out, read_metadata(out), deep=True)
    assert done.entries == len(made.rows)
