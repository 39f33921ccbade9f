"""Jobs, states and the snapshot lifecycle: begin, complete by compare-and-swap, fail, subsume."""

from __future__ import annotations

import threading
from datetime import UTC
from typing import Any

import pytest

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from state_engine.errors import (
    CommitConflict,
    InvalidCatalogInput,
    InvalidSnapshotTransition,
    NoSuchJob,
    NoSuchSnapshot,
    StateRegistrationConflict,
)


def _begin(catalog: Catalog, job: str = "orders", **kwargs: Any) -> int:
    catalog.register_job(job, max_parallelism=128)
    return catalog.begin_snapshot(job, location=f"file:///chk/{job}", parallelism=2, **kwargs).id


def test_registering_a_job_twice_returns_the_same_job(catalog: Catalog) -> None:
    first = catalog.register_job("orders", max_parallelism=128, properties={"team": "payments"})
    again = catalog.register_job("orders", max_parallelism=128)
    assert again == first
    assert catalog.get_job(first.id) == catalog.get_job("orders") == first
    assert first.created_at.tzinfo is UTC
    assert [j.name for j in catalog.list_jobs()] == ["orders"]


def test_a_jobs_max_parallelism_changes_only_explicitly(catalog: Catalog) -> None:
    catalog.register_job("orders", max_parallelism=128)
    with pytest.raises(InvalidCatalogInput, match="set_job_max_parallelism"):
        catalog.register_job("orders", max_parallelism=256)
    assert catalog.set_job_max_parallelism("orders", 256).max_parallelism == 256


def test_unknown_jobs_and_snapshots_name_the_listing_command(catalog: Catalog) -> None:
    with pytest.raises(NoSuchJob, match="statectl jobs"):
        catalog.get_job("nope")
    with pytest.raises(NoSuchJob):
        catalog.begin_snapshot("nope", location="x", parallelism=1)
    with pytest.raises(NoSuchSnapshot, match="statectl snapshots"):
        catalog.get_snapshot(12345)
    with pytest.raises(NoSuchSnapshot):
        catalog.complete_snapshot(12345, 0)


def test_states_keep_their_kind_and_evolve_their_serializers(catalog: Catalog) -> None:
    catalog.register_job("orders", max_parallelism=128)
    ttl = {"ttl_ms": 60000, "update_type": "OnCreateAndWrite"}
    first = catalog.register_state(
        "orders", "sum", "total", kind="VALUE", serializers={"value": "long:v1"}, ttl=ttl
    )
    evolved = catalog.register_state(
        "orders", "sum", "total", kind="VALUE", serializers={"value": "long:v2"}, ttl=ttl
    )
    assert evolved.id == first.id and evolved.serializers == {"value": "long:v2"}
    with pytest.raises(StateRegistrationConflict, match="another name"):
        catalog.register_state("orders", "sum", "total", kind="MAP", serializers={})
    assert [(s.operator, s.name, s.kind) for s in catalog.list_states("orders")] == [
        ("sum", "total", "VALUE")
    ]
    assert [o.uid for o in catalog.list_operators("orders")] == ["sum"]


def test_a_snapshot_goes_pending_to_completed_once(catalog: Catalog) -> None:
    sid = _begin(catalog)
    pending = catalog.get_snapshot(sid)
    assert (pending.status, pending.version, pending.checkpoint_id) == ("PENDING", 0, 1)
    catalog.attach_files(sid, [FileRef("/chk/orders/chk-1/a", 100, operator="sum", subtask=0)])
    catalog.record_key_group_stats(sid, [KeyGroupStatRow("sum", 3, rows=7, bytes=70)])
    done = catalog.complete_snapshot(sid, pending.version)
    assert (done.status, done.version, done.bytes, done.entries) == ("COMPLETED", 1, 100, 7)
    assert done.completed_at is not None and done.duration_ms is not None
    with pytest.raises(InvalidSnapshotTransition, match=f"snapshot {sid} is COMPLETED"):
        catalog.complete_snapshot(sid, done.version)
    with pytest.raises(CommitConflict, match="expected version 0, found version 1"):
        catalog.complete_snapshot(sid, pending.version)
    assert catalog.get_snapshot(sid) == done  # the refused calls changed nothing


