"""Damaged snapshots as a user meets them: a restore refuses them with an error that names the
file and says what to do, ``statectl verify`` points at them, the catalog and storage are left
as they were, and the job restored from the intact snapshot before loses nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from state_engine.checkpoint import CheckpointManager, HeapBackendFactory
from state_engine.errors import (
    ChecksumMismatch,
    CorruptMetadata,
    InvalidSnapshotPath,
    SnapshotFileMismatch,
)
from state_engine.examples import fraud
from state_engine.verify import verify

if TYPE_CHECKING:  # the fixture's type, for annotations only: never import a conftest at run time
    from tests.bad_input.conftest import Killed


def _listing(killed: Killed) -> dict[str, int]:
    root = Path(killed.storage.removeprefix("file://"))
    return {p.as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _refused(killed: Killed, error: type[BaseException], *needles: str) -> None:
    """Restoring the latest snapshot fails with ``error`` naming ``needles``; nothing changed."""
    before = _listing(killed)
    statuses = [s.status for s in killed.snapshots]
    with pytest.raises(error) as exc:
        killed.resume("latest")
    for needle in needles:
        assert needle in str(exc.value)
    assert "restore from another snapshot" in str(exc.value)
    assert _listing(killed) == before  # nothing deleted, nothing rewritten
    assert [killed.catalog.get_snapshot(s.id).status for s in killed.snapshots] == statuses


def _intact_earlier_snapshot_loses_nothing(killed: Killed, reference: Any) -> None:
    earlier = killed.snapshots[1]
    assert verify(killed.catalog, fraud.JOB_NAME, deep=True).errors  # the damage is still there
    result = killed.resume(earlier.id)
    assert result.restored_from.id == earlier.id
    assert killed.alerts() == reference


def test_a_truncated_file(killed: Killed, reference: Any) -> None:
    victim = killed.biggest_file(killed.snapshots[0])
    size = victim.stat().st_size
    with victim.open("r+b") as f:
        f.truncate(size - 100)
    _refused(killed, SnapshotFileMismatch, victim.name, f"has {size - 100} bytes", str(size))
    report = verify(killed.catalog, fraud.JOB_NAME, deep=False)
    assert [f.kind for f in report.errors] == ["size"]
    _intact_earlier_snapshot_loses_nothing(killed, reference)


def test_a_flipped_byte_is_refused_by_a_checksum_verifying_restore(
    killed: Killed, reference: Any
) -> None:
    victim = killed.biggest_file(killed.snapshots[0])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    # statectl verify (deep, its default) names the file
    report = verify(killed.catalog, fraud.JOB_NAME)
    assert [(f.kind, f.path) for f in report.errors] == [("checksum", victim.as_uri())]
    # a restore with checksum verification refuses it
    manager = CheckpointManager(
        killed.catalog, killed.storage, fraud.JOB_NAME, max_parallelism=fraud.MAX_PARALLELISM,
        parallelism=2, format=killed.fmt, verify_checksums=True,
    )  # fmt: skip
    with manager, pytest.raises(ChecksumMismatch, match=victim.name):
        manager.restore("latest", parallelism=2, factory=HeapBackendFactory())
    _intact_earlier_snapshot_loses_nothing(killed, reference)


def test_a_flipped_byte_is_refused_by_the_job_runner(killed: Killed, reference: Any) -> None:
    """No option needed: native files are checksummed while they are copied, canonical Parquet
    pages carry CRCs that every read verifies."""
    victim = killed.biggest_file(killed.snapshots[0])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    _refused(killed, ChecksumMismatch, victim.name, killed.snapshots[0].location)
    _intact_earlier_snapshot_loses_nothing(killed, reference)


def test_metadata_edited_by_hand(killed: Killed, reference: Any) -> None:
    """A recorded size 'corrected' by hand: the document parses, the file no longer matches."""
    path = killed.metadata(killed.snapshots[0])
    doc = json.loads(path.read_bytes())
    entry = doc["files"][0]
    entry["size"] += 1
    path.write_text(json.dumps(doc))
    _refused(killed, SnapshotFileMismatch, entry["path"].rsplit("/", 1)[-1])
    kinds = {f.kind for f in verify(killed.catalog, fraud.JOB_NAME).errors}
    assert "metadata-mismatch" in kinds and kinds & {"size", "checksum"}  # and its bytes changed
    _intact_earlier_snapshot_loses_nothing(killed, reference)


def test_metadata_that_is_not_json(killed: Killed, reference: Any) -> None:
    path = killed.metadata(killed.snapshots[0])
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    _refused(killed, CorruptMetadata, "_metadata")
    _intact_earlier_snapshot_loses_nothing(killed, reference)


def test_metadata_pointing_outside_the_snapshot(killed: Killed, reference: Any) -> None:
    """A path-traversal file entry ('../../..') is refused before anything is opened."""
    path = killed.metadata(killed.snapshots[0])
    doc = json.loads(path.read_bytes())
    doc["files"][0]["path"] = "../../../../../../etc/passwd"
    path.write_text(json.dumps(doc))
    with pytest.raises((CorruptMetadata, InvalidSnapshotPath)) as exc:
        killed.resume("latest")
    assert "etc/passwd" in str(exc.value) and "'..'" in str(exc.value)
    _intact_earlier_snapshot_loses_nothing(killed, reference)
