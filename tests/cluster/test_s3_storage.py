"""Checkpoint storage on a real S3 API (the session's endpoint): ``_metadata`` is committed once,
by a conditional PUT that the store itself refuses to repeat, even for a writer that raced past
the existence check; snapshot files are never overwritten either; heap snapshots are written by
a forked child into a local spool and uploaded."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from state_engine.checkpoint import HeapBackendFactory
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.spool import Spool
from state_engine.errors import SnapshotFileExists
from state_engine.runtime import (
    CollectedOutput,
    JobRunner,
)
from state_engine.runtime.worker_pool import prestart
from state_engine.snapshot.metadata import read_metadata, verify
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import SnapshotStatus
from tests.checkpoint.jobstate import (
    add_operator_state,
    apply,
    close,
    factory,
    make_job,
    observe,
    operator_view,
)
from tests.runtime.sk_runtime_jobs import multiset, proof_job, state_set


@pytest.fixture
def s3_storage(stack, monkeypatch) -> CheckpointStorage:
    for name, value in stack.s3.env.items():
        monkeypatch.setenv(name, value)
    return CheckpointStorage(f"s3://{stack.s3.bucket}/storage-tests")


def test_metadata_commits_once_even_against_a_racing_writer(stack, s3_storage, monkeypatch) -> None:
    snap = SnapshotDir.from_url(s3_storage.url_of("orders/chk-1"))
    snap.write_file("part-0.parquet", b"rows")
    snap.commit_metadata(b'{"version": 1}')
    with pytest.raises(SnapshotFileExists, match="commits once"):
        snap.commit_metadata(b'{"version": 2}')
    # A writer that checked before the first commit landed goes straight to the PUT: the store's
    # If-None-Match refuses it, and the first commit stays.
    monkeypatch.setattr(snap.fs, "exists", lambda path, **kw: False)
    with pytest.raises(SnapshotFileExists, match="commits once"):
        snap.commit_metadata(b'{"version": 3}')
    with pytest.raises(SnapshotFileExists, match="never overwritten"):
        snap.write_file("part-0.parquet", b"other rows")
    monkeypatch.undo()
    assert snap.read_metadata_bytes() == b'{"version": 1}'
    fs = stack.s3.fs()
    assert fs.cat(f"{stack.s3.bucket}/storage-tests/orders/chk-1/part-0.parquet") == b"rows"


def test_listing_and_deleting_go_through_the_storage_api(stack, s3_storage) -> None:
    snap = s3_storage.checkpoint("listing", 1)
    snap.write_file("a.bin", b"12345")
    snap.write_file("sub/b.bin", b"1")
    # one listing of the store: sizes and the store's modification times
    files = s3_storage.list_under(snap.url)
    assert [(f.path, f.size) for f in files] == [("a.bin", 5), ("sub/b.bin", 1)]
    assert all(f.modified is not None and f.modified.tzinfo is not None for f in files)
    assert [f.path for f in s3_storage.list_files("listing")] == ["chk-1/a.bin", "chk-1/sub/b.bin"]
    assert s3_storage.exists(snap.url_of("a.bin"))
    assert s3_storage.delete(snap.url_of("a.bin"))
    assert not snap.has_file("a.bin")
    assert s3_storage.remove_snapshot_dir(snap)
    assert s3_storage.list_files("listing") == []
    # an object store keeps no empty directories: nothing is left to remove, and nothing fails
    stop = s3_storage.url_of("listing")
    assert s3_storage.remove_empty_dirs([snap.url_of("sub")], [stop]) == 0
    fs = stack.s3.fs()
    assert not fs.exists(f"{stack.s3.bucket}/storage-tests/listing/chk-1/sub/b.bin")


def _spools() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("statekeeper-spool-*")}


def test_heap_snapshots_on_s3_are_written_by_a_forked_child_through_a_spool(
    stack, s3_storage, catalog, tmp_path: Path
) -> None:
    # On an object store the child forked at the barrier writes into a local spool and the
    # checkpoint thread uploads it: the same snapshots as the checkpoint thread writing them
    # itself, restorable from S3, and no spool left behind.
    keys = [f"user-{i}" for i in range(800)]
    before = _spools()
    seen: dict[Any, Any] = {}
    for fork_writer in (True, False):
        name = f"spooled-{fork_writer}"
        job = make_job("heap", tmp_path / name, 2, track_changes=True)
        with CheckpointManager(
            catalog, s3_storage, name, max_parallelism=128, parallelism=2, format="delta",
            fork_writer=fork_writer,
        ) as m:  # fmt: skip
            writers, entries = [], []
            for round_ in range(3):  # a base, then deltas on it
                apply(job, keys[round_ * 150 : round_ * 150 + 500], round_=round_)
                add_operator_state(job, tag=str(round_))
                pending = m.trigger(job)
                record = pending.result()
                m.notify_checkpoint_complete()
                writers.append(pending.stats.writer)
                entries.append(record.entries)
            assert writers == (["fork-spool"] * 3 if fork_writer else ["thread"] * 3)
            assert record.location.startswith("s3://")
            snap = SnapshotDir.from_url(record.location)
            verify(snap, read_metadata(snap), deep=True)  # every file with its size and CRC32
            restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
            seen[fork_writer] = (entries, observe(restored.subtasks, keys))
            seen[fork_writer, "operator"] = operator_view(restored.subtasks)
            close(restored.subtasks)
        assert seen[fork_writer][1] == observe(job, keys)
        close(job)
    assert seen[True] == seen[False]
    assert seen[True, "operator"] == seen[False, "operator"]
    assert _spools() == before


def test_a_failed_upload_keeps_nothing_of_the_snapshot_on_s3_or_in_the_spool(
    stack, s3_storage, catalog, tmp_path: Path, monkeypatch
) -> None:
    job = make_job("heap", tmp_path / "job", 2)
    apply(job, [f"user-{i}" for i in range(300)])
    before = _spools()
    calls = []
    real = Spool.upload

    def upload_fails_after_one_file(self: Spool, files, check) -> None:
        files = list(files)
        real(self, files[:1], check)
        calls.append(len(files))
        raise OSError("connection reset by the store")

    monkeypatch.setattr(Spool, "upload", upload_fails_after_one_file)
    with CheckpointManager(
        catalog, s3_storage, "failed-upload", max_parallelism=128, parallelism=2
    ) as m:
        pending = m.trigger(job)
        with pytest.raises(OSError, match="connection reset"):
            pending.result()
        assert pending.stats.writer == "fork-spool"
        record = catalog.get_snapshot(pending.snapshot_id)
    assert calls and calls[0] > 1
    assert record.status is SnapshotStatus.DISCARDED
    assert s3_storage.list_files("failed-upload") == []
    assert _spools() == before
    close(job)


def test_a_job_in_worker_processes_checkpoints_to_s3_like_one_in_a_thread(
    stack, s3_storage, catalog, monkeypatch
) -> None:
    # The S3 credentials are set after the worker pool's forkserver started: the workers take
    # the job process's environment as it is when the job starts, write their subtasks' heap
    # files through forked children into local spools, and upload them; the run equals the
    # single-thread one, and every checkpoint on S3 verifies.
    for name in stack.s3.env:
        monkeypatch.delenv(name, raising=False)
    prestart()  # (no effect if an earlier test started it: then it lacks them too, or has them)
    for name, value in stack.s3.env.items():
        monkeypatch.setenv(name, value)
    before = _spools()
    runs = {}
    for mode in ("threads", "processes"):
        out = CollectedOutput()
        job = proof_job(2, HeapBackendFactory(), out, mode, checkpoint_interval_records=130).with_(
            name=f"s3-{mode}"
        )
        storage = f"s3://{stack.s3.bucket}/storage-tests/{mode}"
        with JobRunner(job, catalog=catalog, storage=storage) as runner:
            result = runner.run()
            runs[mode] = (multiset(out.records), state_set(runner.state_entries()))
        assert len(result.checkpoints) == 600 // 130 + 1 and not result.failed_checkpoints
        for record in result.checkpoints[-2:]:  # the ones retention kept
            snap = SnapshotDir.from_url(record.location)
            verify(snap, read_metadata(snap), deep=True)
    assert runs["processes"] == runs["threads"]
    assert _spools() == before
