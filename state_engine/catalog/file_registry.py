"""The shared-file registry, after Flink's SharedStateRegistry: which snapshot references which
file, and when a file may go.

Each file records the snapshot that created it and the last one that used it, and counts its
live references (those of PENDING and COMPLETED snapshots): a file is releasable only when that
count is 0. A snapshot's references are stored as groups (a subtask's thousands of SSTs are one
row); see :class:`~state_engine.catalog.records.FileGroup`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, cast

from sqlalchemy import Select, delete, func, null, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from state_engine.catalog.bulk import Bulk
from state_engine.catalog.leases import LeaseMixin
from state_engine.catalog.models import (
    RETAINED_STATUSES,
    File,
    Job,
    Operator,
    Snapshot,
    SnapshotFileGroup,
)
from state_engine.catalog.records import FileGroup, FileRecord, FileRef, SnapshotFileRecord
from state_engine.catalog.rows import REFERENCES, Ref, RowsMixin, file_record, resolve_job
from state_engine.catalog.store import as_json, check_int, check_name, chunks, window
from state_engine.errors import FileAlreadyRegistered, InvalidCatalogInput, ReusedFileMissing
from state_engine.snapshot_enums import SnapshotStatus


class FileRegistryMixin(RowsMixin, LeaseMixin):
    """Files and the snapshots that reference them: attach, list, release and forget."""

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

    def snapshot_files(
        self, snapshot_id: int, *, limit: int | None = None, offset: int = 0
    ) -> list[SnapshotFileRecord]:
        """The files a snapshot references, by operator, subtask and path."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            rows = s.execute(window(snapshot_files_stmt(snapshot_id), limit, offset))
            return with_details(s, rows)

    def releasable_files(self, job: str | int) -> list[FileRecord]:
        """Files of the job that no retained (PENDING or COMPLETED) snapshot references."""
        with self._read() as s:
            job_id = resolve_job(s, job).id
            rows = s.scalars(
                select(File).where(File.job_id == job_id, File.live_refs == 0).order_by(File.id)
            )
            return [file_record(f) for f in rows]

    def orphan_candidates(
        self, job: str | int | None = None, *, limit: int | None = None
    ) -> list[FileRecord]:
        """Files no live snapshot references, of one job or of all jobs (oldest first)."""
        with self._read() as s:
            stmt = select(File).where(File.live_refs == 0)
            if job is not None:
                stmt = stmt.where(File.job_id == resolve_job(s, job).id)
            return [file_record(f) for f in s.scalars(stmt.order_by(File.id).limit(limit))]

    def live_paths(self, job: str | int) -> set[str]:
        """Paths that a retained snapshot of the job references: never to be deleted."""
        with self._read() as s:
            job_id = resolve_job(s, job).id
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
            job_id = resolve_job(s, job).id
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
            job_id = resolve_job(s, job).id
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
            job_id = resolve_job(s, job).id
            return set(s.scalars(select(File.path).where(File.job_id == job_id)))

    def forget_files(self, job: str | int, paths: Iterable[str], *, lease: str, token: int) -> int:
        """Remove deleted files from the catalog, under a lease; returns how many were known.

        Refused (nothing removed) if a retained snapshot still references one of them, or if the
        fencing token is stale. Unknown paths are skipped, so a retry is harmless.
        """
        wanted = list(dict.fromkeys(paths))
        with self._write() as s:
            self._check_lease_in(s, lease, token)
            job_row = resolve_job(s, job)
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


def snapshot_files_stmt(snapshot_id: int) -> Select[*tuple[Any, ...]]:
    # The tables rather than sk_v_snapshot_files: the reference's group and position end the
    # ORDER BY, so pages cut by offset never overlap or skip (one path may be read by several
    # subtasks). The last two columns find each reference's details (see with_details).
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


def with_details(s: Session, rows: Iterable[Any]) -> list[SnapshotFileRecord]:
    """Records of :func:`snapshot_files_stmt` rows, each with its reference's details (read
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


def count_references(snapshot_id: int) -> Select[int]:
    """How many references the snapshot has to files the catalog knows."""
    return (
        select(func.count())
        .select_from(Ref)
        .join(File, File.id == Ref.c.file_id)
        .where(Ref.c.snapshot_id == snapshot_id)
    )


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
