"""Snapshot lifecycle: catalog registration, cancellation, retention, CLAIM / NO_CLAIM, relocated
savepoints, and what a rescaled subtask reads."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import RestoreMode
from state_engine.errors import CatalogUnreachable, SnapshotCancelled
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.serde import ArrowRecordSerializer
from state_engine.snapshot.delta import read_folded_table
from state_engine.snapshot.metadata import FileKind, read_metadata
from state_engine.state import ValueStateDescriptor
from state_engine.state.meta import StateEntry
from tests.checkpoint.jobstate import (
    OP,
    add_operator_state,
    apply,
    close,
    factory,
    make_job,
    observe,
    owner,
)

KEYS = [f"user-{i}" for i in range(2000)]


def manager(catalog, storage, fmt="canonical", **kw) -> CheckpointManager:
    kw.setdefault("row_group_bytes", 4096)
    return CheckpointManager(
        catalog, storage, "job", max_parallelism=128, parallelism=2, format=fmt, **kw
    )


def stored_urls(storage) -> set[str]:
    return {storage.url_of(f"job/{f.path}") for f in storage.list_files("job")}


def test_catalog_records_files_states_and_key_group_stats(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)
    add_operator_state(job)
    with manager(catalog, storage) as m:
        record = m.trigger(job).result()
    files = catalog.snapshot_files(record.id)
    meta = read_metadata(storage.snapshot(record.location))
    assert {f.path for f in files} == {
        storage.snapshot(record.location).fs.unstrip_protocol(
            storage.snapshot(record.location).resolve(p)
        )
        for p in [*(f.path for f in meta.files), "_metadata"]
    }
    stats = catalog.key_group_stats(record.id, OP)
    rows = sum(f.rows or 0 for f in meta.files if f.kind is FileKind.KEYED)
    assert sum(s.rows for s in stats) == rows == record.entries
    assert {s.key_group for s in stats} <= set(range(128)) and len(stats) > 100
    states = {(s.operator, s.name): s for s in catalog.list_states("job")}
    assert states[(OP, "count")].kind.lower() == "value"
    assert states[(OP, "tags")].serializers["user_key"]["name"] == "str"
    assert ("source", "@operator/offsets") in states
    close(job)


def test_cancel_leaves_nothing_behind(catalog, storage, tmp_path: Path):
    job = make_job("rocksdb", tmp_path, 2)
    apply(job, KEYS)
    with manager(catalog, storage, "native", incremental=True) as m:
        kept = m.trigger(job).result()
        before = stored_urls(storage)
        gate = threading.Event()
        m._executor.submit(gate.wait)  # hold the checkpoint thread
        pending = m.trigger(job)
        assert pending.cancel()
        gate.set()
        with pytest.raises(SnapshotCancelled, match="cancelled"):
            pending.result()
        assert catalog.get_snapshot(pending.snapshot_id).status == "DISCARDED"
        assert stored_urls(storage) == before
        assert catalog.live_paths("job") == before
        assert not pending.cancel() or pending.done()
        done = m.trigger(job)
        done.result()
        assert not done.cancel()  # committed: too late to cancel
        assert catalog.get_snapshot(kept.id).status == "COMPLETED"
    close(job)


def test_retention_subsumes_and_releases_only_unused_files(catalog, storage, tmp_path: Path):
    job = make_job("rocksdb", tmp_path, 2)
    with manager(catalog, storage, "native", incremental=True, retained=2) as m:
        records = []
        for round_ in range(4):
            apply(job, KEYS[round_ * 100 : round_ * 100 + 300], round_=round_)
            records.append(m.trigger(job).result())
        statuses = [catalog.get_snapshot(r.id).status for r in records]
        assert statuses == ["SUBSUMED", "SUBSUMED", "COMPLETED", "COMPLETED"]
        assert stored_urls(storage) == catalog.live_paths("job")
        assert not catalog.releasable_files("job")
        for r in records[2:]:
            restored = m.restore(r.id, parallelism=2, factory=factory("heap", tmp_path))
            close(restored.subtasks)
    close(job)


def test_a_retention_that_failed_is_done_after_the_next_checkpoint(
    catalog, storage, tmp_path: Path, monkeypatch, caplog
):
    """Subsuming and forgetting the released files are one transaction: when forgetting fails,
    the subsume rolls back too, and the manager still subsumes that checkpoint later. The
    checkpoint whose retention failed is COMPLETED, and its result says so."""
    job = make_job("heap", tmp_path, 2, track_changes=True)
    with manager(catalog, storage, "delta", retained=1) as m:
        first = m.trigger(job).result()
        forget = catalog.forget_files

        def unreachable(*args: Any, **kwargs: Any) -> int:
            raise CatalogUnreachable("the catalog went away")

        monkeypatch.setattr(catalog, "forget_files", unreachable)
        apply(job, KEYS[:50])
        pending = m.trigger(job)
        second = pending.result()
        assert second.status == "COMPLETED"
        assert catalog.get_snapshot(second.id).status == "COMPLETED"
        assert pending.stats.retention_error == "CatalogUnreachable: the catalog went away"
        assert "subsuming older checkpoints failed" in caplog.text
        assert catalog.get_snapshot(first.id).status == "COMPLETED"  # rolled back with it
        monkeypatch.setattr(catalog, "forget_files", forget)
        apply(job, KEYS[50:100], round_=1)
        third = m.trigger(job).result()
        statuses = [s.status for s in catalog.list_snapshots("job")]
        assert statuses == ["COMPLETED", "SUBSUMED", "SUBSUMED"]  # newest first
        assert catalog.get_snapshot(third.id).status == "COMPLETED"
        assert stored_urls(storage) == catalog.live_paths("job")
    close(job)


@pytest.mark.parametrize("kind,fmt", [("rocksdb", "native"), ("heap", "delta")])
def test_no_claim_never_deletes_the_restored_snapshot(catalog, storage, tmp_path: Path, kind, fmt):
    job = make_job(kind, tmp_path / "a", 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, fmt, incremental=True) as m:
        base = m.trigger(job).result()
    base_files = {f.path for f in catalog.snapshot_files(base.id)}
    with manager(catalog, storage, fmt, incremental=True, retained=1) as m2:
        restored = m2.restore(
            base.id,
            parallelism=2,
            factory=factory(kind, tmp_path / "b", track_changes=True),
            mode=RestoreMode.NO_CLAIM,
        )
        first = m2.trigger(restored.subtasks)
        first.result()
        assert first.stats.files_reused == 0  # NO_CLAIM: the first checkpoint is full
        for round_ in range(3):
            apply(restored.subtasks, KEYS[:50], round_=round_ + 1)
            m2.trigger(restored.subtasks).result()
        assert catalog.get_snapshot(base.id).status == "COMPLETED"
        assert base_files <= stored_urls(storage)
        close(restored.subtasks)
    close(job)


def test_claim_owns_the_restored_snapshot(catalog, storage, tmp_path: Path):
    job = make_job("rocksdb", tmp_path / "a", 2)
    apply(job, KEYS)
    with manager(catalog, storage, "native", incremental=True) as m:
        base = m.trigger(job).result()
    with manager(catalog, storage, "native", incremental=True, retained=1) as m2:
        restored = m2.restore(
            base.id,
            parallelism=2,
            factory=factory("rocksdb", tmp_path / "b"),
            mode=RestoreMode.CLAIM,
        )
        first = m2.trigger(restored.subtasks)
        record = first.result()
        assert first.stats.files_reused > 0  # CLAIM: the restored SSTs are referenced again
        assert catalog.get_snapshot(base.id).status == "SUBSUMED"
        assert stored_urls(storage) == catalog.live_paths("job")
        expected = observe(restored.subtasks, KEYS)
        again = m2.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(again.subtasks, KEYS) == expected
        close(restored.subtasks)
    close(job)


def _keyed_rows(storage, record) -> pa.Table:
    """The rows of one snapshot's base files, in a canonical order."""
    snap = storage.snapshot(record.location)
    files = [f for f in read_metadata(snap).files if f.kind is FileKind.KEYED]
    tables = [pq.read_table(snap.fs.open(snap.resolve(f.path), "rb")) for f in files]
    names = ["key_group", "key", "namespace", "state", "user_key", "value"]
    table = pa.concat_tables(t.select(names) for t in tables)
    return table.sort_by([(n, "ascending") for n in names])


