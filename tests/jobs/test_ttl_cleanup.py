"""TTL cleanup on Spark: the output holds exactly the unexpired entries and restores like any."""

from __future__ import annotations

from collections import Counter

import pytest

from state_engine.errors import MaintenanceJobFailed, SnapshotNotUsable
from state_engine.jobs import ttl_cleanup
from state_engine.maintenance.output import OutputSnapshot
from state_engine.snapshot.canonical import read_entries, read_operator_state
from state_engine.snapshot.metadata import read_metadata, verify
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotKind
from tests.jobs.jobdata import MAX_P, OP, T0, TTL_MS, make_snapshot

pytestmark = pytest.mark.spark

TTL_STATES = {"count": "PROCESSING_TIME", "tags": "EVENT_TIME"}


def expected(rows, at, watermark):
    limits = {"count": at, "tags": watermark}
    return [
        r
        for r in rows
        if not (
            r.expires_at is not None
            and limits.get(r.state) is not None
            and r.expires_at <= limits[r.state]
        )
    ]


def read_all(record):
    snap = SnapshotDir.from_url(record.location)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    return snap, meta, list(read_entries(snap, meta, (0, MAX_P - 1), operator=OP))


@pytest.mark.parametrize(
    "at,watermark",
    [(T0 + TTL_MS, None), (T0 + TTL_MS, T0 + TTL_MS), (T0 + 2 * TTL_MS, T0 + 2 * TTL_MS)],
)
def test_drops_exactly_the_expired_entries(spark, catalog, snapshot, at, watermark):
    report = ttl_cleanup.run(
        spark, catalog, snapshot=snapshot.record.id, at=at, watermark=watermark, tasks=3
    )
    want = expected(snapshot.rows, at, watermark)
    assert 0 < len(want) < len(snapshot.rows)
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert out.status == "COMPLETED" and out.kind == "CHECKPOINT" and out.format == "CANONICAL"
    assert out.checkpoint_id == snapshot.record.checkpoint_id + 1
    snap, meta, got = read_all(out)
    assert got == want  # same rows, same key-group order
    assert meta.parallelism == snapshot.record.parallelism == 2
    assert meta.operator(OP).states == snapshot.states
    assert [tuple(e) for e in read_operator_state(snap, meta, operator=OP)] == sorted(
        snapshot.operator_rows, key=lambda e: (e[0], e[2], e[3])
    )
    dropped = Counter(r.state for r in snapshot.rows) - Counter(r.state for r in want)
    kept = Counter(r.state for r in want)
    assert report["stats"]["states"] == {
        f"{OP}/{s}": {"kept": kept[s], "dropped": dropped[s]} for s in kept | dropped
    }
    assert report["rows_in"] == len(snapshot.rows)
    assert report["rows_out"] == len(want) == out.entries
    if watermark is None:
        assert report["stats"]["skipped_states"] == {
            f"{OP}/tags": "event-time TTL and no watermark given"
        }
    # the catalog knows the new files and key-group stats
    assert sum(s.total_rows for s in catalog.key_group_skew(out.id)) == len(want)
    paths = {f.path for f in catalog.snapshot_files(out.id)}
    assert {snap.fs.unstrip_protocol(snap.resolve(f.path)) for f in meta.files} < paths
    run = catalog.get_run(report["run_id"])
    assert run.status == "SUCCEEDED" and run.output_snapshot_id == out.id
    assert run.input_snapshot_id == snapshot.record.id and run.rows_out == len(want)


def test_output_as_savepoint_and_single_subtask(spark, catalog, storage):
    made = make_snapshot(catalog, storage, job="one", parallelism=1)
    report = ttl_cleanup.run(
        spark, catalog, job="one", at=T0 + TTL_MS, watermark=T0, kind="SAVEPOINT", tasks=4
    )
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert out.kind == "SAVEPOINT"
    _, meta, got = read_all(out)
    assert meta.kind is SnapshotKind.SAVEPOINT
    assert got == expected(made.rows, T0 + TTL_MS, T0)
    # one subtask written by four tasks: its files are listed in key-group order
    (sub,) = meta.operator(OP).subtasks
    assert sub.key_group_range == (0, MAX_P - 1) and len(sub.files) >= 2
    assert report["stats"]["tasks"] == 4


