"""Response models of the catalog API: the catalog's records, typed for OpenAPI."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, computed_field

from state_engine.formatting import is_estimated


class Record(BaseModel):
    # The catalog returns frozen dataclasses; read them by attribute.
    model_config = ConfigDict(from_attributes=True)


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    total: int
    limit: int
    offset: int
    items: list[T]


class SnapshotOut(Record):
    id: int
    job_id: int
    job: str
    checkpoint_id: int
    kind: str
    format: str
    status: str
    parent_id: int | None
    parallelism: int
    max_parallelism: int
    location: str
    bytes: int
    entries: int
    created_at: datetime
    completed_at: datetime | None
    duration_ms: int | None
    trigger: str
    version: int
    error: str | None

    @computed_field  # type: ignore[prop-decorator]  # over @property, as pydantic documents
    @property
    def entries_estimated(self) -> bool:
        """``entries`` (and the key-group rows) are estimated from RocksDB SST metadata."""
        return is_estimated(self.format)


class JobOut(Record):
    id: int
    name: str
    max_parallelism: int
    location: str | None
    properties: dict[str, Any]
    created_at: datetime
    #: what Statekeeper may delete in the job's directories (retention, orphans); empty: read-only
    manage: tuple[str, ...] = ()
    latest_snapshot: SnapshotOut | None = None


class SnapshotFileOut(Record):
    file_id: int
    path: str
    size: int
    checksum: str | None
    shared: bool
    operator: str | None
    subtask: int | None
    key_group_start: int | None
    key_group_end: int | None
    created_by_snapshot_id: int | None
    last_used_snapshot_id: int | None


class SkewOut(Record):
    operator: str
    key_groups: int
    recorded_key_groups: int
    total_rows: int
    max_rows: int
    mean_rows: float
    skew: float | None
    # the rows per key group are estimated (a native snapshot's SST metadata), not counted
    estimated: bool = False


class FilesSummary(Record):
    """Distinct ``files`` of ``bytes`` in all; ``references`` counts a file once per subtask
    that reads it."""

    references: int
    files: int
    bytes: int
    shared_files: int
    shared_bytes: int


class SnapshotDetail(BaseModel):
    snapshot: SnapshotOut
    files: FilesSummary
    skew: list[SkewOut]


class SizePointOut(Record):
    snapshot_id: int
    checkpoint_id: int
    kind: str
    status: str
    completed_at: datetime | None
    operator: str | None
    files: int
    bytes: int
    shared_bytes: int


class RunOut(Record):
    id: int
    run_id: str
    kind: str
    job_id: int | None
    job: str | None
    status: str
    params: dict[str, Any]
    stats: dict[str, Any] | None
    input_snapshot_id: int | None
    output_snapshot_id: int | None
    rows_in: int | None
    rows_out: int | None
    bytes_in: int | None
    bytes_out: int | None
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    dag_id: str | None
    airflow_run_id: str | None


class ErrorOut(BaseModel):
    detail: str
