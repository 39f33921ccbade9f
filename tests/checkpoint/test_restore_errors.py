"""Bad input on restore: each a specific error naming the snapshot and the fix; nothing deleted,
nothing half-registered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from state_engine.checkpoint.manager import CheckpointManager
from state_engine.errors import (
    ChecksumMismatch,
    CorruptMetadata,
    IncompatibleSerializer,
    InvalidParallelism,
    MissingMetadata,
    MissingSnapshotFile,
    SnapshotFileMismatch,
    SnapshotNotRestorable,
    UnknownStorageScheme,
)
from state_engine.snapshot.metadata import FileKind, read_metadata
from tests.checkpoint.jobstate import apply, close, factory, make_job

KEYS = [f"user-{i}" for i in range(300)]


@pytest.fixture
def completed(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)
    m = CheckpointManager(
        catalog, storage, "job", max_parallelism=128, parallelism=2, row_group_bytes=2048
    )
    record = m.trigger(job).result()
    close(job)
    yield m, record, storage.snapshot(record.location)
    m.close()


def snapshot_state(catalog, storage, record):
    return (
        catalog.get_snapshot(record.id).status,
        sorted(f.path for f in storage.list_files("job")),
        len(catalog.list_snapshots("job")),
    )


def restore(m, snapshot, tmp_path, **kw):
    kw.setdefault("parallelism", 3)
    return m.restore(snapshot, factory=factory("heap", tmp_path), **kw)


def test_pending_and_failed_snapshots_are_refused(catalog, completed, tmp_path):
    m, record, _ = completed
    pending = catalog.begin_snapshot("job", location="file:///nowhere", parallelism=1)
    with pytest.raises(SnapshotNotRestorable, match=rf"snapshot {pending.id} .* is PENDING"):
        restore(m, pending.id, tmp_path)
    catalog.fail_snapshot(pending.id, error="boom")
    with pytest.raises(SnapshotNotRestorable, match=r"is FAILED, not COMPLETED.*earlier"):
        restore(m, pending.id, tmp_path)


def test_parallelism_above_max_parallelism(catalog, storage, completed, tmp_path):
    m, record, snap = completed
    before = snapshot_state(catalog, storage, record)
    with pytest.raises(
        InvalidParallelism, match=rf"parallelism 129 exceeds max parallelism 128 .*{snap.url}"
    ):
        restore(m, record.id, tmp_path, parallelism=129)
    assert snapshot_state(catalog, storage, record) == before


def test_missing_and_truncated_metadata(catalog, storage, completed, tmp_path):
    m, record, snap = completed
    data = snap.read_metadata_bytes()
    snap.fs.pipe_file(snap.metadata_path, data[: len(data) // 2])
    before = snapshot_state(catalog, storage, record)
    with pytest.raises(CorruptMetadata, match=rf"{snap.url}.*not valid JSON"):
        restore(m, record.id, tmp_path)
    snap.fs.rm_file(snap.metadata_path)
    with pytest.raises(MissingMetadata, match=rf"snapshot {snap.url} has no _metadata"):
        restore(m, record.id, tmp_path)
    assert snapshot_state(catalog, storage, record)[0] == before[0] == "COMPLETED"


def _keyed_file(snap):
    meta = read_metadata(snap)
    return next(f for f in meta.files if f.kind is FileKind.KEYED)


def test_truncated_missing_and_corrupt_files(catalog, storage, completed, tmp_path):
    m, record, snap = completed
    f = _keyed_file(snap)
    path = snap.resolve(f.path)
    original = snap.fs.cat_file(path)
    snap.fs.pipe_file(path, original[:-10])
    with pytest.raises(SnapshotFileMismatch, match=rf"{f.path}.*{snap.url}.*truncated"):
        restore(m, record.id, tmp_path)
    snap.fs.pipe_file(path, original[:100] + bytes([original[100] ^ 0xFF]) + original[101:])
    m.verify_checksums = True
    with pytest.raises(ChecksumMismatch, match=rf"{f.path}.*{snap.url}"):
        restore(m, record.id, tmp_path)
    snap.fs.rm_file(path)
    with pytest.raises(MissingSnapshotFile, match=rf"{f.path}.*{snap.url}.*missing"):
        restore(m, record.id, tmp_path)
    assert catalog.get_snapshot(record.id).status == "COMPLETED"
    assert len(catalog.snapshot_files(record.id)) > 0


def test_incompatible_key_serializer(catalog, completed, tmp_path):
    m, record, snap = completed
    with pytest.raises(
        IncompatibleSerializer, match=rf"key of operator 'agg' in snapshot {snap.url}"
    ):
        restore(m, record.id, tmp_path, key_serializer=int)


def test_state_written_by_an_unknown_serializer_version(catalog, completed, tmp_path):
    m, record, snap = completed
    doc = json.loads(snap.read_metadata_bytes())
    op = next(o for o in doc["operators"] if o["operator_id"] == "agg")
    op["states"]["count"]["serializers"]["value"]["version"] = 99
    snap.fs.rm_file(snap.metadata_path)
    snap.fs.pipe_file(snap.metadata_path, json.dumps(doc).encode())
    with pytest.raises(
        IncompatibleSerializer, match=rf"state 'count' of operator 'agg' in snapshot {snap.url}"
    ):
        restore(m, record.id, tmp_path)


def test_unknown_storage_scheme(catalog):
    with pytest.raises(UnknownStorageScheme, match="'nosuchfs'.*use one of"):
        CheckpointManager(catalog, "nosuchfs://bucket/x", "job", max_parallelism=128, parallelism=1)


def test_directory_that_is_not_a_snapshot(catalog, storage, completed, tmp_path):
    m, _record, _ = completed
    before = len(catalog.list_snapshots("job"))
    with pytest.raises(MissingMetadata):
        restore(m, storage.url_of("job/nothing-here"), tmp_path)
    assert len(catalog.list_snapshots("job")) == before  # nothing half-registered
