"""Checkpoint storage on a real S3 API (the session's endpoint): ``_metadata`` is committed once,
by a conditional PUT that the store itself refuses to repeat, even for a writer that raced past
the existence check; snapshot files are never overwritten either."""

from __future__ import annotations

import pytest

from state_engine.checkpoint.storage import CheckpointStorage, SnapshotDir
from state_engine.errors import SnapshotFileExists


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
