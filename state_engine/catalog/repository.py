"""The catalog's repository API: jobs, operators, states, snapshots and their files.

A snapshot is begun PENDING, gets its files and key-group statistics attached, and is completed by
compare-and-swap on its ``version``. Files follow Flink's SharedStateRegistry: each records the
snapshot that created it and the last one that used it, and a file is releasable only when no
retained (PENDING or COMPLETED) snapshot references it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import repeat
from typing import Any, Self, cast

from sqlalchemy import (
    Insert,
    Select,
    Table,
    bindparam,
    case,
    delete,
    func,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.engine import URL, CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from state_engine.catalog import views
from state_engine.catalog.bulk import Bulk
from state_engine.catalog.dirs import JobDirMixin
from state_engine.catalog.engine import make_engine
from state_engine.catalog.leases import LeaseMixin
from state_engine.catalog.migrate import check_at_head
from state_engine.catalog.models import (
    JOB_ORIGINS,
    RETAINED_STATUSES,
    SNAPSHOT_FORMATS,
    SNAPSHOT_KINDS,
    SNAPSHOT_STATUSES,
    File,
    Job,
    KeyGroupStat,
    Operator,
    Snapshot,
    SnapshotFileGroup,
    SnapshotSize,
    State,
)
from state_engine.catalog.readonly import run_readonly
from state_engine.catalog.records import (
    FileGroup,
    FileRecord,
    FileRef,
    FilesSummary,
    JobRecord,
    KeyGroupStatRow,
    OperatorRecord,
    Page,
    QueryResult,
    SizePoint,
    SkewRecord,
    SnapshotFileRecord,
    SnapshotRecord,
    StateRecord,
)
from state_engine.catalog.runs import RunMixin
from state_engine.catalog.store import (
    Store,
    as_json,
    check_choice,
    check_int,
    check_name,
    chunks,
    count_rows,
    window,
)
from state_engine.config import Settings
from state_engine.errors import (
    CommitConflict,
    FileAlreadyRegistered,
    InvalidCatalogInput,
    InvalidSnapshotTransition,
    NoSuchJob,
    NoSuchSnapshot,
    ReusedFileMissing,
    StateRegistrationConflict,
)
from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

MAX_MAX_PARALLELISM = UPPER_BOUND_MAX_PARALLELISM
#: a row per reference of a snapshot to a file (the view over sk_snapshot_file_groups)
Ref = views.references
REFERENCES = Ref.name


class Catalog(JobDirMixin, RunMixin, LeaseMixin, Store):
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
    ) -> JobRecord:
        """Register a job, or return it if registered with the same max parallelism and origin."""
        check_name(name, "a job name")
        if origin not in JOB_ORIGINS:
            raise InvalidCatalogInput(
                f"job origin must be one of {', '.join(JOB_ORIGINS)}, got {origin!r}"
            )
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
            return _job(job)

    def set_job_max_parallelism(self, job: str | int, max_parallelism: int) -> JobRecord:
        """Record a job's new max parallelism (after an offline rescale wrote a savepoint)."""
        check_int(max_parallelism, "max_parallelism", 1, MAX_MAX_PARALLELISM)
        with self._write() as s:
            row = _resolve_job(s, job)
            row.max_parallelism = max_parallelism
            return _job(row)

    def get_job(self, job: str | int) -> JobRecord:
        with self._read() as s:
            return _job(_resolve_job(s, job))

    def list_jobs(self, *, limit: int | None = None, offset: int = 0) -> list[JobRecord]:
        """Jobs by name; ``limit`` and ``offset`` cut a page in the database."""
        with self._read() as s:
            return [_job(j) for j in s.scalars(window(_jobs_stmt(), limit, offset))]

    def jobs_page(self, *, limit: int | None = None, offset: int = 0) -> Page[JobRecord]:
        """A page of :meth:`list_jobs` and how many jobs there are in all."""
        with self._read() as s:
            stmt = _jobs_stmt()
            items = [_job(j) for j in s.scalars(window(stmt, limit, offset))]
            return Page(items, count_rows(s, stmt), offset, limit)

    def register_operator(
        self, job: str | int, uid: str, name: str | None = None
    ) -> OperatorRecord:
        check_name(uid, "an operator uid")
        with self._write() as s:
            job_row = _resolve_job(s, job)
            op_id = self._operator_ids(s, job_row.id, [uid])[uid]
            if name is not None:
                s.execute(update(Operator).where(Operator.id == op_id).values(name=name))
            row = s.get_one(Operator, op_id)
            return OperatorRecord(row.id, row.job_id, row.uid, row.name)

    def list_operators(self, job: str | int) -> list[OperatorRecord]:
        with self._read() as s:
            job_id = _resolve_job(s, job).id
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
            job_row = _resolve_job(s, job)
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
            return _state(row, operator)

    def list_states(self, job: str | int) -> list[StateRecord]:
        with self._read() as s:
            job_id = _resolve_job(s, job).id
            rows = s.execute(
                select(State, Operator.uid)
                .join(Operator, Operator.id == State.operator_id)
                .where(Operator.job_id == job_id)
                .order_by(Operator.uid, State.name)
            )
            return [_state(state, uid) for state, uid in rows]

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
    ) -> SnapshotRecord:
        """Record a new PENDING snapshot (its id defaults to the job's next checkpoint id).

        ``writer``: the run that begins it (its writer lease's owner), ``lease``: that lease's
        (name, fencing token), checked in the same transaction (a LeaseError if not held).
        """
        kind = check_choice(kind, "snapshot kind", SNAPSHOT_KINDS)
        format = check_choice(format, "snapshot format", SNAPSHOT_FORMATS)
        check_name(location, "a snapshot location", 10_000)
        check_name(trigger, "a snapshot trigger", 32)
        if writer is not None:
            check_name(writer, "a snapshot writer", 200)
        with self._write() as s:
            if lease is not None:
                self._check_lease_in(s, *lease)
            job_row = _resolve_job(s, job)
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
            return _snapshot(row, job_row.name)

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
            job_row = _resolve_job(s, job)
            stmt = window(_snapshots_stmt(job_row.id, status, kind), limit, offset)
            return [_snapshot(r, job_row.name) for r in s.scalars(stmt)]

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
            return [_snapshot(snap, name) for snap, name in rows]

    def snapshots_page(
        self,
        job: str | int,
        *,
        status: str | Sequence[str] | None = None,
        kind: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> Page[SnapshotRecord]:
        """A page of :meth:`list_snapshots` and how many snapshots match in all."""
        with self._read() as s:
            job_row = _resolve_job(s, job)
            stmt = _snapshots_stmt(job_row.id, status, kind)
            items = [_snapshot(r, job_row.name) for r in s.scalars(window(stmt, limit, offset))]
            return Page(items, count_rows(s, stmt), offset, limit)

    def latest_snapshot(self, job: str | int) -> SnapshotRecord | None:
        """The job's COMPLETED snapshot with the highest checkpoint id, if any."""
        with self._read() as s:
            job_row = _resolve_job(s, job)
            v = views.latest_snapshots
            row = s.scalars(
                select(Snapshot)
                .join(v, v.c.snapshot_id == Snapshot.id)
                .where(v.c.job_id == job_row.id)
            ).first()
            return None if row is None else _snapshot(row, job_row.name)

    def latest_snapshots(self) -> list[SnapshotRecord]:
        """The latest COMPLETED snapshot of every job that has one."""
        with self._read() as s:
            v = views.latest_snapshots
            rows = s.execute(
                select(Snapshot, v.c.job).join(v, v.c.snapshot_id == Snapshot.id).order_by(v.c.job)
            )
            return [_snapshot(snap, job) for snap, job in rows]

    def attach_files(self, snapshot_id: int, files: Iterable[FileRef | FileGroup]) -> int:
        """Attach files to a PENDING snapshot in a few bulk statements; returns how many
        references it attached (a FileGroup counts its files).

        A new path is registered as created by this snapshot. A shared path already known (to this
        job) gets this snapshot as its last user. An exclusive path already registered by another
        snapshot is refused with FileAlreadyRegistered, a ``reused`` path the catalog no longer
        knows (deleted since the snapshot it came from) with ReusedFileMissing; nothing of a
        refused call is kept. A ``foreign`` path another job holds is referenced as that job's
        file (its live references count this snapshot too). A path given twice is one file (the
        first gives its flags; another size, checksum or shared flag is refused).
        """
        return self.attach_files_many([(snapshot_id, files)])

    def attach_files_many(
        self, attachments: Iterable[tuple[int, Iterable[FileRef | FileGroup]]]
    ) -> int:
        """:meth:`attach_files` for several PENDING snapshots of one job in one transaction, with
        the outcome of one call per snapshot in the order given (a file the first creates, the
        next ones reuse), but each path looked up once and each file row written once: an import
        of a job's retained checkpoints, thousands of files each and most of them in every one,
        costs a statement per table instead of several per snapshot. Returns how many references
        it attached; nothing of a refused call is kept."""
        items = [(sid, _as_groups(files)) for sid, files in attachments]
        items = [(sid, groups) for sid, groups in items if groups]
        if not items:
            return 0
        ids = [sid for sid, _ in items]
        if len(set(ids)) != len(ids):
            raise InvalidCatalogInput(
                "a snapshot appears twice among the attachments; give each snapshot's files once"
            )
        with self._write() as s:
            snaps = [
                self._lock_snapshot(s, sid, (SnapshotStatus.PENDING,), "attach files to")
                for sid in ids
            ]
            # Plain ints: an ORM attribute read per row would cost more than the row's insert.
            job_id = snaps[0].job_id
            other = next((x for x in snaps if x.job_id != job_id), None)
            if other is not None:
                raise InvalidCatalogInput(
                    f"snapshots {ids[0]} and {other.id} belong to different jobs; attach files "
                    "to one job's snapshots per call"
                )
            firsts = [
                _check_file_groups(groups, snap.parallelism, snap.max_parallelism)
                for snap, (_, groups) in zip(snaps, items, strict=True)
            ]
            op_ids = self._operator_ids(
                s, job_id, {g.operator for _, groups in items for g in groups if g.operator}
            )
            bulk = Bulk(s.connection())
            every: dict[str, None] = {}
            for first in firsts:
                every.update(dict.fromkeys(first))
            files = _known_files(bulk, list(every))
            already = self._referenced(bulk, ids, [f.id for f in files.values()])
            known = set(files)
            # new files: (group, position, snapshot) of their creator, in the order first met;
            # one a later snapshot of the call references is followed in ``files`` from then on
            created: dict[str, tuple[FileGroup, int, int]] = {}
            for sid, (_, groups), first in zip(ids, items, firsts, strict=True):
                _check_reused_known(groups, known, sid)
                for path, (g, i) in first.items():
                    f = files.get(path)
                    if f is None:
                        c = created.get(path)
                        if c is None:  # new: this snapshot creates it
                            created[path] = (g, i, sid)
                            continue
                        cg, ci, csid = c
                        f = files[path] = _FileState(
                            0, job_id, cg.sizes[ci], _checksum(cg, ci), csid, cg.is_shared(ci), csid
                        )
                    _check_reuse(
                        g, i, sid, job_id, f.id, f.job_id, f.size, f.checksum, f.created_by
                    )
                    if g.grows and g.sizes[i] > f.size:  # what the snapshots need of it, at most
                        f.size, f.grew = g.sizes[i], True
                    if f.created_by != sid and (sid, f.id) not in already:
                        # one more live reference, from a snapshot that did not have one yet
                        f.shared, f.last_used, f.refs = True, sid, f.refs + 1
                known.update(first)
            path_ids = self._write_file_states(bulk, files, created, job_id)
            bulk.insert_many(
                SnapshotFileGroup.__tablename__,
                (
                    "snapshot_id",
                    "operator_id",
                    "subtask",
                    "key_group_start",
                    "key_group_end",
                    "foreign_files",
                    "file_ids",
                    "details",
                    "common_details",
                ),
                [
                    (sid, *row)
                    for sid, groups in items
                    for row in _group_rows(groups, path_ids, op_ids)
                ],
            )
            return sum(len(g.paths) for _, groups in items for g in groups)

    def _referenced(
        self, bulk: Bulk, snapshot_ids: list[int], file_ids: list[int]
    ) -> set[tuple[int, int]]:
        """(snapshot id, file id) of the references ``snapshot_ids`` already have to ``file_ids``
        (an earlier attach call of the same snapshot)."""
        if not file_ids:
            return set()
        where_s, sids = bulk.in_list("snapshot_id", snapshot_ids)
        where_f, fids = bulk.in_list("file_id", file_ids)
        rows = bulk.select(
            f"SELECT snapshot_id, file_id FROM {REFERENCES} WHERE {where_s} AND {where_f}",
            (sids, fids),
        )
        return {(sid, fid) for sid, fid in rows}

    def _write_file_states(
        self,
        bulk: Bulk,
        files: dict[str, _FileState],
        created: dict[str, tuple[FileGroup, int, int]],
        job_id: int,
    ) -> dict[str, int]:
        """Update the known files a snapshot now references (a statement per last user and
        references added) and insert the ``created`` ones (one bulk insert; ``files`` has the
        state of those a later snapshot of the call references). Returns every file's id."""
        m = bulk.mark
        touched: dict[tuple[int | None, int], list[int]] = {}
        path_ids: dict[str, int] = {}
        for path, f in files.items():
            if f.id == 0:
                continue  # created by this call
            path_ids[path] = f.id
            if f.refs:
                touched.setdefault((f.last_used, f.refs), []).append(f.id)
            if f.grew:
                bulk.execute(f"UPDATE sk_files SET size = {m} WHERE id = {m}", (f.size, f.id))
        for (last_used, refs), fids in touched.items():
            where, ids = bulk.in_list("id", fids)
            bulk.execute(
                f"UPDATE sk_files SET shared = {m}, last_used_snapshot_id = {m}, "
                f"live_refs = live_refs + {m} WHERE {where}",
                (True, last_used, refs, ids),
            )
        new_ids = bulk.allocate_ids(File.__tablename__, len(created))
        stamp = bulk.bind(File.__table__.c.created_at, self.now())
        rows: list[tuple[Any, ...]] = []
        for fid, (path, (g, i, sid)) in zip(new_ids, created.items(), strict=True):
            path_ids[path] = fid
            state = files.get(path)
            if state is None:  # one snapshot's alone
                size, checksum, shared = g.sizes[i], _checksum(g, i), g.is_shared(i)
                last_used, refs = sid, 1
            else:
                size, checksum, shared = state.size, state.checksum, state.shared
                last_used, refs = state.last_used, state.refs + 1
            rows.append((fid, job_id, path, size, checksum, shared, sid, last_used, refs, stamp))
        bulk.insert_many(
            File.__tablename__,
            (
                "id",
                "job_id",
                "path",
                "size",
                "checksum",
                "shared",
                "created_by_snapshot_id",
                "last_used_snapshot_id",
                "live_refs",
                "created_at",
            ),
            rows,
        )
        return path_ids

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
    ) -> SnapshotRecord:
        """PENDING -> COMPLETED by compare-and-swap on the version the caller read.

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
            done = _snapshot(row, job)
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
                _snapshot(row, job), status=SnapshotStatus.SUBSUMED, version=row.version + 1
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

    # --- files ---

    def snapshot_files(
        self, snapshot_id: int, *, limit: int | None = None, offset: int = 0
    ) -> list[SnapshotFileRecord]:
        """The files a snapshot references, by operator, subtask and path."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            rows = s.execute(window(_snapshot_files_stmt(snapshot_id), limit, offset))
            return _with_details(s, rows)

    def snapshot_files_page(
        self, snapshot_id: int, *, limit: int | None = None, offset: int = 0
    ) -> Page[SnapshotFileRecord]:
        """A page of :meth:`snapshot_files` and how many references there are in all."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            stmt = _snapshot_files_stmt(snapshot_id)
            items = _with_details(s, s.execute(window(stmt, limit, offset)))
            total = s.scalar(_count_references(snapshot_id))
            return Page(items, int(total or 0), offset, limit)

    def snapshot_files_summary(self, snapshot_id: int) -> FilesSummary:
        """Counts and bytes of what a snapshot references, computed in the database."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            refs = s.scalar(_count_references(snapshot_id))
            used = select(Ref.c.file_id).where(Ref.c.snapshot_id == snapshot_id).scalar_subquery()
            files, size, shared_files, shared_bytes = s.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(File.size), 0),
                    func.coalesce(func.sum(case((File.shared, 1), else_=0)), 0),
                    func.coalesce(func.sum(case((File.shared, File.size), else_=0)), 0),
                ).where(File.id.in_(used))
            ).one()
            return FilesSummary(
                int(refs or 0), int(files), int(size), int(shared_files), int(shared_bytes)
            )

    def releasable_files(self, job: str | int) -> list[FileRecord]:
        """Files of the job that no retained (PENDING or COMPLETED) snapshot references."""
        with self._read() as s:
            job_id = _resolve_job(s, job).id
            rows = s.scalars(
                select(File).where(File.job_id == job_id, File.live_refs == 0).order_by(File.id)
            )
            return [_file(f) for f in rows]

    def orphan_candidates(
        self, job: str | int | None = None, *, limit: int | None = None
    ) -> list[FileRecord]:
        """Files no live snapshot references, of one job or of all jobs (oldest first)."""
        with self._read() as s:
            stmt = select(File).where(File.live_refs == 0)
            if job is not None:
                stmt = stmt.where(File.job_id == _resolve_job(s, job).id)
            return [_file(f) for f in s.scalars(stmt.order_by(File.id).limit(limit))]

    def live_paths(self, job: str | int) -> set[str]:
        """Paths that a retained snapshot of the job references: never to be deleted."""
        with self._read() as s:
            job_id = _resolve_job(s, job).id
            return set(
                s.scalars(select(File.path).where(File.job_id == job_id, File.live_refs > 0))
            )

    def path_owners(self, paths: Iterable[str], *, other_than: str | None = None) -> dict[str, str]:
        """The job that holds each of ``paths`` the catalog knows (path -> job name); one
        indexed lookup of all of them. ``other_than``: only the paths jobs other than this one
        hold (none are looked up when no other job has a file: two index probes)."""
        wanted = list(set(paths))
        if not wanted:
            return {}
        with self._read() as s:
            bulk = Bulk(s.connection())
            job_id = None
            if other_than is not None:
                job_id = s.scalar(select(Job.id).where(Job.name == other_than))
                if not _files_outside(bulk, job_id):
                    return {}
            where, values = bulk.in_list("f.path", wanted)
            params: tuple[Any, ...] = (values,)
            if job_id is not None:
                where += f" AND f.job_id <> {bulk.mark}"
                params = (values, job_id)
            rows = bulk.select(
                f"SELECT f.path, j.name FROM sk_files f JOIN sk_jobs j ON j.id = f.job_id "
                f"WHERE {where}",
                params,
            )
            return {path: name for path, name in rows}

    def paths_referenced_elsewhere(self, job: str | int) -> set[str]:
        """Paths of ``job``'s files that retained snapshots of other jobs reference (a Flink job
        restored from this one's snapshot in NO_CLAIM or LEGACY mode): never to be deleted."""
        with self._read() as s:
            job_id = _resolve_job(s, job).id
            return set(
                s.scalars(
                    select(File.path)
                    .distinct()
                    .join(Ref, Ref.c.file_id == File.id)
                    .join(Snapshot, Snapshot.id == Ref.c.snapshot_id)
                    .where(
                        # another job's snapshot references a file of this one only as foreign
                        Ref.c.foreign_file,
                        File.job_id == job_id,
                        Snapshot.job_id != job_id,
                        Snapshot.status.in_(RETAINED_STATUSES),
                    )
                )
            )

    def adopt_files(self, job: str | int, paths: Iterable[str]) -> int:
        """Make ``job`` the holder of ``paths`` (files in its own directories that another job,
        imported first, registered as its foreign references); their references and live counts
        stay as they are. Returns how many changed hands."""
        wanted = sorted(set(paths))
        with self._write() as s:
            job_id = _resolve_job(s, job).id
            moved = 0
            for part in chunks(wanted):
                moved += cast(
                    "CursorResult[Any]",
                    s.execute(
                        update(File)
                        .where(File.path.in_(part), File.job_id != job_id)
                        .values(job_id=job_id)
                        .execution_options(synchronize_session=False)
                    ),
                ).rowcount
            return moved

    def known_paths(self, job: str | int) -> set[str]:
        """Every path the catalog knows for the job (live or releasable)."""
        with self._read() as s:
            job_id = _resolve_job(s, job).id
            return set(s.scalars(select(File.path).where(File.job_id == job_id)))

    def forget_files(self, job: str | int, paths: Iterable[str], *, lease: str, token: int) -> int:
        """Remove deleted files from the catalog, under a lease; returns how many were known.

        Refused (nothing removed) if a retained snapshot still references one of them, or if the
        fencing token is stale. Unknown paths are skipped, so a retry is harmless.
        """
        wanted = list(dict.fromkeys(paths))
        with self._write() as s:
            self._check_lease_in(s, lease, token)
            job_row = _resolve_job(s, job)
            rows: list[tuple[int, str, int]] = []
            for part in chunks(wanted):
                # locked (PostgreSQL): a snapshot attaching one of them meanwhile either
                # committed its reference first, and is seen here, or waits and finds it gone
                rows.extend(
                    s.execute(
                        select(File.id, File.path, File.live_refs)
                        .where(File.job_id == job_row.id, File.path.in_(part))
                        .with_for_update()
                    ).all()
                )
            live = [path for _, path, refs in rows if refs > 0]
            if live:
                raise InvalidCatalogInput(
                    f"{len(live)} file(s) are still referenced by retained snapshots of job "
                    f"{job_row.name!r} (e.g. {live[0]}); subsume or discard those snapshots first"
                )
            ids = [fid for fid, _, _ in rows]
            self._drop_references(s, job_row.id, ids)
            for id_part in chunks(ids):
                s.execute(delete(File).where(File.id.in_(id_part)))
            return len(ids)

    def _drop_references(self, s: Session, job_id: int, file_ids: list[int]) -> None:
        """Take ``file_ids`` (files no retained snapshot references) out of the groups of the
        dead snapshots that referenced them: this job's, and other jobs' foreign references.
        A group left empty goes. Afterwards no group names a file that is no longer there."""
        if not file_ids:
            return
        bulk = Bulk(s.connection())
        where, ids = bulk.in_list("r.file_id", file_ids)
        dead = f"s.status NOT IN ({', '.join(repr(st) for st in RETAINED_STATUSES)})"
        groups = [
            gid
            for (gid,) in bulk.select(
                f"SELECT r.group_id FROM {REFERENCES} r JOIN sk_snapshots s "
                f"ON s.id = r.snapshot_id WHERE s.job_id = {bulk.mark} AND {dead} AND {where} "
                f"UNION SELECT r.group_id FROM {REFERENCES} r JOIN sk_snapshots s "
                f"ON s.id = r.snapshot_id WHERE r.foreign_file AND {dead} AND {where}",
                (job_id, ids, ids),
            )
        ]
        gone = set(file_ids)
        for part in chunks(groups):
            rows = s.execute(
                select(SnapshotFileGroup.id, SnapshotFileGroup.file_ids, SnapshotFileGroup.details)
                .where(SnapshotFileGroup.id.in_(part))
                .with_for_update()
            ).all()
            for gid, group_ids, details in rows:
                keep = [i for i, fid in enumerate(group_ids) if fid not in gone]
                if not keep:
                    s.execute(delete(SnapshotFileGroup).where(SnapshotFileGroup.id == gid))
                    continue
                notes = None if details is None else [details[i] for i in keep]
                s.execute(
                    update(SnapshotFileGroup)
                    .where(SnapshotFileGroup.id == gid)
                    .values(
                        file_ids=[group_ids[i] for i in keep],
                        details=notes if notes and any(n is not None for n in notes) else null(),
                    )
                )

    # --- questions ---

    def state_size_history(
        self, job: str | int, *, operator: str | None = None, limit: int | None = None
    ) -> list[SizePoint]:
        """Size per operator of each completed snapshot of the job, oldest first.

        ``limit`` keeps the newest ``limit`` snapshots (all their operators); to page through
        the points instead, use :meth:`size_history_page`.
        """
        with self._read() as s:
            stmt = _size_history_stmt(_resolve_job(s, job).id, operator, limit)
            return [SizePoint(*row) for row in s.execute(stmt)]

    def size_history_page(
        self,
        job: str | int,
        *,
        operator: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> Page[SizePoint]:
        """A page of :meth:`state_size_history`'s points and how many there are in all."""
        with self._read() as s:
            stmt = _size_history_stmt(_resolve_job(s, job).id, operator, None)
            items = [SizePoint(*row) for row in s.execute(window(stmt, limit, offset))]
            return Page(items, count_rows(s, stmt), offset, limit)

    def key_group_skew(self, snapshot_id: int) -> list[SkewRecord]:
        v = views.key_group_skew
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            rows = s.execute(
                select(
                    v.c.snapshot_id,
                    v.c.operator,
                    v.c.key_groups,
                    v.c.recorded_key_groups,
                    v.c.total_rows,
                    v.c.max_rows,
                    v.c.mean_rows,
                    v.c.skew,
                )
                .where(v.c.snapshot_id == snapshot_id)
                .order_by(v.c.operator)
            )
            return [
                SkewRecord(sid, op, int(kg), int(rec), int(tot), int(mx), float(mean), skew)
                for sid, op, kg, rec, tot, mx, mean, skew in rows
            ]

    def key_group_stats(
        self, snapshot_id: int, operator: str | None = None
    ) -> list[KeyGroupStatRow]:
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            stmt = (
                select(Operator.uid, KeyGroupStat.key_group, KeyGroupStat.rows, KeyGroupStat.bytes)
                .join(Operator, Operator.id == KeyGroupStat.operator_id)
                .where(KeyGroupStat.snapshot_id == snapshot_id)
            )
            if operator is not None:
                stmt = stmt.where(Operator.uid == operator)
            rows = s.execute(stmt.order_by(Operator.uid, KeyGroupStat.key_group))
            return [KeyGroupStatRow(*row) for row in rows]

    def query(
        self,
        sql: str,
        *,
        max_rows: int | None = None,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> QueryResult:
        """Run one read-only SELECT / WITH / EXPLAIN; a write is refused (ReadOnlyViolation).
        Bounded by ``timeout_s`` and cut at ``max_rows`` / ``max_bytes`` (see readonly.py)."""
        return run_readonly(
            self.engine, sql, max_rows=max_rows, timeout_s=timeout_s, max_bytes=max_bytes
        )

    # --- internals ---

    def _snapshot_record(self, s: Session, snapshot_id: int) -> SnapshotRecord:
        row = s.execute(
            select(Snapshot, Job.name)
            .join(Job, Job.id == Snapshot.job_id)
            .where(Snapshot.id == snapshot_id)
            .execution_options(populate_existing=True)
        ).one_or_none()
        if row is None:
            raise _no_snapshot(snapshot_id)
        return _snapshot(row[0], row[1])

    def _lock_snapshot(
        self, s: Session, snapshot_id: int, allowed: tuple[str, ...], action: str
    ) -> Snapshot:
        # The row lock (PostgreSQL) keeps a concurrent completion out until this write commits.
        snap = s.scalars(
            select(Snapshot).where(Snapshot.id == snapshot_id).with_for_update()
        ).one_or_none()
        if snap is None:
            raise _no_snapshot(snapshot_id)
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
            raise _no_snapshot(snapshot_id)
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
            raise _no_snapshot(snapshot_id)
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


def _jobs_stmt() -> Select[Job]:
    return select(Job).order_by(Job.name)


def _snapshots_stmt(
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


def _snapshot_files_stmt(snapshot_id: int) -> Select[*tuple[Any, ...]]:
    # The tables rather than sk_v_snapshot_files: the reference's group and position end the
    # ORDER BY, so pages cut by offset never overlap or skip (one path may be read by several
    # subtasks). The last two columns find each reference's details (see _with_details).
    return (
        select(
            Ref.c.snapshot_id,
            File.id,
            File.path,
            File.size,
            File.checksum,
            File.shared,
            Operator.uid,
            Ref.c.subtask,
            Ref.c.key_group_start,
            Ref.c.key_group_end,
            File.created_by_snapshot_id,
            File.last_used_snapshot_id,
            Ref.c.group_id,
            Ref.c.position,
        )
        .join(File, File.id == Ref.c.file_id)
        .outerjoin(Operator, Operator.id == Ref.c.operator_id)
        .where(Ref.c.snapshot_id == snapshot_id)
        .order_by(Operator.uid, Ref.c.subtask, File.path, Ref.c.group_id, Ref.c.position)
    )


def _with_details(s: Session, rows: Iterable[Any]) -> list[SnapshotFileRecord]:
    """Records of :func:`_snapshot_files_stmt` rows, each with its reference's details (read
    from the rows' groups: one query)."""
    listed: list[tuple[Any, ...]] = [tuple(row) for row in rows]
    groups = {row[-2] for row in listed}
    details: dict[int, tuple[list[Any] | None, dict[str, Any] | None]] = {}
    if groups:
        stmt = select(
            SnapshotFileGroup.id, SnapshotFileGroup.details, SnapshotFileGroup.common_details
        ).where(SnapshotFileGroup.id.in_(groups))
        details = {gid: (notes, common) for gid, notes, common in s.execute(stmt)}
    out = []
    for (sid, fid, path, size, checksum, shared, operator, subtask, start, end, created, used,
         group, position) in listed:  # fmt: skip
        notes, common = details.get(group, (None, None))
        note = notes[position] if notes else None
        if common:
            note = {**common, **(note or {})}
        record = SnapshotFileRecord(
            sid, fid, path, size, checksum, shared, operator, subtask, start, end, created, used,
            note,
        )  # fmt: skip
        out.append(record)
    return out


def _count_references(snapshot_id: int) -> Select[int]:
    """How many references the snapshot has to files the catalog knows."""
    return (
        select(func.count())
        .select_from(Ref)
        .join(File, File.id == Ref.c.file_id)
        .where(Ref.c.snapshot_id == snapshot_id)
    )


def _size_history_stmt(job_id: int, operator: str | None, newest: int | None) -> Select[Any]:
    v = views.state_size
    stmt = select(
        v.c.snapshot_id,
        v.c.checkpoint_id,
        v.c.kind,
        v.c.status,
        v.c.completed_at,
        v.c.operator,
        v.c.files,
        v.c.bytes,
        v.c.shared_bytes,
    ).where(v.c.job_id == job_id)
    if operator is not None:
        stmt = stmt.where(v.c.operator == operator)
    if newest is not None:
        recent = (
            select(Snapshot.id)
            .where(Snapshot.job_id == job_id, Snapshot.completed_at.is_not(None))
            .order_by(Snapshot.checkpoint_id.desc())
            .limit(newest)
        )
        stmt = stmt.where(v.c.snapshot_id.in_(recent.scalar_subquery()))
    # (checkpoint id, operator) is unique within a job: a total order for paging.
    return stmt.order_by(v.c.checkpoint_id, v.c.operator)


def _resolve_job(s: Session, job: str | int) -> Job:
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


def _known_files(bulk: Bulk, paths: list[str]) -> dict[str, _FileState]:
    """The files the catalog has at ``paths`` (any job's), as the call finds them.

    Locked on PostgreSQL: a concurrent forget_files (expire, orphan cleanup) either waits for
    this transaction and sees the new reference, or deletes the row first and the attach refuses
    the reused path (SQLite's writer lock serialises the two). On SQLite, which orders text as
    Python does (by code point), none is looked up when no known path sorts between the least
    and the greatest of them (a new job's first import, a directory new to the catalog): one
    index probe instead of one per path.
    """
    if not bulk.postgres and not bulk.select(
        "SELECT 1 FROM sk_files WHERE path BETWEEN ? AND ? LIMIT 1", (min(paths), max(paths))
    ):
        return {}
    where, values = bulk.in_list("path", paths)
    return {
        path: _FileState(fid, file_job_id, size, checksum, created_by)
        for path, fid, file_job_id, size, checksum, created_by in bulk.select(
            "SELECT path, id, job_id, size, checksum, created_by_snapshot_id "
            f"FROM sk_files WHERE {where}{' FOR UPDATE' if bulk.postgres else ''}",
            (values,),
        )
    }


def _files_outside(bulk: Bulk, job_id: int | None) -> bool:
    """Whether a job other than ``job_id`` (any job, if None) holds a file: a probe at each end
    of the index on sk_files' job ids."""
    if job_id is None:
        return bool(bulk.select("SELECT 1 FROM sk_files LIMIT 1"))
    m = bulk.mark
    return bool(
        bulk.select(f"SELECT 1 FROM sk_files WHERE job_id < {m} LIMIT 1", (job_id,))
        or bulk.select(f"SELECT 1 FROM sk_files WHERE job_id > {m} LIMIT 1", (job_id,))
    )


def _no_snapshot(snapshot_id: int) -> NoSuchSnapshot:
    return NoSuchSnapshot(
        f"no snapshot {snapshot_id!r} in the catalog; list a job's snapshots with "
        "`statectl snapshots JOB`"
    )


# json.dumps(..., allow_nan=False) builds a new encoder per call; one shared encoder writes the
# same text (attach_files encodes a group's ids and details per group, thousands of values each).
# Without the circular check (half the cost on thousands of small dicts): a value that contains
# itself ends in a RecursionError, which the callers word as as_json does.
_encode = json.JSONEncoder(allow_nan=False, check_circular=False).encode
#: what _encode raises on a value JSON cannot hold
_NOT_JSON = (TypeError, ValueError, RecursionError)


def _as_groups(files: Iterable[FileRef | FileGroup]) -> list[FileGroup]:
    """``files`` as groups: FileGroups as they are, FileRefs gathered into a group per
    operator, subtask, key-group range and flags, in the order first seen (each group's files
    in the order given)."""
    groups: list[FileGroup] = []
    rows: dict[tuple[Any, ...], list[FileRef]] = {}
    for f in files:
        if isinstance(f, FileGroup):
            if f.paths:
                groups.append(f)
            continue
        key = (
            f.operator,
            f.subtask,
            f.key_group_start,
            f.key_group_end,
            f.reused,
            f.foreign,
            f.grows,
        )
        refs = rows.get(key)
        if refs is None:
            refs = rows[key] = []
        refs.append(f)
    for (operator, subtask, start, end, reused, foreign, grows), refs in rows.items():
        checksums = [r.checksum for r in refs]
        details = [r.details for r in refs]
        groups.append(
            FileGroup(
                [r.path for r in refs],
                [r.size for r in refs],
                [r.shared for r in refs],
                None if all(c is None for c in checksums) else checksums,
                None if all(d is None for d in details) else details,
                operator,
                subtask,
                start,
                end,
                reused,
                foreign,
                grows,
            )
        )
    return groups


@dataclass(slots=True)
class _FileState:
    """A file several snapshots of one :meth:`Catalog.attach_files_many` call reference, or one
    the catalog knows, as the call leaves it: ``id`` 0 if the call creates it; ``refs`` the live
    references the call adds (a new file also has its creator's); ``last_used`` the last snapshot
    of the call that references it (read only when ``refs`` is not 0)."""

    id: int
    job_id: int
    size: int
    checksum: str | None
    created_by: int | None
    shared: bool = False
    last_used: int | None = None
    refs: int = 0
    grew: bool = False


def _checksum(g: FileGroup, i: int) -> str | None:
    return None if g.checksums is None else g.checksums[i]


def _check_file_groups(
    groups: list[FileGroup], parallelism: int, max_parallelism: int
) -> dict[str, tuple[FileGroup, int]]:
    """Check every group; each path -> (group, position) of its first mention.

    The common valid case is checked a column at a time (in C: no Python call per file); the
    check_* helpers run only to word the error for the file that fails."""
    first: dict[str, tuple[FileGroup, int]] = {}
    top = max_parallelism - 1
    for g in groups:
        paths, sizes, n = g.paths, g.sizes, len(g.paths)
        for name, column in (("sizes", sizes), ("checksums", g.checksums), ("details", g.details)):
            if column is not None and len(column) != n:
                raise InvalidCatalogInput(
                    f"a file group has {n} paths but {len(column)} {name}; give one per path"
                )
        if not isinstance(g.shared, bool) and len(g.shared) != n:
            raise InvalidCatalogInput(
                f"a file group has {n} paths but {len(g.shared)} shared flags; give one per path "
                "or one for all"
            )
        if (
            not set(map(type, paths)) <= {str}
            or min(map(len, paths)) == 0
            or max(map(len, paths)) > 10_000
            or any(map(str.isspace, paths))
        ):
            for path in paths:
                check_name(path, "a file path", 10_000)
        if not set(map(type, sizes)) <= {int} or min(sizes) < 0:
            for path, size in zip(paths, sizes, strict=True):
                check_int(size, f"the size of {path}", 0)
        where = paths[0]
        subtask = g.subtask
        if subtask is not None and (type(subtask) is not int or not 0 <= subtask < parallelism):
            check_int(subtask, f"the subtask of {where}", 0, parallelism - 1)
        start, end = g.key_group_start, g.key_group_end
        if start is not None or end is not None:
            if start is None or end is None:
                raise InvalidCatalogInput(
                    f"{where}: give both key_group_start and key_group_end, or neither"
                )
            if type(start) is not int or not 0 <= start <= top:
                check_int(start, f"key_group_start of {where}", 0, top)
            if type(end) is not int or not start <= end <= top:
                check_int(end, f"key_group_end of {where}", start, top)
        if first.keys().isdisjoint(paths) and len(set(paths)) == n:
            # every path new: no call per file
            first.update(zip(paths, zip(repeat(g, n), range(n), strict=True), strict=True))
            continue
        for i, path in enumerate(paths):
            prev = first.get(path)
            if prev is None:
                first[path] = (g, i)
            elif (prev[0].sizes[prev[1]], _checksum(*prev), prev[0].is_shared(prev[1])) != (
                sizes[i],
                _checksum(g, i),
                g.is_shared(i),
            ):
                raise InvalidCatalogInput(
                    f"{path} is listed twice with different size, checksum or shared flag; "
                    "one path is one file"
                )
    return first


def _group_rows(
    groups: list[FileGroup], path_ids: dict[str, int], op_ids: dict[str, int]
) -> list[tuple[Any, ...]]:
    """The groups as sk_snapshot_file_groups rows (without the snapshot id): operator id,
    subtask, key-group start and end, foreign, the JSON of the file ids, of their details (None
    when no file has any) and of the group's common details (None when it has none)."""
    out = []
    for g in groups:
        text = None
        if g.details is not None and g.details.count(None) != len(g.details):
            try:
                text = _encode(list(g.details))
            except _NOT_JSON:
                for path, d in zip(g.paths, g.details, strict=True):  # which one: as_json says
                    as_json(d, f"details of {path}")
                raise
        common = None
        if g.common_details:
            what = f"the common details of the group of {g.paths[0]}"
            if not isinstance(g.common_details, dict):
                raise InvalidCatalogInput(f"{what} must be a dict, not {g.common_details!r}")
            try:
                common = _encode(g.common_details)
            except _NOT_JSON:
                as_json(g.common_details, what)
                raise
        ids = _encode([path_ids[p] for p in g.paths])
        operator = op_ids[g.operator] if g.operator else None
        out.append(
            (operator, g.subtask, g.key_group_start, g.key_group_end, g.foreign, ids, text, common)
        )
    return out


def _check_reused_known(groups: list[FileGroup], known: set[str], snap_id: int) -> None:
    gone = [p for g in groups if g.reused for p in g.paths if p not in known]
    if gone:
        raise ReusedFileMissing(
            f"snapshot {snap_id} reuses {len(gone)} file(s) of earlier snapshots that the "
            f"catalog no longer knows (e.g. {gone[0]}): an expire or cleanup deleted them after "
            "the job last completed a checkpoint; this snapshot fails, and the job's next "
            "checkpoint writes its state in full"
        )


def _check_reuse(
    g: FileGroup,
    i: int,
    snap_id: int,
    snap_job_id: int,
    fid: int,
    job_id: int,
    size: int,
    checksum: str | None,
    created_by: int | None,
) -> None:
    path, ref_size, ref_checksum = g.paths[i], g.sizes[i], _checksum(g, i)
    if job_id != snap_job_id and not g.foreign:
        raise FileAlreadyRegistered(
            f"{path} is already registered to another job (file {fid}); a file belongs to "
            "one job: write this snapshot's files under its own job's directory (a file of "
            "another job is referenced only as foreign)"
        )
    changed = checksum and ref_checksum and checksum != ref_checksum
    if (size != ref_size and not g.grows) or changed:
        raise FileAlreadyRegistered(
            f"{path} is already registered with size {size} and checksum {checksum}, not "
            f"{ref_size} / {ref_checksum}; file names are never reused: write it under a new name"
        )
    if created_by != snap_id and not (g.is_shared(i) or g.foreign):
        raise FileAlreadyRegistered(
            f"{path} is already registered by snapshot {created_by}; a file exclusive to one "
            f"snapshot cannot be attached to snapshot {snap_id}: attach it as shared, or write "
            "a new file under a new name"
        )


def _job(j: Job) -> JobRecord:
    return JobRecord(
        j.id, j.name, j.max_parallelism, j.location, j.properties, j.created_at, j.origin
    )


def _state(r: State, operator: str) -> StateRecord:
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


def _snapshot(r: Snapshot, job: str) -> SnapshotRecord:
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
    )


def _file(f: File) -> FileRecord:
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