def test_claim_compacts_a_heap_delta_chain_into_the_first_checkpoints_base(
    catalog, storage, tmp_path
):
    job = make_job("heap", tmp_path / "a", 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, "delta", incremental=True) as m:
        m.trigger(job).result()
        apply(job, KEYS[:40], round_=1)
        last = m.trigger(job).result()  # a base and one delta per subtask
    old = read_metadata(storage.snapshot(last.location))
    with manager(catalog, storage, "delta", incremental=True, retained=2) as m2:
        restored = m2.restore(
            last.id,
            parallelism=2,
            factory=factory("heap", tmp_path / "b", track_changes=True),
            mode=RestoreMode.CLAIM,
        )
        apply(restored.subtasks, KEYS[100:130], round_=2)
        first = m2.trigger(restored.subtasks)
        record = first.result()
        meta = read_metadata(storage.snapshot(record.location))
        # the restored chain (base + delta) is written once as a new base, as the restore
        # folded it, under a delta of the 30 keys changed since the restore
        assert first.stats.files_reused == 0
        assert not {f.path for f in meta.files} & {f.path for f in old.files}
        bases = [f for f in meta.files if f.kind is FileKind.KEYED]
        deltas = [f for f in meta.files if f.kind is FileKind.DELTA]
        assert len(bases) == 2 and all(f.shared for f in bases)
        assert {f.chain_index for f in deltas} == {1}
        base_rows = sum(f.rows or 0 for f in bases)
        assert 0 < sum(f.rows or 0 for f in deltas) < base_rows / 20
        # the new base holds exactly the restored rows: the old chain folded
        old_snap = storage.snapshot(last.location)
        names = ["key_group", "key", "namespace", "state", "user_key", "value"]
        chain = read_folded_table(old_snap, old, (0, 127), operator=OP).select(names)
        assert _keyed_rows(storage, record).equals(chain.sort_by([(n, "ascending") for n in names]))
        # the next checkpoint continues the new chain: base and delta referenced again
        expected = observe(restored.subtasks, KEYS)
        apply(restored.subtasks, KEYS[200:210], round_=3)
        second = m2.trigger(restored.subtasks)
        after = read_metadata(storage.snapshot(second.result().location))
        assert second.stats.files_reused == len(bases) + len(deltas)
        assert {f.chain_index for f in after.files if f.kind is FileKind.DELTA} == {1, 2}
        for p in (2, 3):
            again = m2.restore(record.id, parallelism=p, factory=factory("heap", tmp_path))
            assert observe(again.subtasks, KEYS) == expected
            close(again.subtasks)
        close(restored.subtasks)
        # at another parallelism no subtask keeps its key groups: the first checkpoint is full
        rescaled = m2.restore(
            record.id,
            parallelism=3,
            factory=factory("heap", tmp_path / "c", track_changes=True),
            mode=RestoreMode.CLAIM,
        )
        full = m2.trigger(rescaled.subtasks)
        full.result()
        assert full.stats.files_reused == 0
        close(rescaled.subtasks)
    close(job)


