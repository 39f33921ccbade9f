"""The one snapshot committer: reserve, attach, complete, abort (and registering a relocated
savepoint), on a real catalog and both a local and an in-memory file system."""

from __future__ import annotations

from typing import Any

import pytest

from state_engine.checkpoint.commit import PendingCommit, register, reserve
from state_engine.errors import InvalidSnapshotRequest
from state_engine.snapshot.canonical import CanonicalWriter
from state_engine.snapshot.metadata import (
    OperatorSnapshot,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
)
from state_engine.snapshot.storage import METADATA_FILE, CheckpointStorage
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

MAX_P = 128


def _reserve(catalog: Any, storage: CheckpointStorage, **kw: Any) -> PendingCommit:
    catalog.register_job("job", max_parallelism=MAX_P, location=storage.url_of("job"))
    args: dict[str, Any] = {
        "kind": SnapshotKind.CHECKPOINT,
        "format": SnapshotFormat.CANONICAL,
        "parallelism": 1,
        "max_parallelism": MAX_P,
        "trigger": "test",
        **kw,
    }
    return reserve(catalog, storage, "job", **args)


def _write(pending: PendingCommit, rows: list[Any]) -> SnapshotMetadata:
    with CanonicalWriter(pending.snapshot, subtask=0, max_parallelism=MAX_P) as w:
        w.write(rows)
    written = w.finish()
    return SnapshotMetadata(
        job="job",
        checkpoint_id=pending.record.checkpoint_id,
        kind=pending.kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=MAX_P,
        parallelism=1,
        operators=(
            OperatorSnapshot(
                operator_id="counter",
                key_serializer={"name": "str", "version": 1},
                states={"counts": {"kind": "value", "ttl": None}},
                subtasks=(SubtaskSnapshot(0, (0, MAX_P - 1), written.paths),),
            ),
        ),
        files=tuple(written.files),
    )


def test_reserve_attach_complete(catalog: Any, storage: CheckpointStorage, make_rows) -> None:
    pending = _reserve(catalog, storage)
    assert pending.record.status is SnapshotStatus.PENDING and pending.record.checkpoint_id == 1
    meta = _write(pending, make_rows(MAX_P, 2))
    total, entries = pending.attach(meta)
    assert not pending.snapshot.has_metadata()  # written last, by complete
    done = pending.complete(meta, bytes=total, entries=entries)
    assert done.status is SnapshotStatus.COMPLETED and done.bytes == total
    assert read_metadata(pending.snapshot) == meta
    refs = {f.path: f for f in catalog.snapshot_files(done.id)}
    meta_ref = refs[pending.snapshot.fs.unstrip_protocol(pending.snapshot.metadata_path)]
    assert meta_ref.details == {"kind": METADATA_FILE}
    assert len(refs) == len(meta.files) + 1 and total == sum(f.size for f in refs.values())
    # a COMPLETED snapshot is never torn down by an abort
    assert pending.abort("late failure") is False
    assert catalog.get_snapshot(done.id).status is SnapshotStatus.COMPLETED
    assert read_metadata(pending.snapshot) == meta


def test_a_committed_directory_is_refused_before_any_row_exists(
    catalog: Any, storage: CheckpointStorage, make_rows, write_snapshot
) -> None:
    write_snapshot(make_rows(MAX_P, 1), job="job", checkpoint_id=1)  # no catalog row: foreign
    with pytest.raises(InvalidSnapshotRequest, match="already holds a committed"):
        _reserve(catalog, storage)
    assert catalog.list_snapshots("job") == []  # nothing points at the committed directory


def test_an_abort_fails_forgets_and_removes_so_the_names_can_be_written_again(
    catalog: Any, storage: CheckpointStorage, make_rows
) -> None:
    target = storage.url_of("fixed-savepoint")
    first = _reserve(catalog, storage, kind=SnapshotKind.SAVEPOINT, savepoint_dir=target)
    meta = _write(first, make_rows(MAX_P, 1))
    first.attach(meta)
    assert first.abort(OSError("disk gone")) is True
    failed = catalog.get_snapshot(first.record.id)
    assert failed.status is SnapshotStatus.FAILED and failed.error == "OSError: disk gone"
    assert catalog.snapshot_files(failed.id) == []
    assert not first.snapshot.fs.exists(first.snapshot.path)
    # the same directory again: its _metadata path is a name the catalog has forgotten
    second = reserve(
        catalog, storage, "job", kind=SnapshotKind.SAVEPOINT, format=SnapshotFormat.CANONICAL,
        parallelism=1, max_parallelism=MAX_P, trigger="test", savepoint_dir=target,
    )  # fmt: skip
    assert second.snapshot.url == first.snapshot.url
    meta2 = _write(second, make_rows(MAX_P, 2))
    second.attach(meta2)
    assert second.complete(meta2).status is SnapshotStatus.COMPLETED


def test_a_relocated_savepoint_is_registered_with_its_files(
    catalog: Any, storage: CheckpointStorage, make_rows, write_snapshot
) -> None:
    catalog.register_job("job", max_parallelism=MAX_P, location=storage.url_of("job"))
    snap, meta = write_snapshot(make_rows(MAX_P, 1), kind=SnapshotKind.SAVEPOINT)
    record = register(catalog, "job", snap, meta, trigger="relocated")
    assert (record.status, record.kind, record.trigger) == (
        SnapshotStatus.COMPLETED,
        SnapshotKind.SAVEPOINT,
        "relocated",
    )
    refs = catalog.snapshot_files(record.id)
    assert len(refs) == len(meta.files) + 1
    assert record.bytes == sum(f.size for f in meta.files) + len(snap.read_metadata_bytes())
