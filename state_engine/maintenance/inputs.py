"""The input snapshot of a job: found in the catalog, checked usable, its ``_metadata`` read.

One loader for every job that reads a snapshot (:func:`load_input`): the snapshot must be
COMPLETED, reachable by Spark and hold files of a format the job reads (the format the files
say: a native checkpoint written by heap backends is canonical).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.errors import (
    InvalidJobParams,
    MissingMetadata,
    NoSuchSnapshot,
    SnapshotNotUsable,
)
from state_engine.maintenance.reachable import check_reachable
from state_engine.maintenance.run import RunTarget
from state_engine.maintenance.source import open_source, snapshot_format
from state_engine.snapshot.metadata import FileKind, SnapshotFile, SnapshotMetadata, read_metadata
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotStatus

_ADVICE = {
    SnapshotFormat.NATIVE: "; take a canonical savepoint of it first (the savepoint job)",
    SnapshotFormat.DELTA: "; fold its chain with the compaction job first",
}


@dataclass(frozen=True)
class InputSnapshot:
    record: SnapshotRecord
    snapshot: SnapshotDir
    meta: SnapshotMetadata
    format: SnapshotFormat

    @property
    def url(self) -> str:
        return self.snapshot.url

    def keyed_files(self, operator: str) -> list[SnapshotFile]:
        return self.meta.files_of(operator, kinds=(FileKind.KEYED,))

    @property
    def keyed_operators(self) -> list[str]:
        return [op.operator_id for op in self.meta.operators if op.subtasks]


def resolve_input(catalog: Catalog, params: dict[str, Any]) -> RunTarget:
    """``snapshot`` (an id) or ``job`` (its latest COMPLETED snapshot) -> the run's target."""
    snapshot_id = params.get("snapshot")
    job = params.get("job")
    if snapshot_id is None:
        if job is None:
            raise InvalidJobParams("name the input: --snapshot ID, or --job NAME for its latest")
        latest = catalog.latest_snapshot(job)
        if latest is None:
            raise NoSuchSnapshot(
                f"job {job!r} has no COMPLETED snapshot; list them with `statectl snapshots {job}`"
            )
        params["snapshot"] = snapshot_id = latest.id
    record = catalog.get_snapshot(int(snapshot_id))
    if job is not None and record.job != job:
        raise InvalidJobParams(f"snapshot {record.id} belongs to job {record.job!r}, not {job!r}")
    return RunTarget(job=record.job, input_snapshot_id=record.id)


def load_input(
    catalog: Catalog,
    snapshot_id: int,
    *,
    allow: tuple[SnapshotFormat, ...] = (SnapshotFormat.CANONICAL,),
) -> InputSnapshot:
    """A COMPLETED snapshot whose files are of an ``allow``-ed format, reachable by Spark, with
    its ``_metadata`` read."""
    record = catalog.get_snapshot(snapshot_id)
    if record.status is not SnapshotStatus.COMPLETED:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.status}, not COMPLETED; "
            f"only completed snapshots are read: pick one from `statectl snapshots {record.job}`"
        )
    check_reachable(record.location)
    snap = open_source(record.location, record.kind)
    try:
        meta = read_metadata(snap)
    except MissingMetadata:
        if record.format not in allow:  # refused for its format before its directory is asked
            raise _not_usable(record, record.format, allow) from None
        raise
    fmt = snapshot_format(meta)
    if fmt not in allow:
        raise _not_usable(record, fmt, allow)
    return InputSnapshot(record, snap, meta, fmt)


def _not_usable(
    record: SnapshotRecord, fmt: SnapshotFormat, allow: tuple[SnapshotFormat, ...]
) -> SnapshotNotUsable:
    return SnapshotNotUsable(
        f"snapshot {record.id} of job {record.job!r} holds {fmt} files; this job reads "
        f"{' or '.join(str(a) for a in allow)} snapshots{_ADVICE.get(fmt, '')}"
    )
