"""The wrapper every maintenance job runs in: one recorded, retry-safe maintenance run.

A job body is ``body(catalog, ctx, **params) -> JobResult``; :func:`recorded_run` turns it into
``run(catalog, *, run_id=None, dag_id=None, airflow_run_id=None, task_id=None, settings=None,
**params) -> report``. The run is recorded in the catalog with its params, input and output
snapshots, rows and bytes in and out, duration and the Airflow task that ran it. The same
``run_id`` again returns the recorded report of a SUCCEEDED run without redoing anything; after a
failure it starts another attempt, and the body finds whatever the failed attempt left through
``ctx.tag`` (see :mod:`state_engine.maintenance.output`). A ``dry_run`` is recorded DRY_RUN. An
error in the arguments (an unknown job or snapshot, a bad parameter) is raised without a record
of the run; any other error marks the run FAILED with its reason and is raised as a
StatekeeperError. The Spark jobs add their session in front
(:func:`state_engine.jobs.spark_job.maintenance_job`).
"""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from state_engine.catalog import Catalog
from state_engine.config import Settings
from state_engine.errors import MaintenanceJobFailed, StatekeeperError
from state_engine.maintenance.preflight import (
    READS,
    is_argument_error,
    pinned_snapshot,
    record_refusal,
)
from state_engine.snapshot.storage import storage_failure

Report = dict[str, Any]
RUN_TAG_PREFIX = "run-"


def run_tag(run_id: str) -> str:
    """The snapshot ``trigger`` that ties a snapshot to the maintenance run that wrote it."""
    return RUN_TAG_PREFIX + hashlib.sha1(run_id.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class RunTarget:
    """What a run works on, known before it starts: its job and input snapshot."""

    job: str | None
    input_snapshot_id: int | None = None


@dataclass
class JobResult:
    """What a job body hands back to be recorded."""

    output_snapshot_id: int | None = None
    rows_in: int = 0
    rows_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunContext:
    """The running attempt: its id, the tag its outputs carry, which attempt it is."""

    run_id: str
    kind: str
    tag: str
    attempt: int
    target: RunTarget
    settings: Settings


Body = Callable[..., JobResult]
Resolver = Callable[[Catalog, dict[str, Any]], RunTarget]
Runner = Callable[..., Report]


def error_line(exc: BaseException) -> str:
    """One readable line for an error, digging the Python error out of a Spark task failure."""
    text = str(exc).strip()
    if "Traceback (most recent call last)" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        for ln in reversed(lines):
            head = ln.split(":", 1)[0]
            if ": " in ln and head.replace(".", "").replace("_", "").isalnum():
                return ln.split("\tat ", 1)[0][:1000]
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}"[:1000]


def recorded_run(kind: str, resolve: Resolver) -> Callable[[Body], Runner]:
    """Make ``body`` a recorded maintenance run of ``kind`` (see the module docstring)."""

    def wrap(body: Body) -> Runner:
        @functools.wraps(body)
        def run(
            catalog: Catalog,
            *,
            run_id: str | None = None,
            dag_id: str | None = None,
            airflow_run_id: str | None = None,
            task_id: str | None = None,
            settings: Settings | None = None,
            **params: Any,
        ) -> Report:
            run_id = run_id or f"{kind}-{uuid.uuid4().hex}"
            params = {k: v for k, v in params.items() if v is not None}
            airflow = {"dag_id": dag_id, "airflow_run_id": airflow_run_id, "task_id": task_id}
            if kind in READS and params.get("snapshot") is None:
                # a retry reads what its first attempt read, not a newer "latest"
                pinned = pinned_snapshot(catalog, run_id)
                if pinned is not None:
                    params["snapshot"] = pinned
            try:
                target = resolve(catalog, params)
            except StatekeeperError as exc:
                if not is_argument_error(exc):
                    record_refusal(catalog, kind, run_id, params, str(exc), **airflow)
                raise
            record = catalog.start_run(
                run_id,
                kind,
                job=target.job,
                params=params,
                input_snapshot_id=target.input_snapshot_id,
                **airflow,
            )
            if record.status == "SUCCEEDED":
                return {**(record.stats or {}), "skipped": True}
            ctx = RunContext(
                run_id=run_id,
                kind=kind,
                tag=run_tag(run_id),
                attempt=record.attempts,
                target=target,
                settings=settings or Settings.from_env(),
            )
            started = time.perf_counter()
            try:
                result = body(catalog, ctx, **params)
            except BaseException as exc:
                # an object store failing under the job (endpoint, credentials, bucket) is said
                # as what to fix, not as the client library's exception
                failure = storage_failure(exc, ctx.settings.checkpoint_root)
                if failure is not None and failure is not exc:
                    failure.__cause__ = exc
                    exc = failure
                reason = str(exc) if isinstance(exc, StatekeeperError) else error_line(exc)
                # refused for its arguments on its first attempt: nothing was touched, no history
                if not (is_argument_error(exc) and catalog.discard_run(run_id)):
                    catalog.fail_run(
                        run_id, reason, stats={"duration_s": time.perf_counter() - started}
                    )
                if isinstance(exc, StatekeeperError) or not isinstance(exc, Exception):
                    raise exc
                raise MaintenanceJobFailed(
                    f"{kind} run {run_id!r} failed: {reason}; it is recorded FAILED: fix the "
                    "cause and run it again with the same run id"
                ) from exc
            dry_run = bool(params.get("dry_run"))
            report: Report = {
                "run_id": run_id,
                "kind": kind,
                "job": target.job,
                "status": "DRY_RUN" if dry_run else "SUCCEEDED",
                "attempt": record.attempts,
                "input_snapshot_id": target.input_snapshot_id,
                "output_snapshot_id": result.output_snapshot_id,
                "rows_in": result.rows_in,
                "rows_out": result.rows_out,
                "bytes_in": result.bytes_in,
                "bytes_out": result.bytes_out,
                "duration_s": round(time.perf_counter() - started, 3),
                "params": params,
                "stats": result.stats,
                "trigger": ctx.tag,
                **{k: v for k, v in airflow.items() if v is not None},
            }
            catalog.finish_run(
                run_id,
                stats=report,
                output_snapshot_id=result.output_snapshot_id,
                rows_in=result.rows_in,
                rows_out=result.rows_out,
                bytes_in=result.bytes_in,
                bytes_out=result.bytes_out,
                dry_run=dry_run,
            )
            return report

        run.kind = kind  # type: ignore[attr-defined]  # tags the job function with its kind
        return run

    return wrap
