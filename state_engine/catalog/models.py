"""The catalog's tables, as SQLAlchemy 2.x typed models (the migrations mirror them exactly)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from state_engine.snapshot_enums import RETAINED_STATUSES as RETAINED
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

# The strings the columns hold (check constraints spell them out): the enums' values.
SNAPSHOT_KINDS = tuple(k.value for k in SnapshotKind)
SNAPSHOT_FORMATS = tuple(f.value for f in SnapshotFormat)
SNAPSHOT_STATUSES = tuple(s.value for s in SnapshotStatus)
# Retained snapshots pin their files: nothing they reference may be deleted.
RETAINED_STATUSES = tuple(s.value for s in RETAINED)
RUN_STATUSES = ("RUNNING", "SUCCEEDED", "FAILED", "DRY_RUN")
# Who wrote a job's snapshots: Statekeeper's runtime, or Apache Flink (imported, migration 0003).
JOB_ORIGINS = ("statekeeper", "flink")
# Which reader reads a snapshot's _metadata, and where its entry count comes from (0009).
METADATA_FORMATS = ("statekeeper", "flink")
ENTRIES_BASES = ("counted", "estimated", "not-counted")
# What Statekeeper may delete in a job's directories (its management policy, migration 0008):
# ``retention`` (expire: old checkpoints, named savepoints), ``orphans`` (orphan cleanup).
JOB_ACTIONS = ("retention", "orphans")
#: the policy a job gets when none is given: a Statekeeper job's everything, a Flink job's nothing
DEFAULT_MANAGE = {"statekeeper": ",".join(JOB_ACTIONS), "flink": ""}

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores none, so it is restored)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite compares timestamps as text: one fixed format keeps that order chronological.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite autoincrements only an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
BigId = BigInteger().with_variant(Integer(), "sqlite")


#: the rows the unique (job_id, checkpoint_id) index covers: every snapshot not DISCARDED
LIVE_CHECKPOINT = f"status <> '{SnapshotStatus.DISCARDED.value}'"


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType}


class Job(Base):
    __tablename__ = "sk_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    max_parallelism: Mapped[int] = mapped_column(Integer)
    location: Mapped[str | None] = mapped_column(Text)
    properties: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime]
    origin: Mapped[str] = mapped_column(String(16), server_default="statekeeper")
    #: the JOB_ACTIONS Statekeeper may take in the job's directories, comma-separated in
    #: JOB_ACTIONS order; empty: read-only (migration 0008)
    manage: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_MANAGE["statekeeper"])


class JobDir(Base):
    """A directory a job's snapshots are imported from; one directory belongs to one job."""

    __tablename__ = "sk_job_dirs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("sk_jobs.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text, unique=True)
    role: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime]


