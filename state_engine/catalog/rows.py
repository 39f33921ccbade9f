"""What every part of the catalog's repository shares: a job or snapshot looked up (locked or
not), operators created on first use, and ORM rows turned into the records callers get."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Select, insert, select
from sqlalchemy.orm import Session

from state_engine.catalog import views
from state_engine.catalog.models import (
    SNAPSHOT_KINDS,
    SNAPSHOT_STATUSES,
    File,
    Job,
    Operator,
    Snapshot,
    State,
)
from state_engine.catalog.records import FileRecord, JobRecord, SnapshotRecord, StateRecord
from state_engine.catalog.store import Store, check_choice, check_name
from state_engine.errors import (
    InvalidCatalogInput,
    InvalidSnapshotTransition,
    NoSuchJob,
    NoSuchSnapshot,
)
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

#: a row per reference of a snapshot to a file (the view over sk_snapshot_file_groups)
Ref = views.references
REFERENCES = Ref.name


class RowsMixin(Store):
    """Lookups inside a caller's transaction (``s``), for the catalog's public calls."""

    def _snapshot_record(self, s: Session, snapshot_id: int) -> SnapshotRecord:
        row = s.execute(
            select(Snapshot, Job.name)
            .join(Job, Job.id == Snapshot.job_id)
            .where(Snapshot.id == snapshot_id)
            .execution_options(populate_existing=True)
        ).one_or_none()
        if row is None:
            raise no_snapshot(snapshot_id)
        return snapshot_record(row[0], row[1])

    def _lock_snapshot(
        self, s: Session, snapshot_id: int, allowed: tuple[str, ...], action: str
    ) -> Snapshot:
        # The row lock (PostgreSQL) keeps a concurrent completion out until this write commits.
        snap = s.scalars(
            select(Snapshot).where(Snapshot.id == snapshot_id).with_for_update()
        ).one_or_none()
        if snap is None:
            raise no_snapshot(snapshot_id)
        if snap.status not in allowed:
            raise InvalidSnapshotTransition(
                f"cannot {action} snapshot {snapshot_id}: it is {snap.status}, and that is only "
                f"allowed while it is {' or '.join(allowed)}; begin a new snapshot instead"
            )
        return snap

    def _operator_ids(self, s: Session, job_id: int, uids: Iterable[str]) -> dict[str, int]:
        wanted = set(uids)
        if not wanted:
            return {}
        found = dict(
            s.execute(
                select(Operator.uid, Operator.id).where(
                    Operator.job_id == job_id, Operator.uid.in_(list(wanted))
                )
            ).all()
        )
        missing = sorted(wanted - found.keys())
        if missing:
            now = self.now()
            for uid in missing:
                check_name(uid, "an operator uid")
            returned = s.connection().execute(
                insert(Operator).returning(Operator.uid, Operator.id),
                [{"job_id": job_id, "uid": uid, "created_at": now} for uid in missing],
            )
            found.update(returned.all())
        return found


def jobs_stmt() -> Select[Job]:
    return select(Job).order_by(Job.name)


def snapshots_stmt(
    job_id: int, status: str | Sequence[str] | None, kind: str | None
) -> Select[Snapshot]:
    stmt = select(Snapshot).where(Snapshot.job_id == job_id)
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        checked = [check_choice(st, "status", SNAPSHOT_STATUSES) for st in statuses]
        stmt = stmt.where(Snapshot.status.in_(checked))
    if kind is not None:
        stmt = stmt.where(Snapshot.kind == check_choice(kind, "kind", SNAPSHOT_KINDS))
    return stmt.order_by(Snapshot.checkpoint_id.desc())


def resolve_job(s: Session, job: str | int) -> Job:
    if isinstance(job, bool) or not isinstance(job, str | int):
        raise InvalidCatalogInput(f"a job is named by its name or id, got {job!r}")
    stmt = (
        select(Job).where(Job.id == job)
        if isinstance(job, int)
        else select(Job).where(Job.name == job)
    )
    row = s.scalars(stmt).one_or_none()
    if row is None:
        raise NoSuchJob(f"no job {job!r} in the catalog; list the known jobs with `statectl jobs`")
    return row


def no_snapshot(snapshot_id: int) -> NoSuchSnapshot:
    return NoSuchSnapshot(
        f"no snapshot {snapshot_id!r} in the catalog; list a job's snapshots with "
        "`statectl snapshots JOB`"
    )


def job_record(j: Job) -> JobRecord:
    return JobRecord(
        j.id,
        j.name,
        j.max_parallelism,
        j.location,
        j.properties,
        j.created_at,
        j.origin,
        tuple(a for a in (j.manage or "").split(",") if a),
    )


def state_record(r: State, operator: str) -> StateRecord:
    return StateRecord(
        r.id,
        r.operator_id,
        operator,
        r.name,
        r.kind,
        r.serializers,
        r.ttl,
        r.created_at,
        r.updated_at,
    )


def snapshot_record(r: Snapshot, job: str) -> SnapshotRecord:
    return SnapshotRecord(
        id=r.id,
        job_id=r.job_id,
        job=job,
        checkpoint_id=r.checkpoint_id,
        kind=SnapshotKind(r.kind),
        format=SnapshotFormat(r.format),
        status=SnapshotStatus(r.status),
        parent_id=r.parent_id,
        parallelism=r.parallelism,
        max_parallelism=r.max_parallelism,
        location=r.location,
        bytes=r.bytes,
        entries=r.entries,
        created_at=r.created_at,
        completed_at=r.completed_at,
        duration_ms=r.duration_ms,
        trigger=r.trigger,
        version=r.version,
        error=r.error,
        writer=r.writer,
        details=r.details,
        imported_at=r.imported_at,
        metadata_format=r.metadata_format or "statekeeper",
        entries_basis=r.entries_basis,
    )


def file_record(f: File) -> FileRecord:
    return FileRecord(
        f.id,
        f.job_id,
        f.path,
        f.size,
        f.checksum,
        f.shared,
        f.created_by_snapshot_id,
        f.last_used_snapshot_id,
        f.live_refs,
        f.created_at,
    )