def _claimed(catalog, storage, tmp_path: Path, deltas: int):
    """A heap job checkpointed as a base and ``deltas`` deltas, restored in CLAIM mode: the
    restoring manager (open), the restored subtasks and the claimed checkpoint's metadata."""
    job = make_job("heap", tmp_path / "a", 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, "delta", incremental=True) as m:
        last = m.trigger(job).result()
        for round_ in range(deltas):
            apply(job, KEYS[:40], round_=round_ + 1)
            last = m.trigger(job).result()
    close(job)
    m2 = manager(catalog, storage, "delta", incremental=True, retained=2)
    restored = m2.restore(
        last.id,
        parallelism=2,
        factory=factory("heap", tmp_path / "b", track_changes=True),
        mode=RestoreMode.CLAIM,
    )
    return m2, restored, read_metadata(storage.snapshot(last.location))


def test_claim_of_a_bare_base_continues_it(catalog, storage, tmp_path: Path):
    m2, restored, old = _claimed(catalog, storage, tmp_path, deltas=0)
    with m2:
        apply(restored.subtasks, KEYS[100:130], round_=2)
        first = m2.trigger(restored.subtasks)
        meta = read_metadata(storage.snapshot(first.result().location))
        # nothing to compact: the base is referenced again under a first delta
        assert first.stats.files_reused == len([f for f in old.files if f.shared])
        new = [f for f in meta.files if f.path not in {g.path for g in old.files}]
        assert {f.chain_index for f in new if f.kind is FileKind.DELTA} == {1}
        assert not [f for f in new if f.kind is FileKind.KEYED]
    close(restored.subtasks)


def test_a_compaction_whose_checkpoint_failed_is_written_by_the_next(
    catalog, storage, tmp_path: Path
):
    m2, restored, old = _claimed(catalog, storage, tmp_path, deltas=2)
    with m2:
        apply(restored.subtasks, KEYS[100:130], round_=3)
        gate = threading.Event()
        m2._executor.submit(gate.wait)  # hold the checkpoint thread
        lost = m2.trigger(restored.subtasks)
        assert lost.cancel()
        gate.set()
        with pytest.raises(SnapshotCancelled):
            lost.result()
        apply(restored.subtasks, KEYS[300:310], round_=4)
        record = m2.trigger(restored.subtasks).result()
        meta = read_metadata(storage.snapshot(record.location))
        assert not {f.path for f in meta.files} & {f.path for f in old.files}
        assert {f.chain_index for f in meta.files if f.kind is FileKind.DELTA} == {1}
        expected = observe(restored.subtasks, KEYS)
        again = m2.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(again.subtasks, KEYS) == expected
        close(again.subtasks)
    close(restored.subtasks)