class Operator(Base):
    __tablename__ = "sk_operators"
    __table_args__ = (UniqueConstraint("job_id", "uid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("sk_jobs.id", ondelete="CASCADE"))
    uid: Mapped[str] = mapped_column(String(200))
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime]


class State(Base):
    __tablename__ = "sk_states"
    __table_args__ = (UniqueConstraint("operator_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    operator_id: Mapped[int] = mapped_column(ForeignKey("sk_operators.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    serializers: Mapped[dict[str, Any]] = mapped_column(JSONType)
    ttl: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Snapshot(Base):
    __tablename__ = "sk_snapshots"
    __table_args__ = (
        # One live snapshot per checkpoint id. A DISCARDED row is history: a Flink job restarted
        # under the same job id writes its chk-N again where an expired one was (migration 0005).
        Index(
            "uq_sk_snapshots_live_checkpoint_id",
            "job_id",
            "checkpoint_id",
            unique=True,
            sqlite_where=text(LIVE_CHECKPOINT),
            postgresql_where=text(LIVE_CHECKPOINT),
        ),
        Index(None, "job_id", "status", "checkpoint_id"),
        CheckConstraint(_in("kind", SNAPSHOT_KINDS), name="kind"),
        CheckConstraint(_in("format", SNAPSHOT_FORMATS), name="format"),
        CheckConstraint(_in("status", SNAPSHOT_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("sk_jobs.id", ondelete="CASCADE"))
    checkpoint_id: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    format: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("sk_snapshots.id"))
    parallelism: Mapped[int] = mapped_column(Integer)
    max_parallelism: Mapped[int] = mapped_column(Integer)
    location: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    completed_at: Mapped[datetime | None]
    duration_ms: Mapped[int | None] = mapped_column(BigInteger)
    trigger: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    #: the writer lease owner (a JobRunner's run) that began it; None without one
    writer: Mapped[str | None] = mapped_column(String(200))
    #: facts an origin keeps about the snapshot (a discarded Flink snapshot: its _metadata's
    #: stamp, ``state_engine.flink.discarded``); None when there are none
    details: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    #: when an import recorded a snapshot another system wrote (None: a Statekeeper writer's);
    #: its ``completed_at`` is then when that system completed it (migration 0009)
    imported_at: Mapped[datetime | None]
    #: which reader reads its ``_metadata``: "flink" or "statekeeper" (migration 0009)
    metadata_format: Mapped[str] = mapped_column(String(16), server_default="statekeeper")
    #: where ``entries`` comes from: "counted", "estimated" or "not-counted" (None: by format)
    entries_basis: Mapped[str | None] = mapped_column(String(16))


class File(Base):
    __tablename__ = "sk_files"
    __table_args__ = (
        # Orphan candidates are the files of a job whose live reference count is zero, read in
        # id order: the index hands them over sorted, so a LIMIT stops early (migration 0002).
        Index(None, "job_id", "live_refs", "id"),
        CheckConstraint("size >= 0", name="size"),
        CheckConstraint("live_refs >= 0", name="live_refs"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("sk_jobs.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(Text, unique=True)
    size: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[str | None] = mapped_column(String(128))
    shared: Mapped[bool] = mapped_column(Boolean)
    created_by_snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("sk_snapshots.id"))
    last_used_snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("sk_snapshots.id"))
    # Distinct retained (PENDING or COMPLETED) snapshots referencing the file, kept by the
    # repository on every attach and status change so orphan lookups need no scan of references.
    live_refs: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]


class SnapshotFileGroup(Base):
    """The files one snapshot references for one operator subtask and key-group range, as one row.

    A snapshot of a RocksDB job references thousands of shared files: a row per reference made
    registering (and importing) a snapshot cost more than listing its files. ``file_ids`` is a
    JSON array of ``sk_files`` ids in the order the writer gave them; ``details`` (NULL when no
    reference has any) the JSON array of what the writer recorded about each (an object or
    null), position for position; ``common_details`` (migration 0007; NULL when none) what it
    recorded about every file of the group, once (a reference's own details win on a key both
    give). ``foreign_files``: the files belong to another job (a Flink job
    restored from another's snapshot in NO_CLAIM or LEGACY mode references its ancestor's).

    The view ``sk_snapshot_files`` (migration 0006) gives a row per reference, for SQL. File ids
    have no foreign key here: the repository keeps them pointing at ``sk_files`` rows (forgetting
    a file, which no retained snapshot references, takes it out of the dead snapshots' groups).
    """

    __tablename__ = "sk_snapshot_file_groups"
    # forgetting a file looks for it in other jobs' dead snapshots through their foreign groups
    __table_args__ = (Index(None, "foreign_files", "snapshot_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(
        ForeignKey("sk_snapshots.id", ondelete="CASCADE"), index=True
    )
    operator_id: Mapped[int | None] = mapped_column(ForeignKey("sk_operators.id"))
    subtask: Mapped[int | None] = mapped_column(Integer)
    key_group_start: Mapped[int | None] = mapped_column(Integer)
    key_group_end: Mapped[int | None] = mapped_column(Integer)
    foreign_files: Mapped[bool] = mapped_column(Boolean)
    file_ids: Mapped[list[int]] = mapped_column(JSONType)
    details: Mapped[list[Any] | None] = mapped_column(JSONType)
    common_details: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class SnapshotSize(Base):
    """Per snapshot and operator totals, written once when the snapshot completes."""

    __tablename__ = "sk_snapshot_sizes"
    __table_args__ = (Index(None, "snapshot_id"), Index(None, "operator_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("sk_snapshots.id", ondelete="CASCADE"))
    operator_id: Mapped[int | None] = mapped_column(ForeignKey("sk_operators.id"))
    files: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)
    shared_bytes: Mapped[int] = mapped_column(BigInteger)


class KeyGroupStat(Base):
    __tablename__ = "sk_key_group_stats"

    snapshot_id: Mapped[int] = mapped_column(
        ForeignKey("sk_snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    operator_id: Mapped[int] = mapped_column(ForeignKey("sk_operators.id"), primary_key=True)
    key_group: Mapped[int] = mapped_column(Integer, primary_key=True)
    rows: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)


class MaintenanceRun(Base):
    __tablename__ = "sk_maintenance_runs"
    __table_args__ = (
        Index(None, "job_id", "started_at"),
        Index(None, "started_at"),
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(250), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("sk_jobs.id", ondelete="CASCADE"))
    params: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(String(16))
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    input_snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("sk_snapshots.id"))
    output_snapshot_id: Mapped[int | None] = mapped_column(ForeignKey("sk_snapshots.id"))
    rows_in: Mapped[int | None] = mapped_column(BigInteger)
    rows_out: Mapped[int | None] = mapped_column(BigInteger)
    bytes_in: Mapped[int | None] = mapped_column(BigInteger)
    bytes_out: Mapped[int | None] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    dag_id: Mapped[str | None] = mapped_column(String(250))
    airflow_run_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))


class Lease(Base):
    __tablename__ = "sk_leases"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    # Fencing token: grows by one on every acquisition, never reused for the same name.
    token: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    released_at: Mapped[datetime | None]
