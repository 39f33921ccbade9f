"""Questions people ask of the catalog: state size over time, key-group skew, the pages the
Airflow UI and its API list, and read-only SQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, case, func, select

from state_engine.catalog import views
from state_engine.catalog.file_registry import count_references, snapshot_files_stmt, with_details
from state_engine.catalog.models import File, KeyGroupStat, Operator, Snapshot
from state_engine.catalog.readonly import run_readonly
from state_engine.catalog.records import (
    FilesSummary,
    JobRecord,
    KeyGroupStatRow,
    Page,
    QueryResult,
    SizePoint,
    SkewRecord,
    SnapshotFileRecord,
    SnapshotRecord,
)
from state_engine.catalog.rows import (
    Ref,
    RowsMixin,
    job_record,
    jobs_stmt,
    resolve_job,
    snapshot_record,
    snapshots_stmt,
)
from state_engine.catalog.store import count_rows, window


class ReportsMixin(RowsMixin):
    """Read-only answers for people: pages with totals, size history, skew, SQL."""

    def jobs_page(self, *, limit: int | None = None, offset: int = 0) -> Page[JobRecord]:
        """A page of :meth:`list_jobs` and how many jobs there are in all."""
        with self._read() as s:
            stmt = jobs_stmt()
            items = [job_record(j) for j in s.scalars(window(stmt, limit, offset))]
            return Page(items, count_rows(s, stmt), offset, limit)

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
            job_row = resolve_job(s, job)
            stmt = snapshots_stmt(job_row.id, status, kind)
            items = [
                snapshot_record(r, job_row.name) for r in s.scalars(window(stmt, limit, offset))
            ]
            return Page(items, count_rows(s, stmt), offset, limit)

    def latest_snapshots(self) -> list[SnapshotRecord]:
        """The latest COMPLETED snapshot of every job that has one."""
        with self._read() as s:
            v = views.latest_snapshots
            rows = s.execute(
                select(Snapshot, v.c.job).join(v, v.c.snapshot_id == Snapshot.id).order_by(v.c.job)
            )
            return [snapshot_record(snap, job) for snap, job in rows]

    def snapshot_files_page(
        self, snapshot_id: int, *, limit: int | None = None, offset: int = 0
    ) -> Page[SnapshotFileRecord]:
        """A page of :meth:`snapshot_files` and how many references there are in all."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            stmt = snapshot_files_stmt(snapshot_id)
            items = with_details(s, s.execute(window(stmt, limit, offset)))
            total = s.scalar(count_references(snapshot_id))
            return Page(items, int(total or 0), offset, limit)

    def snapshot_files_summary(self, snapshot_id: int) -> FilesSummary:
        """Counts and bytes of what a snapshot references, computed in the database."""
        with self._read() as s:
            self._snapshot_record(s, snapshot_id)
            refs = s.scalar(count_references(snapshot_id))
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

    def state_size_history(
        self, job: str | int, *, operator: str | None = None, limit: int | None = None
    ) -> list[SizePoint]:
        """Size per operator of each completed snapshot of the job, oldest first.

        ``limit`` keeps the newest ``limit`` snapshots (all their operators); to page through
        the points instead, use :meth:`size_history_page`.
        """
        with self._read() as s:
            stmt = _size_history_stmt(resolve_job(s, job).id, operator, limit)
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
            stmt = _size_history_stmt(resolve_job(s, job).id, operator, None)
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