RECORD_V1 = ArrowRecordSerializer(pa.schema([pa.field("n", pa.int64(), nullable=False)]))
RECORD_V2 = ArrowRecordSerializer(
    pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("note", pa.string())])
)


def _records(job, desc: ValueStateDescriptor, keys: list[str], put: int | None = None) -> dict:
    """Per key of ``keys``: ``put`` + its index stored first (when given), then the value."""
    out = {}
    for i, k in enumerate(keys):
        b = owner(job, k)
        state = b.get_state(desc)
        b.set_current_key(k)
        if put is not None:
            state.update({"n": put + i})
        out[k] = state.value()
    return out


def test_a_value_serializer_migrated_after_a_claim_starts_a_new_base(
    catalog, storage, tmp_path: Path
):
    """The claimed chain holds the old serializer's bytes: a delta in the new one's bytes on top
    would leave rows no one serializer reads. The first checkpoint writes a new base instead."""
    job = make_job("heap", tmp_path / "a", 2, track_changes=True)
    v1 = ValueStateDescriptor("rec", RECORD_V1)
    _records(job, v1, KEYS[:200], put=0)
    with manager(catalog, storage, "delta", incremental=True) as m:
        m.trigger(job).result()
        _records(job, v1, KEYS[:20], put=500)
        last = m.trigger(job).result()  # a base and a delta per subtask
    close(job)
    old = read_metadata(storage.snapshot(last.location))
    with manager(catalog, storage, "delta", incremental=True) as m2:
        restored = m2.restore(
            last.id,
            parallelism=2,
            factory=factory("heap", tmp_path / "b", track_changes=True),
            mode=RestoreMode.CLAIM,
        )
        v2 = ValueStateDescriptor("rec", RECORD_V2)  # a nullable field added: values migrate
        _records(restored.subtasks, v2, KEYS[100:110], put=1000)
        first = m2.trigger(restored.subtasks)
        record = first.result()
        meta = read_metadata(storage.snapshot(record.location))
        assert first.stats.files_reused == 0
        assert not {f.path for f in meta.files} & {f.path for f in old.files}
        assert {f.kind for f in meta.files if f.shared} == {FileKind.KEYED}
        expected = {
            k: {"note": None, **v} for k, v in _records(restored.subtasks, v2, KEYS[:200]).items()
        }
        again = m2.restore(record.id, parallelism=3, factory=factory("heap", tmp_path / "c"))
        assert _records(again.subtasks, v2, KEYS[:200]) == expected
        close(again.subtasks)
        close(restored.subtasks)


@pytest.mark.parametrize("kind,fmt", [("heap", "canonical"), ("rocksdb", "native")])
def test_relocated_savepoint_restores(catalog, storage, tmp_path: Path, kind, fmt):
    job = make_job(kind, tmp_path / "a", 2)
    apply(job, KEYS[:500])
    add_operator_state(job)
    expected = observe(job, KEYS[:500])
    with manager(catalog, storage, "native" if fmt == "native" else "canonical") as m:
        sp = m.trigger(job, kind="SAVEPOINT", format=fmt, trigger="manual").result()
        assert sp.kind == "SAVEPOINT"
        snap = storage.snapshot(sp.location)
        meta = read_metadata(snap)
        assert not any(f.shared for f in meta.files)  # self-contained
        target = storage.url_of("elsewhere/moved-savepoint")
        snap.fs.copy(snap.path, storage.fs._strip_protocol(target), recursive=True)
        snap.fs.rm(snap.path, recursive=True)
        for dst in ("heap", "rocksdb"):
            restored = m.restore(target, parallelism=3, factory=factory(dst, tmp_path / dst))
            assert observe(restored.subtasks, KEYS[:500]) == expected
            assert restored.snapshot.location.rstrip("/") == target.rstrip("/")
            close(restored.subtasks)
        relocated = [s for s in catalog.list_snapshots("job") if s.location == target]
        assert len(relocated) == 1 and relocated[0].status == "COMPLETED"
    close(job)


