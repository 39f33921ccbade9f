"""The checks a maintenance run passes against the catalog before any Spark session starts.

Starting Spark costs seconds to minutes on a loaded machine; a job name, snapshot id, parallelism
or target directory that the catalog already proves wrong should be refused before that. An
argument error (:func:`is_argument_error`: an unknown job or snapshot, a parameter out of range)
is not a run and is not recorded; any other refusal (an input snapshot that is not usable, storage
that cannot be reached) is recorded as a FAILED run of the job (so ``statectl runs --job J``
shows it).

:func:`check_before_spark` is called by every entry point that is about to start Spark (the
Airflow operator, ``statectl maintain``, the spark-submit application); the job bodies keep their
own checks (files, ``_metadata``), which only storage can answer. It also pins the input: a run id
that already has an input snapshot keeps it, so a retry works on what its first attempt read,
never on a newer "latest".

This module imports no pyspark.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import Any

from state_engine.catalog import Catalog, RunRecord, SnapshotRecord
from state_engine.config import Settings
from state_engine.errors import (
    CheckpointError,
    InvalidJobName,
    InvalidJobParams,
    InvalidParallelism,
    NoSuchJob,
    NoSuchRun,
    NoSuchSnapshot,
    NotFound,
    RetentionRemovesEverything,
    SnapshotNotUsable,
    StatekeeperError,
)
from state_engine.keygroups import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot_enums import SnapshotFormat, SnapshotStatus

#: The snapshot formats each job reads (rescale depends on its max parallelism: see below).
READS: dict[str, tuple[SnapshotFormat, ...]] = {
    "ttl_cleanup": (SnapshotFormat.CANONICAL,),
    "compaction": (SnapshotFormat.DELTA, SnapshotFormat.CANONICAL),
    "savepoint": tuple(SnapshotFormat),
    "rescale": tuple(SnapshotFormat),
    # a Flink job's snapshot rewritten into a Flink savepoint (checked in jobs/flink_rewrite.py)
    "flink_rewrite": tuple(SnapshotFormat),
}
#: The jobs that take a ``savepoint_dir``.
WRITES_DIRS = ("savepoint", "ttl_cleanup", "rescale")


#: Errors in what a run was asked to do, said before it touches anything: never recorded as runs.
ARGUMENT_ERRORS: tuple[type[StatekeeperError], ...] = (
    InvalidJobName,
    InvalidJobParams,
    InvalidParallelism,
    NotFound,
    RetentionRemovesEverything,
)


def is_argument_error(exc: BaseException) -> bool:
    """Whether ``exc`` refuses a run's arguments (not recorded) rather than its job's state."""
    return isinstance(exc, ARGUMENT_ERRORS)


def earlier_run(catalog: Catalog, run_id: str | None) -> RunRecord | None:
    """The catalog's record of run ``run_id`` (an earlier attempt), or None."""
    if not run_id:
        return None
    try:
        return catalog.get_run(run_id)
    except NoSuchRun:
        return None


def pinned_snapshot(catalog: Catalog, run_id: str | None) -> int | None:
    """The input snapshot an earlier attempt of ``run_id`` recorded, if any."""
    earlier = earlier_run(catalog, run_id)
    return None if earlier is None else earlier.input_snapshot_id


def _known_job(catalog: Catalog, job: Any) -> str | None:
    if not isinstance(job, str) or not job:
        return None
    try:
        return catalog.get_job(job).name
    except NoSuchJob:
        return None


