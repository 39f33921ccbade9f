"""The catalog's repository API: jobs, operators, states and snapshots.

A snapshot is begun PENDING, gets its files (:mod:`~state_engine.catalog.file_registry`) and
key-group statistics attached, and is completed by compare-and-swap on its ``version``. The
questions people ask of it are in :mod:`~state_engine.catalog.reports`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Self, cast

from sqlalchemy import Insert, Table, bindparam, case, func, insert, or_, select, update
from sqlalchemy.engine import URL, CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from state_engine.catalog import views
from state_engine.catalog.bulk import Bulk
from state_engine.catalog.dirs import JobDirMixin
from state_engine.catalog.engine import make_engine
from state_engine.catalog.file_registry import FileRegistryMixin
from state_engine.catalog.leases import LeaseMixin
from state_engine.catalog.migrate import check_at_head
from state_engine.catalog.models import (
    DEFAULT_MANAGE,
    ENTRIES_BASES,
    JOB_ACTIONS,
    JOB_ORIGINS,
    METADATA_FORMATS,
    RETAINED_STATUSES,
    SNAPSHOT_FORMATS,
    SNAPSHOT_KINDS,
    File,
    Job,
    KeyGroupStat,
    Operator,
    Snapshot,
    SnapshotSize,
    State,
)
from state_engine.catalog.records import (
    JobRecord,
    KeyGroupStatRow,
    OperatorRecord,
    SnapshotRecord,
    StateRecord,
)
from state_engine.catalog.reports import ReportsMixin
from state_engine.catalog.rows import (
    Ref,
    job_record,
    jobs_stmt,
    no_snapshot,
    resolve_job,
    snapshot_record,
    snapshots_stmt,
    state_record,
)
from state_engine.catalog.runs import RunMixin
from state_engine.catalog.store import (
    Store,
    as_json,
    check_choice,
    check_int,
    check_name,
    window,
)
from state_engine.config import Settings
from state_engine.errors import (
    CommitConflict,
    InvalidCatalogInput,
    InvalidSnapshotTransition,
    NoSuchSnapshot,
    StateRegistrationConflict,
)
from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

MAX_MAX_PARALLELISM = UPPER_BOUND_MAX_PARALLELISM


class Catalog(JobDirMixin, RunMixin, FileRegistryMixin, ReportsMixin, LeaseMixin, Store):
    """The SQL catalog. Open it with :meth:`open` (checks the schema is at head)."""

    @classmethod
    def open(
        cls,
        url: str | URL,
        *,
        clock: Callable[[], datetime] | None = None,
        check_version: bool = True,
        **engine_kwargs: Any,
    ) -> Self:
        engine = make_engine(url, **engine_kwargs)
        if check_version:
            try:
                check_at_head(engine)
            except BaseException:
                engine.dispose()
                raise
        return cls(engine, clock=clock)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **kwargs: Any) -> Self:
        return cls.open((settings or Settings.from_env()).catalog_url, **kwargs)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs, operators, states ---

    def register_job(
        self,
        name: str,
        *,
        max_parallelism: int,
        location: str | None = None,
        properties: dict[str, Any] | None = None,
        origin: str = "statekeeper",
        manage: Iterable[str] | None = None,
    ) -> JobRecord:
        """Register a job, or return it if registered with the same max parallelism and origin.

        ``manage``: a new job's management policy (see :meth:`set_job_policy`); None gives its
        origin's default (a Statekeeper job everything, a Flink job nothing). An existing job
        keeps its own.
        """
        check_name(name, "a job name")
        if origin not in JOB_ORIGINS:
            raise InvalidCatalogInput(
                f"job origin must be one of {', '.join(JOB_ORIGINS)}, got {origin!r}"
            )
        policy = DEFAULT_MANAGE[origin] if manage is None else _policy_text(manage)
        check_int(max_parallelism, "max_parallelism", 1, MAX_MAX_PARALLELISM)
        props = as_json(properties or {}, "job properties")
        with self._write() as s:
            job = s.scalars(select(Job).where(Job.name == name)).one_or_none()
            if job is None:
                job = Job(
                    name=name,
                    max_parallelism=max_parallelism,
                    location=location,
                    properties=props,
                    created_at=self.now(),
                    origin=origin,
                    manage=policy,
                )
                s.add(job)
                s.flush()
            elif job.origin != origin:
                raise InvalidCatalogInput(
                    f"job {name!r} holds {job.origin} snapshots, not {origin} ones; give the "
                    f"{origin} job another name"
                )
            elif job.max_parallelism != max_parallelism:
                raise InvalidCatalogInput(
                    f"job {name!r} has max parallelism {job.max_parallelism}, not "
                    f"{max_parallelism}; it is fixed for a job's life: rescale it offline, then "
                    "record the new value with set_job_max_parallelism"
                )
            return job_record(job)

    def set_job_max_parallelism(self, job: str | int, max_parallelism: int) -> JobRecord:
        """Record a job's new max parallelism (after an offline rescale wrote a savepoint)."""
        check_int(max_parallelism, "max_parallelism", 1, MAX_MAX_PARALLELISM)
        with self._write() as s:
            row = resolve_job(s, job)
            row.max_parallelism = max_parallelism
            return job_record(row)

    def set_job_policy(self, job: str | int, manage: Iterable[str]) -> JobRecord:
        """Record which deleting actions (of ``JOB_ACTIONS``) Statekeeper may take in the job's
        directories; none: read-only. Returns the job as it is now."""
        policy = _policy_text(manage)
        with self._write() as s:
            row = resolve_job(s, job)
            row.manage = policy
            return job_record(row)

    def get_job(self, job: str | int) -> JobRecord:
        with self._read() as s:
            return job_record(resolve_job(s, job))

    def list_jobs(self, *, limit: int | None = None, offset: int = 0) -> list[JobRecord]:
        """Jobs by name; ``limit`` and ``offset`` cut a page in the database."""
        with self._read() as s:
            return [job_record(j) for j in s.scalars(window(jobs_stmt(), limit, offset))]

    def register_operator(
        self, job: str | int, uid: str, name: str | None = None
    ) -> OperatorRecord:
        check_name(uid, "an operator uid")
        with self._write() as s:
            job_row = resolve_job(s, job)
            op_id = self._operator_ids(s, job_row.id, [uid])[uid]
            if name is not None:
                s.execute(update(Operator).where(Operator.id == op_id).values(name=name))
            row = s.get_one(Operator, op_id)
            return OperatorRecord(row.id, row.job_id, row.uid, row.name)

    def list_operators(self, job: str | int) -> list[OperatorRecord]:
        with self._read() as s:
            job_id = resolve_job(s, job).id
            rows = s.scalars(
                select(Operator).where(Operator.job_id == job_id).order_by(Operator.uid)
            )
            return [OperatorRecord(r.id, r.job_id, r.uid, r.name) for r in rows]

    def register_state(
        self,
        job: str | int,
        operator: str,
        name: str,
        *,
        kind: str,
        serializers: dict[str, Any],
        ttl: dict[str, Any] | None = None,
    ) -> StateRecord:
        """Register a state, or update its serializers and TTL (schema evolution).

        A state's kind never changes: registering it again with another kind is refused.
        """
        check_name(name, "a state name")
        check_name(kind, "a state kind", 32)
        serializers = as_json(serializers, "state serializers")
        ttl = as_json(ttl, "state TTL config")
        now = self.now()
        with self._write() as s:
            job_row = resolve_job(s, job)
            op_id = self._operator_ids(s, job_row.id, [check_name(operator, "an operator uid")])[
                operator
            ]
            row = s.scalars(
                select(State).where(State.operator_id == op_id, State.name == name)
            ).one_or_none()
            if row is None:
                row = State(
                    operator_id=op_id,
                    name=name,
                    kind=kind,
                    serializers=serializers,
                    ttl=ttl,
                    created_at=now,
                    updated_at=now,
                )
                s.add(row)
                s.flush()
            elif row.kind != kind:
                raise StateRegistrationConflict(
                    f"state {name!r} of operator {operator!r} in job {job_row.name!r} is a "
                    f"{row.kind} state, not {kind}; give the new state another name"
                )
            elif row.serializers != serializers or row.ttl != ttl:
                row.serializers, row.ttl, row.updated_at = serializers, ttl, now
            return state_record(row, operator)

    def list_states(self, job: str | int) -> list[StateRecord]:
        with self._read() as s:
            job_id = resolve_job(s, job).id
            rows = s.execute(
                select(State, Operator.uid)
                .join(Operator, Operator.id == State.operator_id)
                .where(Operator.job_id == job_id)
                .order_by(Operator.uid, State.name)
            )
            return [state_record(state, uid) for state, uid in rows]

    # --- snapshots ---

    def begin_snapshot(
        self,
        job: str | int,
        *,
        location: str,
        parallelism: int,
        kind: str = SnapshotKind.CHECKPOINT,
        format: str = SnapshotFormat.CANONICAL,
        checkpoint_id: int | None = None,
        parent_id: int | None = None,
        max_parallelism: int | None = None,
        trigger: str = "periodic",
        writer: str | None = None,
        lease: tuple[str, int] | None = None,
        metadata_format: str = "statekeeper",
    ) -> SnapshotRecord:
        """Record a new PENDING snapshot (its id defaults to the job's next checkpoint id).

        ``writer``: the run that begins it (its writer lease's owner), ``lease``: that lease's
        (name, fencing token), checked in the same transaction (a LeaseError if not held).
        ``metadata_format``: which reader reads its ``_metadata`` ("flink" or "statekeeper").
        """
        kind = check_choice(kind, "snapshot kind", SNAPSHOT_KINDS)
        if metadata_format not in METADATA_FORMATS:
            raise InvalidCatalogInput(
                f"metadata format must be one of {', '.join(METADATA_FORMATS)}, "
                f"got {metadata_format!r}"
            )
        format = check_choice(format, "snapshot format", SNAPSHOT_FORMATS)
        check_name(location, "a snapshot location", 10_000)
        check_name(trigger, "a snapshot trigger", 32)
        if writer is not None:
            check_name(writer, "a snapshot writer", 200)
        with self._write() as s:
            if lease is not None:
                self._check_lease_in(s, *lease)
            job_row = resolve_job(s, job)
            max_p = job_row.max_parallelism if max_parallelism is None else max_parallelism
            check_int(max_p, "max_parallelism", 1, MAX_MAX_PARALLELISM)
            check_int(parallelism, "parallelism", 1, max_p)
            if parent_id is not None:
                parent = s.get(Snapshot, parent_id)
                if parent is None or parent.job_id != job_row.id:
                    raise NoSuchSnapshot(
                        f"parent snapshot {parent_id} is not a snapshot of job {job_row.name!r}; "
                        f"list them with `statectl snapshots {job_row.name}`"
                    )
            last_id = select(func.max(Snapshot.checkpoint_id)).where(Snapshot.job_id == job_row.id)
            if checkpoint_id is None:
                checkpoint_id = (s.scalar(last_id) or 0) + 1
            check_int(checkpoint_id, "checkpoint_id", 0)
            row = Snapshot(
                job_id=job_row.id,
                checkpoint_id=checkpoint_id,
                kind=kind,
                format=format,
                status=SnapshotStatus.PENDING,
                parent_id=parent_id,
                parallelism=parallelism,
                max_parallelism=max_p,
                location=location,
                bytes=0,
                entries=0,
                created_at=self.now(),
                trigger=trigger,
                version=0,
                writer=writer,
                metadata_format=metadata_format,
            )
            try:
                with s.begin_nested():
                    s.add(row)
            except IntegrityError as exc:
                # read only now: a caller that names its id (the committer) needs no max
                raise CommitConflict(
                    f"job {job_row.name!r} already has a snapshot with checkpoint id "
                    f"{checkpoint_id}; use a new id (the next free one is "
                    f"{(s.scalar(last_id) or 0) + 1})"
                ) from exc
            return snapshot_record(row, job_row.name)

    def get_snapshot(self, snapshot_id: int) -> SnapshotRecord:
        with self._read() as s:
            return self._snapshot_record(s, snapshot_id)

    def list_snapshots(
        self,
        job: str | int,
        *,
        status: str | Sequence[str] | None = None,
        kind: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[SnapshotRecord]:
        """The job's snapshots, newest checkpoint id first."""
        with self._read() as s:
            job_row = resolve_job(s, job)
            stmt = window(snapshots_stmt(job_row.id, status, kind), limit, offset)
            return [snapshot_record(r, job_row.name) for r in s.scalars(stmt)]

    def snapshots_under(self, location: str) -> list[SnapshotRecord]:
        """Every snapshot, of any job, whose directory is ``location`` or inside it: the
        attempts of one retried run, a savepoint directory used again, another job's savepoint
        written below a directory (what removing that directory would remove)."""
        loc = location.rstrip("/")
        with self._read() as s:
            rows = s.execute(
                select(Snapshot, Job.name)
                .join(Job, Job.id == Snapshot.job_id)
                .where(
                    or_(
                        Snapshot.location.in_([loc, loc + "/"]),
                        Snapshot.location.startswith(loc + "/", autoescape=True),
                    )
                )
                .order_by(Snapshot.id)
            )
            return [snapshot_record(snap, name) for snap, name in rows]

    def latest_snapshot(self, job: str | int) -> SnapshotRecord | None:
        """The job's COMPLETED snapshot with the highest checkpoint id, if any."""
        with self._read() as s:
            job_row = resolve_job(s, job)
            v = views.latest_snapshots
            row = s.scalars(
                select(Snapshot)
                .join(v, v.c.snapshot_id == Snapshot.id)
                .where(v.c.job_id == job_row.id)
            ).first()
            return None if row is None else snapshot_record(row, job_row.name)

    def record_key_group_stats(self, snapshot_id: int, stats: Iterable[KeyGroupStatRow]) -> int:
        """Record rows and bytes per key group (one bulk insert); returns how many rows."""
        rows = list(stats)
        if not rows:
            return 0
        with self._write() as s:
            snap = self._lock_snapshot(
                s, snapshot_id, RETAINED_STATUSES, "record key-group stats for"
            )
            seen: set[tuple[str, int]] = set()
            for r in rows:
                check_name(r.operator, "a key-group stat's operator uid")
                check_int(r.key_group, "key_group", 0, snap.max_parallelism - 1)
                check_int(r.rows, "rows", 0)
                check_int(r.bytes, "bytes", 0)
                if (r.operator, r.key_group) in seen:
                    raise InvalidCatalogInput(
                        f"key group {r.key_group} of operator {r.operator!r} appears twice; "
                        "send one row per operator and key group"
                    )
                seen.add((r.operator, r.key_group))
            op_ids = self._operator_ids(s, snap.job_id, {r.operator for r in rows})
            recorded = s.scalars(
                select(KeyGroupStat.operator_id).where(
                    KeyGroupStat.snapshot_id == snap.id,
                    KeyGroupStat.operator_id.in_(list(op_ids.values())),
                )
            ).all()
            for uid, op_id in op_ids.items():
                if op_id in recorded:
                    raise InvalidCatalogInput(
                        f"key-group stats of operator {uid!r} in snapshot {snap.id} are already "
                        "recorded; they are written once per snapshot"
                    )
            _insert_rows(
                s,
                KeyGroupStat.__tablename__,
                ("snapshot_id", "operator_id", "key_group", "rows", "bytes"),
                [(snap.id, op_ids[r.operator], r.key_group, r.rows, r.bytes) for r in rows],
            )
            return len(rows)

    def complete_snapshot(
        self,
        snapshot_id: int,
        expected_version: int,
        *,
        bytes: int | None = None,
        entries: int | None = None,
        standalone: bool = False,
        lease: tuple[str, int] | None = None,
        completed_at: datetime | None = None,
        entries_basis: str | None = None,
    ) -> SnapshotRecord:
        """PENDING -> COMPLETED by compare-and-swap on the version the caller read.

        ``completed_at``: when another system completed a snapshot this catalog imports (a
        Flink ``_metadata``'s modification time); the import's own time is kept as
        ``imported_at`` and no duration is recorded. ``entries_basis``: how ``entries`` was
        got ("counted", "estimated", "not-counted"; None: by the snapshot's format).

        ``bytes`` defaults to the size of the attached files, ``entries`` to the recorded rows.
        ``standalone``: it turned out to reuse no file of an earlier snapshot (an incremental
        checkpoint that wrote a new base), so it has no parent, whatever ``begin_snapshot`` was
        given. CommitConflict if another writer changed the snapshot since;
        InvalidSnapshotTransition if it is not PENDING. ``lease``: (name, fencing token) of a
        lease the writer must still hold, checked in the same transaction (a LeaseError if not).
        """
        check_int(expected_version, "expected_version", 0)
        with self._write() as s:
            if lease is not None:
                self._check_lease_in(s, *lease)
            if bytes is None:
                file_ids = (
                    select(Ref.c.file_id).where(Ref.c.snapshot_id == snapshot_id).scalar_subquery()
                )
                bytes = s.scalar(
                    select(func.coalesce(func.sum(File.size), 0)).where(File.id.in_(file_ids))
                )
            if entries is None:
                entries = s.scalar(
                    select(func.coalesce(func.sum(KeyGroupStat.rows), 0)).where(
                        KeyGroupStat.snapshot_id == snapshot_id
                    )
                )
            now = self.now()
            # the row, locked (PostgreSQL) as the transition's own read would lock it: its
            # creation time for the duration, and the record returned (no read-back after)
            row, job = self._locked_snapshot_and_job(s, snapshot_id)
            created = row.created_at
            duration = None if created is None else int((now - created).total_seconds() * 1000)
            values: dict[str, Any] = {
                "completed_at": now,
                "duration_ms": max(duration or 0, 0),
                "bytes": check_int(int(bytes or 0), "bytes", 0),
                "entries": check_int(int(entries or 0), "entries", 0),
            }
            if completed_at is not None:
                if completed_at.tzinfo is None:
                    raise InvalidCatalogInput("completed_at must be an aware datetime (UTC)")
                values.update(
                    completed_at=completed_at.astimezone(UTC), imported_at=now, duration_ms=None
                )
            if entries_basis is not None:
                if entries_basis not in ENTRIES_BASES:
                    raise InvalidCatalogInput(
                        f"entries basis must be one of {', '.join(ENTRIES_BASES)}, "
                        f"got {entries_basis!r}"
                    )
                values["entries_basis"] = entries_basis
            if standalone:
                values["parent_id"] = None
            self._transition(
                s,
                snapshot_id,
                (SnapshotStatus.PENDING,),
                SnapshotStatus.COMPLETED,
                expected_version,
                current=(row.status, row.version),
                **values,
            )
            self._record_sizes(s, snapshot_id)
            done = snapshot_record(row, job)
            return replace(done, status=SnapshotStatus.COMPLETED, version=row.version + 1, **values)

    def fail_snapshot(
        self, snapshot_id: int, *, error: str | None = None, expected_version: int | None = None
    ) -> SnapshotRecord:
        """PENDING -> FAILED: its files are no longer pinned by it."""
        with self._write() as s:
            self._transition(
                s,
                snapshot_id,
                (SnapshotStatus.PENDING,),
                SnapshotStatus.FAILED,
                expected_version,
                error=error,
            )
            return self._snapshot_record(s, snapshot_id)

    def subsume_snapshot(
        self, snapshot_id: int, *, expected_version: int | None = None
    ) -> SnapshotRecord:
        """COMPLETED checkpoint -> SUBSUMED (a newer one replaces it); savepoints are refused."""
        with self._write() as s:
            row, job = self._locked_snapshot_and_job(s, snapshot_id)
            if row.kind == SnapshotKind.SAVEPOINT:
                raise InvalidSnapshotTransition(
                    f"snapshot {snapshot_id} is a savepoint, owned by the user and never subsumed; "
                    "discard it explicitly if it is no longer needed"
                )
            self._transition(
                s,
                snapshot_id,
                (SnapshotStatus.COMPLETED,),
                SnapshotStatus.SUBSUMED,
                expected_version,
                current=(row.status, row.version),
            )
            # the record as the transition left it (no read-back)
            return replace(
                snapshot_record(row, job), status=SnapshotStatus.SUBSUMED, version=row.version + 1
            )

    def discard_snapshot(
        self,
        snapshot_id: int,
        *,
        expected_version: int | None = None,
        error: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> SnapshotRecord:
        """COMPLETED, SUBSUMED or FAILED -> DISCARDED: the snapshot can no longer be restored.

        ``error`` records why when it was not discarded on purpose (its directory vanished);
        ``details``, facts its origin keeps about the discarded snapshot (they replace any
        earlier ones).
        """
        extra: dict[str, Any] = {} if error is None else {"error": error}
        if details is not None:
            extra["details"] = as_json(details, f"details of snapshot {snapshot_id}")
        with self._write() as s:
            self._transition(
                s,
                snapshot_id,
                (SnapshotStatus.COMPLETED, SnapshotStatus.SUBSUMED, SnapshotStatus.FAILED),
                SnapshotStatus.DISCARDED,
                expected_version,
                **extra,
            )
            return self._snapshot_record(s, snapshot_id)

    # --- internals ---

    def _locked_snapshot_and_job(self, s: Session, snapshot_id: int) -> tuple[Snapshot, str]:
        """The snapshot's row, read afresh and locked (FOR UPDATE on PostgreSQL), and its job's
        name."""
        found = s.execute(
            select(Snapshot, Job.name)
            .join(Job, Job.id == Snapshot.job_id)
            .where(Snapshot.id == snapshot_id)
            .with_for_update(of=Snapshot)
            .execution_options(populate_existing=True)
        ).one_or_none()
        if found is None:
            raise no_snapshot(snapshot_id)
        return found[0], found[1]

    def _transition(
        self,
        s: Session,
        snapshot_id: int,
        allowed: tuple[str, ...],
        target: str,
        expected_version: int | None,
        current: tuple[str, int] | None = None,
        **values: Any,
    ) -> None:
        """Move the snapshot from one of ``allowed`` to ``target`` by compare-and-swap;
        ``current``: its (status, version) as the caller just read and locked it."""
        if current is None:
            # FOR UPDATE (PostgreSQL): a concurrent writer waits here, then sees the winner's row.
            current = s.execute(
                select(Snapshot.status, Snapshot.version)
                .where(Snapshot.id == snapshot_id)
                .with_for_update()
            ).one_or_none()
        if current is None:
            raise no_snapshot(snapshot_id)
        status, version = current
        if expected_version is not None and version != expected_version:
            raise CommitConflict(
                f"snapshot {snapshot_id} changed under you: expected version {expected_version}, "
                f"found version {version} ({status}); another writer committed first: reload "
                "the snapshot and decide again"
            )
        if status not in allowed:
            raise InvalidSnapshotTransition(
                f"snapshot {snapshot_id} is {status}; only a {' or '.join(allowed)} snapshot can "
                f"become {target}"
            )
        # an UPDATE's result is a CursorResult (Session.execute is typed with the base Result)
        changed = cast(
            "CursorResult[Any]",
            s.execute(
                update(Snapshot)
                .where(
                    Snapshot.id == snapshot_id,
                    Snapshot.status == status,
                    Snapshot.version == version,
                )
                .values(status=target, version=Snapshot.version + 1, **values)
                .execution_options(synchronize_session=False)
            ),
        ).rowcount
        if changed != 1:
            raise CommitConflict(
                f"snapshot {snapshot_id} changed while being moved to {target}; reload it and retry"
            )
        if status in RETAINED_STATUSES and target not in RETAINED_STATUSES:
            # Only retained snapshots count as live references; this one just stopped being one.
            used = select(Ref.c.file_id).where(Ref.c.snapshot_id == snapshot_id).scalar_subquery()
            s.execute(
                update(File)
                .where(File.id.in_(used))
                .values(live_refs=File.live_refs - 1)
                .execution_options(synchronize_session=False)
            )

    def _record_sizes(self, s: Session, snapshot_id: int) -> None:
        # Core on the session's connection (to the ORM a parameter dict means a bulk insert)
        s.connection().execute(_RECORD_SIZES, {"snapshot_id": snapshot_id})


def _policy_text(manage: Iterable[str]) -> str:
    """A policy as its column holds it: known actions, each once, in JOB_ACTIONS order."""
    if isinstance(manage, str):
        raise InvalidCatalogInput(f"a management policy is a list of actions, got {manage!r}")
    given = list(manage)
    unknown = [a for a in given if a not in JOB_ACTIONS]
    if unknown:
        raise InvalidCatalogInput(
            f"unknown management action {unknown[0]!r}; the actions are {', '.join(JOB_ACTIONS)}"
        )
    return ",".join(a for a in JOB_ACTIONS if a in given)


def _record_sizes_stmt() -> Insert:
    """Per operator of a snapshot: its distinct files, their bytes and shared bytes, into
    sk_snapshot_sizes. Built once (``snapshot_id`` bound per call): building this statement
    cost more than running it, on every checkpoint's completion."""
    sid = bindparam("snapshot_id", type_=Ref.c.snapshot_id.type)
    pairs = (
        select(Ref.c.operator_id, Ref.c.file_id)
        .where(Ref.c.snapshot_id == sid)
        .distinct()
        .subquery()
    )
    totals = (
        select(
            sid,
            pairs.c.operator_id,
            func.count(),
            func.coalesce(func.sum(File.size), 0),
            func.coalesce(func.sum(case((File.shared, File.size), else_=0)), 0),
        )
        .select_from(pairs)
        .join(File, File.id == pairs.c.file_id)
        .group_by(pairs.c.operator_id)
    )
    return insert(cast("Table", SnapshotSize.__table__)).from_select(
        ["snapshot_id", "operator_id", "files", "bytes", "shared_bytes"], totals
    )


_RECORD_SIZES = _record_sizes_stmt()


def _insert_rows(
    s: Session, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> None:
    """Insert plain values (already validated and JSON-encoded) through the driver (see
    :meth:`Bulk.insert_many`): SQLAlchemy's per-row parameter processing would cost more than
    the database's own work here."""
    Bulk(s.connection()).insert_many(table, columns, rows)
