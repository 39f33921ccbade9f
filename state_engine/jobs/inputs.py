"""The input snapshot of a job: found in the catalog, checked usable, its ``_metadata`` read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint.metadata import (
    FileKind,
    SnapshotFile,
    SnapshotFormat,
    SnapshotMetadata,
    read_metadata,
)
from state_engine.checkpoint.storage import SnapshotDir
from state_engine.errors import InvalidJobParams, NoSuchSnapshot, SnapshotNotUsable
from state_engine.jobs.run import RunTarget
from state_engine.jobs.spark import check_reachable
from state_engine.snapshot_enums import SnapshotStatus


@dataclass(frozen=True)
class InputSnapshot:
    record: SnapshotRecord
    snapshot: SnapshotDir
    meta: SnapshotMetadata

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


def load_input(catalog: Catalog, snapshot_id: int) -> InputSnapshot:
    """A COMPLETED canonical snapshot, reachable by Spark, with its verified ``_metadata``."""
    record = catalog.get_snapshot(snapshot_id)
    if record.status is not SnapshotStatus.COMPLETED:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.status}, not COMPLETED; "
            f"only completed snapshots are read: pick one from `statectl snapshots {record.job}`"
        )
    if record.format is not SnapshotFormat.CANONICAL:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is in {record.format} format; this job "
            "reads canonical snapshots: run compaction (delta) or a savepoint (native) first"
        )
    check_reachable(record.location)
    snap = SnapshotDir.from_url(record.location)
    return InputSnapshot(record, snap, read_metadata(snap))