def whole_number(value: Any, what: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``low..high``; an InvalidJobParams line saying what to use."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidJobParams(f"{what} {value!r} is not a whole number") from None
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidJobParams(f"{what} {number} is out of range: use a number {bound}")
    return number


def _input_snapshot(catalog: Catalog, kind: str, params: dict[str, Any]) -> SnapshotRecord:
    job = params.get("job")
    if params.get("snapshot") is None:
        if job is None:
            raise InvalidJobParams("name the input: --snapshot ID, or --job NAME for its latest")
        latest = catalog.latest_snapshot(job)
        if latest is None:
            raise NoSuchSnapshot(
                f"job {job!r} has no COMPLETED snapshot to {kind.replace('_', ' ')}; list its "
                f"snapshots with `statectl snapshots {job}`"
            )
        return latest
    return snapshot_of_job(catalog, params["snapshot"], job)


def snapshot_of_job(catalog: Catalog, snapshot: Any, job: str | None) -> SnapshotRecord:
    """The catalog's snapshot ``snapshot`` (an id), which must be of ``job`` when one is named."""
    snapshot_id = whole_number(snapshot, "snapshot id", 1, (1 << 63) - 1)
    try:
        record = catalog.get_snapshot(snapshot_id)
    except NoSuchSnapshot:
        raise NoSuchSnapshot(
            f"snapshot {snapshot_id} is not in the catalog; list a job's snapshots with "
            "`statectl snapshots JOB`"
        ) from None
    if job is not None and record.job != job:
        raise InvalidJobParams(
            f"snapshot {record.id} belongs to job {record.job!r}, not {job!r}; pick one of "
            f"{job!r}'s from `statectl snapshots {job}`"
        )
    return record


def _readable_formats(kind: str, params: dict[str, Any], record: SnapshotRecord) -> tuple[str, ...]:
    if kind != "rescale":
        return READS[kind]
    new_max = params.get("max_parallelism")
    if new_max is None or int(new_max) == record.max_parallelism:
        # same max parallelism: a new _metadata over the input's files, which must be canonical
        return (SnapshotFormat.CANONICAL,)
    return READS[kind]


def _check_input(kind: str, params: dict[str, Any], record: SnapshotRecord) -> None:
    if record.status is not SnapshotStatus.COMPLETED:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.status}, not COMPLETED; only "
            f"completed snapshots are read: pick one from `statectl snapshots {record.job}`"
        )
    formats = _readable_formats(kind, params, record)
    if record.format not in formats:
        advice = (
            "take a canonical savepoint of it first (the savepoint job)"
            if record.format is SnapshotFormat.NATIVE
            else "compact it first (the compaction job)"
        )
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.format}; {kind} reads "
            f"{' or '.join(formats)} snapshots here: {advice}"
        )


def _check_parallelism(params: dict[str, Any], record: SnapshotRecord) -> None:
    if params.get("parallelism") is None:
        raise InvalidJobParams("rescale needs the new parallelism: --parallelism N")
    new_max = record.max_parallelism
    if params.get("max_parallelism") is not None:
        new_max = whole_number(
            params["max_parallelism"], "max_parallelism", 1, UPPER_BOUND_MAX_PARALLELISM
        )
    p = whole_number(params["parallelism"], "parallelism", 1)
    if p > new_max:
        raise InvalidJobParams(
            f"parallelism {p} is above the max parallelism {new_max} of job {record.job!r}: a "
            f"subtask owns at least one key group; use at most {new_max}, or raise "
            "max_parallelism too (a rescale that re-buckets the state)"
        )


def allowed_roots(catalog: Catalog, job: str, settings: Settings) -> list[str]:
    """The URL prefixes a savepoint of ``job`` may be written under."""
    from state_engine.maintenance.job_storage import storage_for

    roots = [storage_for(catalog, job, settings).url_of(), settings.checkpoint_root]
    roots.extend(settings.allowed_savepoint_dirs)
    return [_canonical_url(r) for r in roots]


def _canonical_url(url: str) -> str:
    from state_engine.snapshot.storage import canonical_url

    return canonical_url(url)


def _check_target_dir(catalog: Catalog, job: str, directory: Any, settings: Settings) -> None:
    from state_engine.maintenance.job_storage import storage_for

    if not isinstance(directory, str) or not directory.strip():
        raise InvalidJobParams(
            f"savepoint_dir {directory!r} is empty; leave it out for the default"
        )
    storage = storage_for(catalog, job, settings)
    # a relative path lands under the job's root (``..`` is refused by url_of)
    try:
        url = directory if "://" in directory else storage.url_of(directory)
    except CheckpointError as exc:
        raise InvalidJobParams(f"savepoint_dir {directory!r}: {exc}") from None
    where = _canonical_url(url)
    roots = allowed_roots(catalog, job, settings)
    if not any(where == r or where.startswith(r + "/") for r in roots):
        raise InvalidJobParams(
            f"savepoint_dir {directory!r} is outside job {job!r}'s storage roots "
            f"({', '.join(roots[:2])}); use a path under them, or add its parent to "
            "STATEKEEPER_ALLOWED_SAVEPOINT_DIRS (comma-separated URLs) on the workers"
        )


