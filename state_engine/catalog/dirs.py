"""Directories a job's snapshots are imported from (Flink checkpoint and savepoint directories).

One directory belongs to one job: the unique path makes a second import of the same directory
under another job name fail in the database, race or not.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.exc import IntegrityError

from state_engine.catalog.models import Job, JobDir
from state_engine.catalog.store import Store, check_name
from state_engine.errors import FlinkDirectoryClaimed, NoSuchJob


class JobDirMixin(Store):
    def claim_directory(self, job: str, path: str, role: str) -> bool:
        """Record ``path`` as a directory of ``job``; True if new, False if already the job's.

        Another job owning it is a FlinkDirectoryClaimed naming that job.
        """
        check_name(path, "a directory path", 10_000)
        check_name(role, "a directory role", 32)
        with self._write() as s:
            job_id = s.scalar(select(Job.id).where(Job.name == job))
            if job_id is None:
                raise NoSuchJob(f"no job {job!r} in the catalog; import it first")
            owner = s.execute(
                select(Job.name, JobDir.job_id)
                .join(Job, Job.id == JobDir.job_id)
                .where(JobDir.path == path)
            ).one_or_none()
            if owner is not None:
                if owner[1] != job_id:
                    raise _claimed(path, owner[0], job)
                return False
            try:
                with s.begin_nested():
                    s.add(JobDir(job_id=job_id, path=path, role=role, created_at=self.now()))
            except IntegrityError:
                name = s.scalar(
                    select(Job.name)
                    .join(JobDir, JobDir.job_id == Job.id)
                    .where(JobDir.path == path)
                )
                raise _claimed(path, name or "?", job) from None
            return True

    def release_directory(self, job: str, path: str) -> bool:
        """``job`` no longer claims ``path``; True if it did. Its snapshots and files are the
        caller's to settle first (``state_engine.flink.forget``)."""
        with self._write() as s:
            job_id = s.scalar(select(Job.id).where(Job.name == job))
            if job_id is None:
                raise NoSuchJob(f"no job {job!r} in the catalog; list them with `statectl jobs`")
            gone = cast(
                "CursorResult[Any]",
                s.execute(delete(JobDir).where(JobDir.job_id == job_id, JobDir.path == path)),
            )
            return bool(gone.rowcount)

    def directory_owner(self, path: str) -> str | None:
        """The name of the job that imported ``path``, if any."""
        with self._read() as s:
            return s.scalar(
                select(Job.name).join(JobDir, JobDir.job_id == Job.id).where(JobDir.path == path)
            )

    def job_directories(self, job: str | int) -> list[tuple[str, str]]:
        """``(path, role)`` of every directory the job was imported from, by path."""
        with self._read() as s:
            cond = Job.id == job if isinstance(job, int) else Job.name == job
            job_id = s.scalar(select(Job.id).where(cond))
            if job_id is None:
                raise NoSuchJob(f"no job {job!r} in the catalog; list them with `statectl jobs`")
            rows = s.execute(
                select(JobDir.path, JobDir.role)
                .where(JobDir.job_id == job_id)
                .order_by(JobDir.path)
            )
            return [(p, r) for p, r in rows]


def _claimed(path: str, owner: str, job: str) -> FlinkDirectoryClaimed:
    return FlinkDirectoryClaimed(
        f"{path} was already imported as job {owner!r}; one directory belongs to one job: sync "
        f"it with `statectl flink import {path} --job {owner}` instead of importing it as {job!r}"
    )