def test_rescaled_subtask_reads_only_its_share(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2)
    rnd = random.Random(7)
    blob = ValueStateDescriptor("blob", bytes)
    states = {id(st.keyed[OP]): st.keyed[OP].get_state(blob) for st in job}
    for i in range(8000):
        b = owner(job, f"user-{i}")
        b.set_current_key(f"user-{i}")
        states[id(b)].update(rnd.randbytes(400))  # incompressible: row groups dwarf footers
    with manager(catalog, storage, row_group_bytes=32 * 1024) as m:
        record = m.trigger(job).result()
        snap = storage.snapshot(record.location)
        meta = read_metadata(snap)
        keyed = [f for f in meta.files if f.kind is FileKind.KEYED]
        per_kg: dict[int, int] = {}
        for f in keyed:
            with snap.open_input(f.path) as raw:
                for kg in pq.read_table(raw, columns=["key_group"]).column(0).to_pylist():
                    per_kg[kg] = per_kg.get(kg, 0) + 1
        total_rows, total_bytes = sum(per_kg.values()), sum(f.size for f in keyed)
        restored = m.restore(record.id, parallelism=4, factory=factory("heap", tmp_path))
        for i, stats in enumerate(restored.read_stats):
            rng = compute_key_group_range_for_operator_index(128, 4, i)
            share = total_bytes * sum(per_kg.get(kg, 0) for kg in rng) / total_rows
            assert stats.bytes_read <= 1.1 * share, (i, stats, share)
            assert stats.files_opened == 1  # each new subtask overlaps one old subtask's file
    close(job)


def test_no_claim_of_its_own_checkpoint_keeps_it(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS[:200])
    with manager(catalog, storage, retained=1) as m:
        own = m.trigger(job).result()
        restored = m.restore(own.id, parallelism=2, factory=factory("heap", tmp_path))
        for round_ in range(3):
            apply(restored.subtasks, KEYS[:20], round_=round_ + 1)
            m.trigger(restored.subtasks).result()
        assert catalog.get_snapshot(own.id).status == "COMPLETED"
        assert {f.path for f in catalog.snapshot_files(own.id)} <= stored_urls(storage)


_SNAPSHOTS: dict[str, tuple[CheckpointManager, Any, list[Any]]] = {}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(parallelism=st.integers(1, 9), backend=st.sampled_from(["heap", "rocksdb"]))
def test_restore_at_any_parallelism_keeps_every_row_once(
    catalog, storage, tmp_path: Path, parallelism: int, backend: str
):
    # one snapshot per storage root; hypothesis varies the parallelism and the target backend
    key = storage.root_url
    if key not in _SNAPSHOTS:
        job = make_job("heap", tmp_path / "src", 2)
        apply(job, KEYS[:400])
        m = manager(catalog, storage)
        record = m.trigger(job).result()
        rows: list[StateEntry] = []
        for s in job:
            with s.keyed[OP].snapshot_view() as view:
                rows.extend(view.iter_entries())
        _SNAPSHOTS[key] = (m, record, sorted(rows))
    m, record, rows = _SNAPSHOTS[key]
    restored = m.restore(
        record.id, parallelism=parallelism, factory=factory(backend, tmp_path / "dst")
    )
    got: list[StateEntry] = []
    for s in restored.subtasks:
        with s.keyed[OP].snapshot_view() as view:
            got.extend(view.iter_entries())
    assert sorted(got) == rows
    close(restored.subtasks)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_a_delta_chain_where_one_subtask_changed_nothing_restores_every_row_once(
    catalog, storage, tmp_path: Path, parallelism: int
):
    # After the base only subtask 0's keys change: subtask 1 writes no delta file, its state is
    # its base alone. Its base must be read once (a list state read twice comes back doubled).
    job = make_job("heap", tmp_path / "a", 2, track_changes=True)
    keys = KEYS[:300]
    apply(job, keys)
    first = [k for k in keys if owner(job, k) is job[0].keyed[OP]]
    with manager(catalog, storage, "delta", incremental=True) as m:
        m.trigger(job).result()
        apply(job, first, round_=1)
        record = m.trigger(job).result()
        meta = read_metadata(storage.snapshot(record.location))
        deltas = {
            s.index
            for op in meta.operators
            for s in op.subtasks
            if any(meta.file(p).kind is FileKind.DELTA for p in s.files)
        }
        assert deltas == {0}
        expected = observe(job, keys)
        restored = m.restore(
            record.id, parallelism=parallelism, factory=factory("heap", tmp_path / "b")
        )
        assert observe(restored.subtasks, keys) == expected
        close(restored.subtasks)
    close(job)
