"""Flink snapshots whose ``_metadata`` cannot be read: recorded FAILED, not a blocked import.

A truncated ``chk-11/_metadata`` is one broken checkpoint; the directory's other checkpoints
import. The broken one is a FAILED snapshot (trigger ``flink-import``) whose ``error`` says why,
so ``statectl verify`` shows it and a later sync neither records it twice nor keeps it once it
reads again or is gone (docs/flink-format.md, "Partial imports").
"""

from __future__ import annotations

import posixpath
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from state_engine.catalog import Catalog
from state_engine.catalog.records import SnapshotRecord
from state_engine.errors import CommitConflict
from state_engine.flink.layout import ROLE_CHECKPOINTS, is_checkpoint_dir
from state_engine.flink.metadata import HEADER_MAGIC_NUMBER
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

if TYPE_CHECKING:
    from state_engine.flink.import_job import ImportReport, Listing

#: what the ``error`` of an unreadable snapshot starts with
UNREADABLE = "unreadable _metadata: "


@dataclass(frozen=True)
class Unreadable:
    """A snapshot directory whose ``_metadata`` does not read: where, its checkpoint id (None
    when neither its directory's name nor the file's header gives one), and why."""

    location: str
    metadata_path: str
    kind: str
    checkpoint_id: int | None
    reason: str


def checkpoint_id_of(directory: str, data: bytes) -> int | None:
    """The checkpoint id of a snapshot whose ``_metadata`` does not read: its ``chk-N`` name,
    else the header's (magic, version, id), else None."""
    name = posixpath.basename(directory.rstrip("/"))
    if is_checkpoint_dir(name):
        return int(name.split("-", 1)[1])
    if len(data) >= 16 and struct.unpack_from(">I", data)[0] == HEADER_MAGIC_NUMBER:
        (cid,) = struct.unpack_from(">q", data, 8)
        return cid if cid >= 0 else None
    return None


def unreadable_of(listing: Listing, metadata_path: str, data: bytes, reason: str) -> Unreadable:
    directory = posixpath.dirname(metadata_path)
    checkpoint = listing.role == ROLE_CHECKPOINTS and is_checkpoint_dir(
        posixpath.basename(directory)
    )
    return Unreadable(
        listing.to_url(directory),
        listing.to_url(metadata_path),
        SnapshotKind.CHECKPOINT if checkpoint else SnapshotKind.SAVEPOINT,
        checkpoint_id_of(directory, data),
        reason,
    )


def is_unreadable(snap: SnapshotRecord) -> bool:
    """Whether ``snap`` is an import's record of a snapshot whose ``_metadata`` did not read."""
    return snap.status is SnapshotStatus.FAILED and (snap.error or "").startswith(UNREADABLE)


def record_unreadable(
    catalog: Catalog,
    job: str,
    items: list[Unreadable],
    existing: dict[int, list[SnapshotRecord]],
    report: ImportReport,
    trigger: str,
) -> None:
    """Record each of ``items`` as a FAILED snapshot (once: a sync finds it recorded), and
    report it; ``existing``: the job's snapshots by checkpoint id."""
    for item in items:
        entry: dict[str, Any] = {
            "checkpoint_id": item.checkpoint_id,
            "location": item.location,
            "reason": item.reason,
            "snapshot_id": None,
            "recorded": False,
        }
        report.unreadable.append(entry)
        if item.checkpoint_id is None:
            entry["reason"] += "; neither its directory nor its header gives a checkpoint id: not "
            entry["reason"] += "recorded in the catalog"
            continue
        live = [
            s
            for s in existing.get(item.checkpoint_id, [])
            if s.status is not SnapshotStatus.DISCARDED
        ]
        if live:
            prior = live[0]
            entry["snapshot_id"] = prior.id
            if prior.location != item.location:
                entry["reason"] += (
                    f"; checkpoint id {item.checkpoint_id} is already snapshot {prior.id} at "
                    f"{prior.location}: not recorded"
                )
            elif prior.status is SnapshotStatus.COMPLETED:
                entry["reason"] += (
                    f"; snapshot {prior.id} was imported when it read: `statectl verify` reports it"
                )
            continue  # recorded FAILED by an earlier import: once
        try:
            with catalog.batch():
                snap = catalog.begin_snapshot(
                    job,
                    location=item.location,
                    parallelism=1,
                    kind=item.kind,
                    format=SnapshotFormat.NATIVE,
                    checkpoint_id=item.checkpoint_id,
                    trigger=trigger,
                    metadata_format="flink",
                )
                catalog.fail_snapshot(snap.id, error=UNREADABLE + item.reason)
        except CommitConflict:  # a snapshot of this import took the id
            entry["reason"] += (
                f"; checkpoint id {item.checkpoint_id} is another snapshot's: not recorded"
            )
            continue
        entry["snapshot_id"] = snap.id
        entry["recorded"] = True
