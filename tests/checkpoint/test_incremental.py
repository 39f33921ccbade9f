"""Incremental checkpoints: RocksDB SSTs uploaded once into shared/, heap deltas on a base.

Their size follows what changed, chains restore at any parallelism, and retention releases
shared files only when no retained checkpoint uses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.catalog import SnapshotRecord
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.errors import InvalidSnapshotRequest
from state_engine.maintenance.plan import DeltaChain, delta_chain
from state_engine.snapshot.metadata import FileKind, read_metadata
from tests.checkpoint.jobstate import apply, close, factory, make_job, observe

KEYS = [f"user-{i}" for i in range(10_000)]


def manager(catalog, storage, fmt, **kw) -> CheckpointManager:
    return CheckpointManager(
        catalog,
        storage,
        "job",
        max_parallelism=128,
        parallelism=2,
        format=fmt,
        incremental=True,
        row_group_bytes=8192,
        **kw,
    )


@pytest.mark.parametrize("kind,fmt", [("rocksdb", "native"), ("heap", "delta")])
def test_second_checkpoint_writes_what_changed(catalog, storage, tmp_path: Path, kind, fmt):
    job = make_job(kind, tmp_path / "src", 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, fmt) as m:
        first = m.trigger(job)
        first.result()
        apply(job, KEYS[:100], round_=1)  # 1% of the keys
        second = m.trigger(job)
        record = second.result()
        assert first.stats.bytes_written > 0
        assert second.stats.bytes_written < 0.2 * first.stats.bytes_written
        assert second.stats.files_reused > 0
        assert record.parent_id == first.result().id  # the checkpoint whose files it reuses
        expected = observe(job, KEYS)
        meta = read_metadata(storage.snapshot(record.location))
        assert all(f.shared for f in meta.files if f.kind in (FileKind.NATIVE_SST, FileKind.DELTA))
        for p in (1, 3, 4):
            for dst in ("heap", "rocksdb"):
                restored = m.restore(
                    record.id, parallelism=p, factory=factory(dst, tmp_path / f"d{p}{dst}")
                )
                assert observe(restored.subtasks, KEYS) == expected
                close(restored.subtasks)
    close(job)


def test_delta_chain_rebases_every_n_and_restores(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS[:300])
    reader = manager(catalog, storage, "delta")  # restoring resets a manager's chains
    with manager(catalog, storage, "delta", full_every=2, retained=2) as m:
        chain_lengths = []
        previous: SnapshotRecord | None = None
        for round_ in range(1, 6):
            record = m.trigger(job).result()
            meta = read_metadata(storage.snapshot(record.location))
            chain_lengths.append(max((f.chain_index or 0) for f in meta.files))
            # a delta's parent is the checkpoint it builds on; a new base has none (in the
            # catalog and in _metadata alike)
            parent = previous if chain_lengths[-1] else None
            assert catalog.get_snapshot(record.id).parent_id == (parent and parent.id)
            assert meta.parent == (parent and parent.checkpoint_id)
            previous = record
            # what the maintenance DAG's compaction decides on: a new base ends the count
            assert delta_chain(catalog, "job") == DeltaChain("job", record.id, chain_lengths[-1])
            expected = observe(job, KEYS[:300])
            restored = reader.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
            assert observe(restored.subtasks, KEYS[:300]) == expected
            apply(job, KEYS[round_ * 10 : round_ * 10 + 20], round_=round_)
        assert chain_lengths == [0, 1, 2, 0, 1]
        # files of subsumed checkpoints are gone from storage unless a retained one uses them
        live = catalog.live_paths("job")
        stored = {storage.url_of(f"job/{f.path}") for f in storage.list_files("job")}
        assert stored == live


def test_an_unknown_leftover_sst_in_shared_is_never_reused(catalog, storage, tmp_path: Path):
    """A content-named SST left by a failed checkpoint may be under deletion by an orphan cleanup:
    the next checkpoint writes its own copy instead of referencing the leftover."""
    job = make_job("rocksdb", tmp_path / "src", 2)
    apply(job, KEYS[:2000])
    with manager(catalog, storage, "native") as m:
        first = m.trigger(job).result()
        meta = read_metadata(storage.snapshot(first.location))
        shared = [f.path for f in meta.files if f.kind == FileKind.NATIVE_SST]
        assert shared
    # The files stay in storage, but no live snapshot knows them: as after a failed checkpoint.
    catalog.discard_snapshot(first.id)
    with manager(catalog, storage, "native") as fresh:
        record = fresh.trigger(job).result()
        meta = read_metadata(storage.snapshot(record.location))
        paths = {f.path for f in meta.files if f.kind == FileKind.NATIVE_SST}
        assert paths and not paths & set(shared)
        restored = fresh.restore(
            record.id, parallelism=3, factory=factory("rocksdb", tmp_path / "r")
        )
        assert observe(restored.subtasks, KEYS[:2000]) == observe(job, KEYS[:2000])
        close(restored.subtasks)
    close(job)


def test_delta_on_a_heap_without_change_tracking_is_refused_before_anything_is_written(
    catalog, storage, tmp_path: Path
):
    job = make_job("heap", tmp_path, 2)  # no track_changes: every "delta" would be a full base
    apply(job, KEYS[:50])
    with manager(catalog, storage, "delta") as m:
        with pytest.raises(InvalidSnapshotRequest, match="track_changes=True"):
            m.trigger(job)
        assert catalog.list_snapshots(m.job) == []
        assert list(storage.list_files("job")) == []
        # a savepoint is canonical whatever the format, so it needs no tracking
        assert m.trigger(job, kind="SAVEPOINT").result().format == "CANONICAL"
    close(job)