def check_inputs(
    kind: str, catalog: Catalog, params: Mapping[str, Any], settings: Settings
) -> dict[str, Any]:
    """``params`` checked against the catalog, with the input snapshot made explicit."""
    params = {k: v for k, v in params.items() if v is not None}
    job = params.get("job")
    if job is not None:
        if _known_job(catalog, job) is None:
            raise NoSuchJob(
                f"job {job!r} is not in the catalog; list the jobs with `statectl jobs`"
            )
    elif kind not in READS:
        raise InvalidJobParams(f"{kind} needs the job: --job NAME")
    if kind in READS:
        record = _input_snapshot(catalog, kind, params)
        if kind == "rescale":
            _check_parallelism(params, record)
        _check_input(kind, params, record)
        params["snapshot"] = record.id
        job = record.job
    if kind in WRITES_DIRS and params.get("savepoint_dir") is not None:
        _check_target_dir(catalog, str(job), params["savepoint_dir"], settings)
    if job is not None:
        from state_engine.maintenance.job_storage import storage_for

        # an object store is probed when opened: an endpoint that is down, refused credentials
        # or a missing bucket are said now, not by a Spark task minutes later
        storage_for(catalog, str(job), settings)
    return params


def refused_job(catalog: Catalog, params: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The job and input snapshot a refused run's params name, where the catalog knows them."""
    job = _known_job(catalog, params.get("job"))
    snapshot_id = None
    with contextlib.suppress(StatekeeperError, KeyError, TypeError, ValueError):
        record = catalog.get_snapshot(int(params["snapshot"]))
        snapshot_id = record.id
        # a snapshot id alone names its job: the refusal belongs on that job's page too
        job = job or (record.job if params.get("job") is None else None)
    return job, snapshot_id


def record_refusal(
    catalog: Catalog,
    kind: str,
    run_id: str,
    params: Mapping[str, Any],
    reason: str,
    *,
    dag_id: str | None = None,
    airflow_run_id: str | None = None,
    task_id: str | None = None,
) -> None:
    """Record run ``run_id`` FAILED with ``reason``, with its job when the catalog knows it."""
    job, snapshot_id = refused_job(catalog, params)
    # best effort: a run id already bound to another job keeps its own record
    with contextlib.suppress(StatekeeperError):
        catalog.start_run(
            run_id,
            kind,
            job=job,
            params={k: v for k, v in params.items() if v is not None},
            input_snapshot_id=snapshot_id,
            dag_id=dag_id,
            airflow_run_id=airflow_run_id,
            task_id=task_id,
        )
        catalog.fail_run(run_id, reason)


def check_before_spark(
    kind: str,
    catalog: Catalog,
    params: Mapping[str, Any],
    *,
    settings: Settings | None = None,
    run_id: str | None = None,
    dag_id: str | None = None,
    airflow_run_id: str | None = None,
    task_id: str | None = None,
) -> dict[str, Any]:
    """Check ``params`` of a ``kind`` run and pin its input; a refusal is raised, and recorded
    unless it is an argument error.

    Returns the params to start the run with (``snapshot`` set for jobs that read one).
    """
    settings = settings or Settings.from_env()
    params = dict(params)
    earlier = earlier_run(catalog, run_id)
    pinned = None if earlier is None else earlier.input_snapshot_id
    if kind in READS and params.get("snapshot") is None and pinned is not None:
        params["snapshot"] = pinned
    if earlier is not None and earlier.status == "SUCCEEDED":
        # done already (its input may be compacted away since): the run returns its report
        return {k: v for k, v in params.items() if v is not None}
    try:
        return check_inputs(kind, catalog, params, settings)
    except StatekeeperError as exc:
        if is_argument_error(exc):
            raise
        record_refusal(
            catalog,
            kind,
            run_id or f"{kind}-{uuid.uuid4().hex}",
            params,
            str(exc),
            dag_id=dag_id,
            airflow_run_id=airflow_run_id,
            task_id=task_id,
        )
        raise
