"""The _metadata document: commit, read back, and every way it can be wrong."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from state_engine.errors import (
    ChecksumMismatch,
    CorruptMetadata,
    MissingMetadata,
    MissingSnapshotFile,
    SnapshotFileExists,
    SnapshotFileMismatch,
    UnsupportedMetadataVersion,
)
from state_engine.snapshot.canonical import CanonicalWriter, read_entries
from state_engine.snapshot.metadata import (
    FORMAT_VERSION,
    FileKind,
    SnapshotMetadata,
    read_metadata,
    verify,
    write_metadata,
)
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import SnapshotKind

WriteSnapshot = Callable[..., Any]


def _rewrite_metadata(snap: SnapshotDir, data: bytes) -> None:
    snap.fs.rm_file(snap.metadata_path)
    with snap.fs.open(snap.metadata_path, "wb") as f:
        f.write(data)


def _edit(snap: SnapshotDir, change) -> None:
    doc = json.loads(snap.read_metadata_bytes())
    change(doc)
    _rewrite_metadata(snap, json.dumps(doc).encode())


def test_round_trip_through_every_way_of_naming_a_snapshot(
    make_rows: Callable[..., Any], storage: CheckpointStorage, write_snapshot: WriteSnapshot
) -> None:
    snap, meta = write_snapshot(make_rows(128, 3), parallelism=3, checkpoint_id=7)
    assert read_metadata(storage, "job/chk-7") == meta
    assert read_metadata(snap) == meta
    assert read_metadata(snap.url) == meta
    assert read_metadata(snap.fs, snap.path) == meta
    doc = json.loads(snap.read_metadata_bytes())
    assert doc["format_version"] == FORMAT_VERSION
    assert doc["kind"] == "CHECKPOINT" and doc["format"] == "CANONICAL"
    assert all(not f["path"].startswith("/") for f in doc["files"])
    assert meta.files_of("counter", [FileKind.KEYED]) == list(meta.files)
    verify(snap, meta, deep=True)


def test_a_writer_that_dies_before_metadata_leaves_an_incomplete_snapshot(
    make_rows: Callable[..., Any],
    storage: CheckpointStorage,
) -> None:
    snap = storage.checkpoint("job", 2)
    writer = CanonicalWriter(snap, subtask=0, max_parallelism=128)
    writer.write(make_rows(128, 2))
    writer.finish()  # data files are complete, but the process "dies" before _metadata
    assert storage.list_files("job")
    with pytest.raises(MissingMetadata, match="never completed.*earlier one") as err:
        read_metadata(storage, "job/chk-2")
    assert snap.url in str(err.value)


def test_metadata_is_committed_once(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot
) -> None:
    snap, meta = write_snapshot(make_rows(128, 1))
    with pytest.raises(SnapshotFileExists):
        write_metadata(snap, None, meta)
    assert read_metadata(snap) == meta


def test_metadata_refuses_to_commit_over_missing_files(
    make_rows: Callable[..., Any], storage: CheckpointStorage
) -> None:
    snap = storage.checkpoint("job", 1)
    with CanonicalWriter(snap, subtask=0, max_parallelism=128) as writer:
        writer.write(make_rows(128, 1))
    written = writer.finish()
    meta = _meta_for(written.files)
    snap.fs.rm_file(snap.resolve(written.paths[0]))
    with pytest.raises(MissingSnapshotFile, match=written.paths[0]):
        write_metadata(snap, None, meta)
    assert not snap.has_metadata()


def _meta_for(files, kind=SnapshotKind.CHECKPOINT) -> SnapshotMetadata:
    from state_engine.snapshot.metadata import OperatorSnapshot, SubtaskSnapshot
    from state_engine.snapshot_enums import SnapshotFormat

    return SnapshotMetadata(
        job="job",
        checkpoint_id=1,
        kind=kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=128,
        parallelism=1,
        operators=(
            OperatorSnapshot(
                "op", None, {}, (SubtaskSnapshot(0, (0, 127), tuple(f.path for f in files)),)
            ),
        ),
        files=tuple(files),
    )


@pytest.mark.parametrize("cut", [0, 1, 40, -1])
def test_truncated_metadata_is_corrupt(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot, cut: int
) -> None:
    snap, _ = write_snapshot(make_rows(128, 1))
    data = snap.read_metadata_bytes()
    _rewrite_metadata(snap, data[:cut])
    with pytest.raises(CorruptMetadata, match="not valid JSON") as err:
        read_metadata(snap)
    assert snap.url in str(err.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(checkpoint_id="7"), "checkpoint_id"),
        (lambda d: d.update(kind="SNAPSHOT"), "kind"),
        (lambda d: d.pop("max_parallelism"), "max_parallelism"),
        (lambda d: d.update(parallelism=0), "parallelism"),
        (lambda d: d.update(parallelism=500), "parallelism"),
        (lambda d: d["files"][0].update(size=-1), "files[0].size"),
        (lambda d: d["files"][0].update(size=True), "files[0].size"),
        (lambda d: d["files"][0].update(checksum="md5:abc"), "files[0].checksum"),
        (lambda d: d["files"][0].update(path="/abs/file.parquet"), "files[0].path"),
        (lambda d: d["files"][0].update(path="../chk-1/x.parquet"), "files[0].path"),
        (lambda d: d["files"][0].update(kind="sst"), "files[0].kind"),
        (lambda d: d["files"][0]["key_groups"][0].pop(), "files[0].key_groups[0]"),
        (lambda d: d["files"][0]["key_groups"][0].__setitem__(1, 999), "files[0].key_groups[0]"),
        (lambda d: d["files"].append(d["files"][0]), "files[1].path"),
        (lambda d: d["operators"][0].update(states=[]), "operators[0].states"),
        (
            lambda d: d["operators"][0]["subtasks"][0].update(key_group_range=[0, 128]),
            "operators[0].subtasks[0].key_group_range",
        ),
        (
            lambda d: d["operators"][0]["subtasks"][0]["files"].append("ghost.parquet"),
            "operators[0].subtasks[0].files[1]",
        ),
        (lambda d: d.update(parent=5), "parent"),
        (lambda d: d.clear(), "format_version"),
    ],
)
def test_edited_metadata_is_corrupt_and_names_the_field(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot, change, field: str
) -> None:
    snap, _ = write_snapshot(make_rows(128, 1))
    _edit(snap, change)
    with pytest.raises(CorruptMetadata) as err:
        read_metadata(snap)
    assert f"field {field} " in str(err.value)
    assert snap.url in str(err.value)


def test_a_json_array_document_is_corrupt(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot
) -> None:
    snap, _ = write_snapshot(make_rows(128, 1))
    _rewrite_metadata(snap, b"[1, 2]")
    with pytest.raises(CorruptMetadata, match="must be an object"):
        read_metadata(snap)


def test_future_format_version_is_refused(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot
) -> None:
    snap, _ = write_snapshot(make_rows(128, 1))
    _edit(snap, lambda d: d.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(UnsupportedMetadataVersion, match="newer Statekeeper"):
        read_metadata(snap)


def test_a_listed_file_with_the_wrong_size_fails_verification(
    make_rows: Callable[..., Any],
    write_snapshot: WriteSnapshot,
) -> None:
    snap, meta = write_snapshot(make_rows(128, 1))
    _edit(snap, lambda d: d["files"][0].update(size=d["files"][0]["size"] + 1))
    edited = read_metadata(snap)
    with pytest.raises(SnapshotFileMismatch, match=meta.files[0].path) as err:
        verify(snap, edited)
    assert snap.url in str(err.value)


def test_a_flipped_byte_fails_deep_verification_only(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot
) -> None:
    snap, meta = write_snapshot(make_rows(128, 2))
    target = snap.resolve(meta.files[0].path)
    data = bytearray(snap.fs.cat_file(target))
    data[len(data) // 2] ^= 0x01
    snap.fs.rm_file(target)
    snap.fs.pipe_file(target, bytes(data))
    verify(snap, meta)  # same size: the shallow check cannot tell
    with pytest.raises(ChecksumMismatch, match=meta.files[0].path) as err:
        verify(snap, meta, deep=True)
    assert snap.url in str(err.value)
    assert snap.fs.exists(target), "verification never deletes"


def test_a_missing_file_fails_verification_and_reading(
    make_rows: Callable[..., Any], write_snapshot: WriteSnapshot
) -> None:
    snap, meta = write_snapshot(make_rows(128, 2))
    snap.fs.rm_file(snap.resolve(meta.files[0].path))
    with pytest.raises(MissingSnapshotFile, match=meta.files[0].path):
        verify(snap, meta)
    with pytest.raises(MissingSnapshotFile):
        list(read_entries(snap, meta, (0, 127)))


def test_savepoints_refuse_shared_files(storage: CheckpointStorage) -> None:
    chk = storage.checkpoint("job", 1)
    info = chk.write_file("../shared/x.parquet", b"x")
    from state_engine.snapshot.metadata import SnapshotFile

    meta = _meta_for(
        [SnapshotFile(info.path, info.size, info.checksum, FileKind.KEYED, rows=0)],
        kind=SnapshotKind.SAVEPOINT,
    )
    with pytest.raises(CorruptMetadata, match="files\\[0\\].path"):
        write_metadata(storage.savepoint("job", 1), None, meta)


def test_a_copied_savepoint_still_reads(
    make_rows: Callable[..., Any],
    storage: CheckpointStorage,
    write_snapshot: WriteSnapshot,
    tmp_path,
) -> None:
    rows = make_rows(128, 4)
    sp, meta = write_snapshot(
        rows, kind=SnapshotKind.SAVEPOINT, parallelism=2, row_group_bytes=2048
    )
    # copy to another filesystem entirely, then delete the original
    dest = tmp_path / "moved-savepoint"
    dest.mkdir()
    for path in sp.fs.find(sp.path):
        rel = path[len(sp.path) + 1 :]
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(sp.fs.cat_file(path))
    sp.fs.rm(sp.path, recursive=True)
    moved = SnapshotDir.from_url(dest.as_uri())
    moved_meta = read_metadata(moved)
    assert moved_meta == meta
    verify(moved, moved_meta, deep=True)
    assert list(read_entries(moved, moved_meta, (0, 127))) == rows
    shutil.rmtree(dest)
    assert not fsspec.filesystem("file").exists(str(dest))