def test_checkpoint_ids_count_up_and_are_unique_per_job(catalog: Catalog) -> None:
    first = _begin(catalog)
    second = catalog.begin_snapshot("orders", location="file:///chk/2", parallelism=2)
    assert catalog.get_snapshot(first).checkpoint_id == 1 and second.checkpoint_id == 2
    with pytest.raises(CommitConflict, match="next free one is 3"):
        catalog.begin_snapshot("orders", location="x", parallelism=2, checkpoint_id=2)
    assert len(catalog.list_snapshots("orders")) == 2


def test_a_snapshot_completed_standalone_keeps_no_parent(catalog: Catalog) -> None:
    # An incremental checkpoint is begun on the last completed one; if it wrote a new base
    # (reused nothing), completing it standalone drops the link, in the record returned and
    # in the row.
    first = _begin(catalog)
    done = catalog.complete_snapshot(first, 0)
    delta = catalog.begin_snapshot("orders", location="d", parallelism=2, parent_id=first)
    assert catalog.complete_snapshot(delta.id, delta.version).parent_id == first
    base = catalog.begin_snapshot("orders", location="b", parallelism=2, parent_id=delta.id)
    assert base.parent_id == delta.id
    record = catalog.complete_snapshot(base.id, base.version, standalone=True)
    assert record.parent_id is None and record.status == "COMPLETED"
    assert catalog.get_snapshot(base.id) == record
    assert catalog.get_snapshot(done.id).parent_id is None


def test_bad_snapshot_arguments_are_refused(catalog: Catalog) -> None:
    catalog.register_job("orders", max_parallelism=128)
    with pytest.raises(InvalidCatalogInput, match="snapshot kind"):
        catalog.begin_snapshot("orders", location="x", parallelism=1, kind="BACKUP")
    with pytest.raises(InvalidCatalogInput, match="parallelism"):
        catalog.begin_snapshot("orders", location="x", parallelism=129)
    with pytest.raises(NoSuchSnapshot, match="parent snapshot 99"):
        catalog.begin_snapshot("orders", location="x", parallelism=1, parent_id=99)
    assert catalog.list_snapshots("orders") == []


def test_fail_subsume_and_discard_follow_the_lifecycle(catalog: Catalog) -> None:
    failed = _begin(catalog)
    assert catalog.fail_snapshot(failed, error="task 3 lost").error == "task 3 lost"
    with pytest.raises(InvalidSnapshotTransition):
        catalog.subsume_snapshot(failed)
    chk = catalog.begin_snapshot("orders", location="file:///c2", parallelism=2)
    catalog.complete_snapshot(chk.id, chk.version)
    assert catalog.subsume_snapshot(chk.id).status == "SUBSUMED"
    assert catalog.discard_snapshot(chk.id).status == "DISCARDED"
    sp = catalog.begin_snapshot("orders", location="file:///sp", parallelism=2, kind="SAVEPOINT")
    catalog.complete_snapshot(sp.id, 0)
    with pytest.raises(InvalidSnapshotTransition, match="never subsumed"):
        catalog.subsume_snapshot(sp.id)
    with pytest.raises(CommitConflict):
        catalog.discard_snapshot(sp.id, expected_version=0)
    assert catalog.latest_snapshot("orders").id == sp.id  # type: ignore[union-attr]  # the job has snapshots


def test_files_cannot_be_attached_after_completion(catalog: Catalog) -> None:
    sid = _begin(catalog)
    catalog.complete_snapshot(sid, 0)
    with pytest.raises(InvalidSnapshotTransition, match="while it is PENDING"):
        catalog.attach_files(sid, [FileRef("/late", 1)])


@pytest.mark.postgres
def test_concurrent_completions_on_postgres_have_exactly_one_winner(pg_catalog: Catalog) -> None:
    catalog = pg_catalog
    for round_ in range(5):
        sid = _begin(catalog, job=f"race-{round_}")
        catalog.attach_files(sid, [FileRef(f"/race/{round_}/f", 10, operator="op")])
        barrier = threading.Barrier(4)
        outcomes: list[object] = []
        lock = threading.Lock()

        def complete(
            sid: int = sid,
            barrier: threading.Barrier = barrier,
            outcomes: list[object] = outcomes,
            lock: threading.Lock = lock,
        ) -> None:
            barrier.wait()
            try:
                result: object = catalog.complete_snapshot(sid, 0)
            except CommitConflict as exc:
                result = exc
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=complete) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if not isinstance(o, CommitConflict)]
        assert len(winners) == 1 and len(outcomes) == 4
        assert catalog.get_snapshot(sid).version == 1
        # The losers left no trace: one size row per operator, not one per attempt.
        assert len(catalog.state_size_history(f"race-{round_}")) == 1
