"""Maintenance runs: one row per caller-given run id, so a retried run is the same run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from state_engine.catalog.models import RUN_STATUSES, Job, MaintenanceRun, Snapshot
from state_engine.catalog.records import Page, RunRecord
from state_engine.catalog.rows import resolve_job
from state_engine.catalog.store import (
    Store,
    as_json,
    check_choice,
    check_int,
    check_name,
    count_rows,
    window,
)
from state_engine.errors import (
    InvalidRunTransition,
    NoSuchRun,
    NoSuchSnapshot,
    RunIdConflict,
)


class RunMixin(Store):
    def start_run(
        self,
        run_id: str,
        kind: str,
        *,
        job: str | int | None = None,
        params: dict[str, Any] | None = None,
        input_snapshot_id: int | None = None,
        dag_id: str | None = None,
        airflow_run_id: str | None = None,
        task_id: str | None = None,
    ) -> RunRecord:
        """Start (or restart) the run ``run_id``; ``dag_id``, ``airflow_run_id`` and ``task_id``
        name the Airflow task instance that started it.

        Idempotent by run id: a SUCCEEDED run is returned untouched (its output exists: skip the
        work); a FAILED or interrupted RUNNING one starts another attempt. The same id for another
        kind or job is a RunIdConflict.
        """
        check_name(run_id, "a run id", 250)
        check_name(kind, "a run kind", 32)
        for what, value in (("dag_id", dag_id), ("airflow_run_id", airflow_run_id),
                            ("task_id", task_id)):  # fmt: skip
            if value is not None:
                check_name(value, f"an Airflow {what}", 250)
        params = as_json(params or {}, "run params")
        now = self.now()
        with self._write() as s:
            job_id = None if job is None else resolve_job(s, job).id
            if input_snapshot_id is not None and s.get(Snapshot, input_snapshot_id) is None:
                raise NoSuchSnapshot(
                    f"input snapshot {input_snapshot_id} of run {run_id!r} is not in the catalog"
                )
            run = s.scalars(
                select(MaintenanceRun).where(MaintenanceRun.run_id == run_id).with_for_update()
            ).one_or_none()
            if run is None:
                run = MaintenanceRun(
                    run_id=run_id,
                    kind=kind,
                    job_id=job_id,
                    params=params,
                    status="RUNNING",
                    input_snapshot_id=input_snapshot_id,
                    attempts=1,
                    started_at=now,
                    dag_id=dag_id,
                    airflow_run_id=airflow_run_id,
                    task_id=task_id,
                )
                s.add(run)
                s.flush()
            elif run.kind != kind or run.job_id != job_id:
                raise RunIdConflict(
                    f"run id {run_id!r} already names a {run.kind} run of job id {run.job_id}, "
                    f"not a {kind} run of job id {job_id}; give this run its own id"
                )
            elif run.status != "SUCCEEDED":
                run.status, run.attempts, run.started_at = "RUNNING", run.attempts + 1, now
                run.finished_at, run.error, run.params = None, None, params
                if input_snapshot_id is not None:
                    run.input_snapshot_id = input_snapshot_id
                if dag_id is not None:  # a retry keeps its task's ids; a later task adds its own
                    run.dag_id, run.airflow_run_id, run.task_id = dag_id, airflow_run_id, task_id
            return _run(s, run)

    def finish_run(
        self,
        run_id: str,
        *,
        stats: dict[str, Any] | None = None,
        output_snapshot_id: int | None = None,
        rows_in: int | None = None,
        rows_out: int | None = None,
        bytes_in: int | None = None,
        bytes_out: int | None = None,
        dry_run: bool = False,
    ) -> RunRecord:
        """RUNNING -> SUCCEEDED with its statistics; -> DRY_RUN for a run that only reported
        what it would have done (it changed nothing)."""
        stats = as_json(stats, "run stats")
        for what, value in (
            ("rows_in", rows_in),
            ("rows_out", rows_out),
            ("bytes_in", bytes_in),
            ("bytes_out", bytes_out),
        ):
            if value is not None:
                check_int(value, what, 0)
        with self._write() as s:
            run = _running(s, run_id, "finish")
            if output_snapshot_id is not None and s.get(Snapshot, output_snapshot_id) is None:
                raise NoSuchSnapshot(
                    f"output snapshot {output_snapshot_id} of run {run_id!r} is not in the catalog"
                )
            status = "DRY_RUN" if dry_run else "SUCCEEDED"
            run.status, run.finished_at, run.stats = status, self.now(), stats
            run.output_snapshot_id = output_snapshot_id
            run.rows_in, run.rows_out, run.bytes_in, run.bytes_out = (
                rows_in,
                rows_out,
                bytes_in,
                bytes_out,
            )
            return _run(s, run)

    def fail_run(
        self, run_id: str, error: str, *, stats: dict[str, Any] | None = None
    ) -> RunRecord:
        """RUNNING -> FAILED, keeping the error (a retry with the same id may start it again)."""
        stats = as_json(stats, "run stats")
        with self._write() as s:
            run = _running(s, run_id, "fail")
            run.status, run.finished_at, run.error = "FAILED", self.now(), str(error)
            if stats is not None:
                run.stats = stats
            return _run(s, run)

    def discard_run(self, run_id: str) -> bool:
        """Delete run ``run_id`` if it is RUNNING its first attempt: a run refused for its
        arguments before it touched anything is not history. False (kept) otherwise."""
        with self._write() as s:
            run = _running(s, run_id, "discard")
            if run.attempts != 1:
                return False
            s.delete(run)
            return True

    def get_run(self, run_id: str) -> RunRecord:
        with self._read() as s:
            run = s.scalars(
                select(MaintenanceRun).where(MaintenanceRun.run_id == run_id)
            ).one_or_none()
            if run is None:
                raise _no_run(run_id)
            return _run(s, run)

    def list_runs(
        self,
        *,
        job: str | int | None = None,
        kind: str | None = None,
        status: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        """Maintenance history, newest first."""
        with self._read() as s:
            stmt = window(_runs_stmt(s, job, kind, status), limit, offset)
            return [_record(run, name) for run, name in s.execute(stmt)]

    def runs_page(
        self,
        *,
        job: str | int | None = None,
        kind: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> Page[RunRecord]:
        """A page of :meth:`list_runs` and how many runs match in all."""
        with self._read() as s:
            stmt = _runs_stmt(s, job, kind, status)
            items = [_record(run, name) for run, name in s.execute(window(stmt, limit, offset))]
            return Page(items, count_rows(s, stmt), offset, limit)


def _runs_stmt(
    s: Session, job: str | int | None, kind: str | None, status: str | None
) -> Select[MaintenanceRun, str]:
    stmt = select(MaintenanceRun, Job.name).outerjoin(Job, Job.id == MaintenanceRun.job_id)
    if job is not None:
        stmt = stmt.where(MaintenanceRun.job_id == resolve_job(s, job).id)
    if kind is not None:
        stmt = stmt.where(MaintenanceRun.kind == kind)
    if status is not None:
        stmt = stmt.where(MaintenanceRun.status == check_choice(status, "status", RUN_STATUSES))
    return stmt.order_by(MaintenanceRun.started_at.desc(), MaintenanceRun.id.desc())


def _no_run(run_id: str) -> NoSuchRun:
    return NoSuchRun(
        f"no maintenance run {run_id!r} in the catalog; list runs with `statectl runs`"
    )


def _running(s: Session, run_id: str, action: str) -> MaintenanceRun:
    run = s.scalars(
        select(MaintenanceRun).where(MaintenanceRun.run_id == run_id).with_for_update()
    ).one_or_none()
    if run is None:
        raise _no_run(run_id)
    if run.status != "RUNNING":
        raise InvalidRunTransition(
            f"cannot {action} run {run_id!r}: it is already {run.status}; start it again with "
            "start_run to retry"
        )
    return run


def _run(s: Session, run: MaintenanceRun) -> RunRecord:
    name = None if run.job_id is None else s.scalar(select(Job.name).where(Job.id == run.job_id))
    return _record(run, name)


def _record(run: MaintenanceRun, job: str | None) -> RunRecord:
    return RunRecord(
        id=run.id,
        run_id=run.run_id,
        kind=run.kind,
        job_id=run.job_id,
        job=job,
        status=run.status,
        params=run.params,
        stats=run.stats,
        input_snapshot_id=run.input_snapshot_id,
        output_snapshot_id=run.output_snapshot_id,
        rows_in=run.rows_in,
        rows_out=run.rows_out,
        bytes_in=run.bytes_in,
        bytes_out=run.bytes_out,
        attempts=run.attempts,
        started_at=run.started_at,
        finished_at=run.finished_at,
        error=run.error,
        dag_id=run.dag_id,
        airflow_run_id=run.airflow_run_id,
        task_id=run.task_id,
    )