def test_same_run_id_does_not_run_twice(spark, catalog, snapshot):
    first = ttl_cleanup.run(
        spark, catalog, snapshot=snapshot.record.id, at=T0 + TTL_MS, run_id="nightly-1"
    )
    again = ttl_cleanup.run(
        spark, catalog, snapshot=snapshot.record.id, at=T0 + TTL_MS, run_id="nightly-1"
    )
    assert again == {**first, "skipped": True}
    assert len(catalog.list_snapshots("orders")) == 2
    assert catalog.get_run("nightly-1").attempts == 1


def test_retry_after_a_failure_does_not_duplicate_output(spark, catalog, snapshot, monkeypatch):
    boom = RuntimeError("disk full")

    def failing_commit(*args, **kwargs):
        raise boom

    monkeypatch.setattr(OutputSnapshot, "commit", failing_commit)
    with pytest.raises(MaintenanceJobFailed, match="disk full"):
        ttl_cleanup.run(spark, catalog, snapshot=snapshot.record.id, at=T0, run_id="r")
    failed = catalog.get_run("r")
    assert failed.status == "FAILED" and "disk full" in failed.error
    (attempt,) = [s for s in catalog.list_snapshots("orders") if s.id != snapshot.record.id]
    assert attempt.status == "FAILED"
    assert not SnapshotDir.from_url(attempt.location).fs.exists(
        SnapshotDir.from_url(attempt.location).path
    )
    monkeypatch.undo()
    report = ttl_cleanup.run(spark, catalog, snapshot=snapshot.record.id, at=T0, run_id="r")
    assert catalog.get_run("r").attempts == 2
    completed = catalog.list_snapshots("orders", status="COMPLETED")
    assert [s.id for s in completed] == [report["output_snapshot_id"], snapshot.record.id]
    # nothing expired at T0: a full copy
    assert report["rows_out"] == len(snapshot.rows)


def test_a_crashed_attempt_is_cleaned_up_by_the_retry(spark, catalog, snapshot, storage):
    from state_engine.maintenance.output import begin_output
    from state_engine.maintenance.run import run_tag

    # an attempt that died after reserving its snapshot and writing a file
    dead = begin_output(
        catalog, storage, "orders", kind="CHECKPOINT", parallelism=2, max_parallelism=MAX_P,
        tag=run_tag("crashy"),
    )  # fmt: skip
    dead.snapshot.write_file("keyed-0-partial.parquet", b"partial")
    catalog.start_run("crashy", "ttl_cleanup", job="orders", input_snapshot_id=snapshot.record.id)
    report = ttl_cleanup.run(spark, catalog, snapshot=snapshot.record.id, at=T0, run_id="crashy")
    assert catalog.get_snapshot(dead.record.id).status == "FAILED"
    assert not dead.snapshot.fs.exists(dead.snapshot.path)
    assert catalog.get_snapshot(report["output_snapshot_id"]).status == "COMPLETED"


def test_refuses_snapshots_it_cannot_read(spark, catalog, snapshot, storage):
    pending = catalog.begin_snapshot("orders", location=storage.url_of("orders/x"), parallelism=1)
    with pytest.raises(SnapshotNotUsable, match="PENDING"):
        ttl_cleanup.run(spark, catalog, snapshot=pending.id, run_id="bad")
    run = catalog.get_run("bad")
    assert run.status == "FAILED" and "PENDING" in run.error


def test_an_unknown_input_is_not_recorded_as_a_run(spark, catalog, snapshot):
    from state_engine.errors import NoSuchJob, NoSuchRun

    with pytest.raises(NoSuchJob, match="nojob"):
        ttl_cleanup.run(spark, catalog, job="nojob", run_id="lost")
    with pytest.raises(NoSuchRun):  # it never reached a job
        catalog.get_run("lost")
