"""What the repository takes and returns: plain frozen dataclasses, no live ORM objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: int
    name: str
    max_parallelism: int
    location: str | None
    properties: dict[str, Any]
    created_at: datetime
    origin: str = "statekeeper"
    #: what Statekeeper may delete in the job's directories (of ``models.JOB_ACTIONS``, in that
    #: order); empty: read-only
    manage: tuple[str, ...] = ("retention", "orphans")


@dataclass(frozen=True, slots=True)
class OperatorRecord:
    id: int
    job_id: int
    uid: str
    name: str | None


@dataclass(frozen=True, slots=True)
class StateRecord:
    id: int
    operator_id: int
    operator: str
    name: str
    kind: str
    serializers: dict[str, Any]
    ttl: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    id: int
    job_id: int
    job: str
    checkpoint_id: int
    kind: SnapshotKind
    format: SnapshotFormat
    status: SnapshotStatus
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
    #: the run (its writer lease owner) that began it; None: begun without a writer lease
    writer: str | None = None
    #: facts its origin keeps about it (a discarded Flink snapshot: the stamp of its _metadata)
    details: dict[str, Any] | None = None
    #: when an import recorded it (None: written by Statekeeper); see docs/catalog.md
    imported_at: datetime | None = None
    #: the reader of its ``_metadata``: "flink" or "statekeeper"
    metadata_format: str = "statekeeper"
    #: where ``entries`` comes from: "counted", "estimated", "not-counted" (None: by format)
    entries_basis: str | None = None


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file to attach to a snapshot.

    ``shared`` files (e.g. RocksDB SSTs under ``shared/``) may be referenced by many snapshots;
    any other file belongs to the one snapshot that registered it. ``reused``: an earlier
    snapshot's file that this one references again instead of writing it, so the catalog must
    still know it. ``foreign``: a file outside the snapshot's job's own directories (a Flink
    job restored in NO_CLAIM or LEGACY mode references its ancestor's files); if another job
    holds it, the snapshot references that job's file, which stays live while it does. ``grows``:
    a file its writer may still append to (Flink's file merging across checkpoints, a physical
    file of many snapshots' ranges): ``size`` is what this snapshot needs of it, the catalog
    keeps the largest any snapshot needed, and verify wants at least that much in storage.
    ``operator`` is the operator uid (created on first use); the key-group range is inclusive.
    """

    path: str
    size: int
    checksum: str | None = None
    shared: bool = False
    operator: str | None = None
    subtask: int | None = None
    key_group_start: int | None = None
    key_group_end: int | None = None
    details: dict[str, Any] | None = None
    reused: bool = False
    foreign: bool = False
    grows: bool = False


@dataclass(frozen=True, slots=True)
class FileGroup:
    """Files one snapshot references for one operator subtask and key-group range, as columns:
    the bulk form of :class:`FileRef` (``attach_files`` takes both, and stores references this
    way). ``paths`` and ``sizes`` are position for position, and so are ``shared``,
    ``checksums`` and ``details`` where given as sequences (``shared`` may also be one flag for
    all); the range and the ``reused``, ``foreign`` and ``grows`` flags are every file's, as a
    FileRef of each would give them. A RocksDB checkpoint's shared SSTs of one subtask are one
    group: thousands of files, no object per file. ``common_details``: what the writer records
    about every file of the group, stored once (a reference's details are these and its own,
    its own winning on a key both give), such as a Flink import's role and kind of the SSTs.
    """

    paths: Sequence[str]
    sizes: Sequence[int]
    shared: Sequence[bool] | bool = False
    checksums: Sequence[str | None] | None = None
    details: Sequence[dict[str, Any] | None] | None = None
    operator: str | None = None
    subtask: int | None = None
    key_group_start: int | None = None
    key_group_end: int | None = None
    reused: bool = False
    foreign: bool = False
    grows: bool = False
    common_details: dict[str, Any] | None = None

    def is_shared(self, i: int) -> bool:
        """Whether the file at position ``i`` is shared."""
        return self.shared if isinstance(self.shared, bool) else bool(self.shared[i])


@dataclass(frozen=True, slots=True)
class KeyGroupStatRow:
    operator: str
    key_group: int
    rows: int
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: int
    job_id: int
    path: str
    size: int
    checksum: str | None
    shared: bool
    created_by_snapshot_id: int | None
    last_used_snapshot_id: int | None
    live_refs: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SnapshotFileRecord:
    snapshot_id: int
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
    # what the writer recorded about this reference (Flink imports: role, kind, Flink's path)
    details: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SizePoint:
    """The state size of one operator in one completed snapshot."""

    snapshot_id: int
    checkpoint_id: int
    kind: str
    status: str
    completed_at: datetime | None
    operator: str | None
    files: int
    bytes: int
    shared_bytes: int


@dataclass(frozen=True, slots=True)
class SkewRecord:
    """Rows per key group of one operator in one snapshot: skew = max / mean (1.0 is even)."""

    snapshot_id: int
    operator: str
    key_groups: int
    recorded_key_groups: int
    total_rows: int
    max_rows: int
    mean_rows: float
    skew: float | None


@dataclass(frozen=True, slots=True)
class RunRecord:
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
    task_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    name: str
    owner: str
    token: int
    acquired_at: datetime
    expires_at: datetime
    released_at: datetime | None

    def held_at(self, now: datetime) -> bool:
        """Whether the lease is held at ``now``: neither released nor expired."""
        return self.released_at is None and self.expires_at > now


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    # why the rows stop early ("10,000 rows", "16,777,216 bytes"), or None when they are all here
    truncated: str | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a longer answer: ``items`` from position ``offset`` on, of ``total`` in all.

    ``items`` and ``total`` come from one read transaction, so they agree with each other.
    """

    items: list[T]
    total: int
    offset: int
    limit: int | None

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.items) < self.total


@dataclass(frozen=True, slots=True)
class FilesSummary:
    """What a snapshot references: ``references`` rows (a file read by several subtasks is
    referenced once per subtask), over ``files`` distinct files of ``bytes`` in all."""

    references: int
    files: int
    bytes: int
    shared_files: int
    shared_bytes: int
