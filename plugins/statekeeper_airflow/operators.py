"""Run one Statekeeper maintenance job (``state_engine.jobs``) for one Statekeeper job from Airflow.

:class:`StatekeeperJobOperator` is the operator; :func:`run_maintenance` is the same work for a
``@task`` that decides something first (the maintenance DAG's compaction). Both:

* give the run a **stable run id** derived from (dag id, Airflow run id, task id, map index,
  maintenance kind, job): an Airflow retry reuses it, so a run that already SUCCEEDED returns its
  recorded report (``skipped: true``) instead of writing its output twice, and a FAILED one is
  retried as the same catalog run (its next attempt finds what the failed one left);
* record the DAG id, the Airflow run id and the task id with the run in the catalog;
* refuse a job name that breaks the naming rule (:mod:`state_engine.names`) and a snapshot id
  outside the catalog's 64-bit range (:mod:`state_engine.ids`) at once, without a retry;
* return the run's report (XCom ``return_value``);
* emit an asset event through the alias :data:`SNAPSHOTS` for the snapshot the run wrote, on the
  asset ``statekeeper://<job>/snapshots`` (one asset per Statekeeper job, created on first event),
  with the snapshot id, the maintenance kind and the run id as the event's ``extra``.

Where Spark runs (see :mod:`statekeeper_airflow.spark_submit`):

* **local mode** (the default): no ``spark_default`` connection, or one whose host is ``local``,
  ``local[n]`` or ``local[*]``. The task is the Spark driver, in-process, on a ``local[*]``
  SparkSession (an already active session is reused and left running). The catalog and the
  storage are the worker's ``STATEKEEPER_CATALOG_URL`` / ``STATEKEEPER_CHECKPOINT_ROOT``.
* **cluster mode**: ``spark_default`` names a cluster (``spark://host:7077``, ``k8s://...``,
  ``yarn``). The task runs ``spark-submit state_engine/jobs/__main__.py KIND --param ... --run-id
  ...`` through the Spark provider's ``SparkSubmitHook`` with the worker's ``STATEKEEPER_*``
  variables forwarded to the driver (not possible in standalone ``deploy-mode cluster``: set them
  on the Spark workers). ``state_engine`` must be installed on the driver and the executors. The
  report is read back from the catalog by run id once spark-submit exits, not parsed from the
  driver's log (which a cluster-mode driver does not send back).

Before any Spark session starts or spark-submit runs, the inputs are checked against the catalog
(:mod:`state_engine.maintenance.preflight`: the job exists, the snapshot is the job's, COMPLETED
and in a format the job reads, the parallelism fits the max parallelism, a savepoint directory is
inside the job's roots or ``STATEKEEPER_ALLOWED_SAVEPOINT_DIRS``) and the input snapshot is
pinned: a retry reads what the first try read. Errors that a retry cannot fix (those, a bad
setting) fail the task at once (``AirflowFailException``) with the job's message; those the job's
state caused are recorded as a FAILED run of the job, argument errors not at all; others (a lease
held by another deleting run, Spark or storage failures) fail it for Airflow's retries.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from statekeeper_airflow.flink import FLINK_KINDS, run_flink_maintenance
from statekeeper_airflow.spark_submit import (
    DEFAULT_CONN_ID,
    SparkModeError,
    SparkTarget,
    application_args,
    application_path,
    forwarded_env,
    local_session,
    param_names,
    spark_target,
    submit_hook,
)

log = logging.getLogger(__name__)

SNAPSHOTS = AssetAlias("statekeeper-snapshots")
RUN_ID_MAX = 250


def snapshot_asset(job: str) -> Asset:
    """The asset standing for the snapshots of Statekeeper job ``job``."""
    return Asset(
        name=f"statekeeper-{job}-snapshots",
        uri=f"statekeeper://{quote(job, safe='')}/snapshots",
        group="statekeeper",
    )


def stable_run_id(
    kind: str, job: str | None, *, dag_id: str, airflow_run_id: str, task_id: str, map_index: int
) -> str:
    """The catalog run id of one task instance's job run: the same for each of its tries."""
    key = "\x1f".join([dag_id, airflow_run_id, task_id, str(map_index), kind, job or ""])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    readable = f"airflow-{kind}-{job or 'any'}"[: RUN_ID_MAX - len(digest) - 1]
    return f"{readable}-{digest}"


def _permanent_errors() -> tuple[type[BaseException], ...]:
    from state_engine.errors import (
        CatalogVersionMismatch,
        ConfigurationError,
        InvalidCatalogInput,
        InvalidJobParams,
        NotFound,
        RunIdConflict,
        SnapshotNotUsable,
    )

    return (
        CatalogVersionMismatch,
        ConfigurationError,
        InvalidCatalogInput,
        InvalidJobParams,
        NotFound,
        RunIdConflict,
        SnapshotNotUsable,
    )


def check_params(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` without the unset ones; a name the job does not take fails the task."""
    from state_engine.jobs.commands import JOBS

    if kind not in JOBS:
        raise AirflowFailException(
            f"unknown maintenance job {kind!r}; this installation has: {', '.join(sorted(JOBS))}"
        )
    known = param_names(kind)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise AirflowFailException(
            f"maintenance job {kind!r} takes no parameter {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(known)}"
        )
    return {k: v for k, v in params.items() if v is not None}


def check_names_and_ids(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the job name checked and the snapshot id a number in the catalog's range;
    a bad one fails the task at once."""
    from state_engine.errors import StatekeeperError
    from state_engine.ids import check_id
    from state_engine.names import check_job_name

    out = dict(params)
    try:
        if out.get("job") is not None:
            check_job_name(out["job"])
        if out.get("snapshot") is not None:
            out["snapshot"] = check_id(out["snapshot"], "snapshot id")
    except StatekeeperError as exc:
        raise AirflowFailException(f"{kind}: {exc}") from exc
    return out


#: Options of the savepoint job that only a conversion of a Flink job's snapshot uses.
FLINK_ONLY = ("ttl", "pyflink_types")


def run_maintenance(
    kind: str,
    job: str | None,
    params: Mapping[str, Any] | None,
    context: Mapping[str, Any],
    *,
    conn_id: str | None = DEFAULT_CONN_ID,
    spark_conf: Mapping[str, str] | None = None,
    submit_kwargs: Mapping[str, Any] | None = None,
    emit: bool = True,
) -> dict[str, Any]:
    """Run maintenance job ``kind`` on Statekeeper job ``job`` for the task of ``context``."""
    merged = dict(params or {})
    if job is not None:
        merged["job"] = job
    merged = check_names_and_ids(kind, check_params(kind, merged))
    check_policy(kind, merged)
    ti = context["ti"]
    dag_id, airflow_run_id = ti.dag_id, ti.run_id
    map_index = getattr(ti, "map_index", -1)
    run_id = stable_run_id(
        kind,
        merged.get("job"),
        dag_id=dag_id,
        airflow_run_id=airflow_run_id,
        task_id=ti.task_id,
        map_index=-1 if map_index is None else map_index,
    )
    ids = {
        "run_id": run_id,
        "dag_id": dag_id,
        "airflow_run_id": airflow_run_id,
        "task_id": ti.task_id,
    }
    if kind in FLINK_KINDS:
        # a job imported from Apache Flink is maintained in-process, without Spark
        try:
            flink_report = run_flink_maintenance(kind, merged, ids)
        except _permanent_errors() as exc:
            raise AirflowFailException(f"{kind} of job {merged.get('job')!r}: {exc}") from exc
        if flink_report is not None:
            if emit:
                emit_snapshot_event(context, flink_report, kind)
            return flink_report
    given = [name for name in FLINK_ONLY if merged.get(name)]
    if given and _rewrites_flink(kind, merged):
        given = []  # ttl_cleanup of a Flink job: its --ttl, as statectl's (jobs/flink_rewrite.py)
    elif given:
        raise AirflowFailException(
            f"{kind} of job {merged.get('job')!r}: {' and '.join(given)} apply to snapshots of "
            "Flink jobs only (Statekeeper's own snapshots record their TTLs and types); leave "
            "them empty"
        )
    if not _rewrites_flink(kind, merged):
        merged = {k: v for k, v in merged.items() if k not in FLINK_ONLY}
    try:
        target = spark_target(conn_id)
    except SparkModeError as exc:
        raise AirflowFailException(str(exc)) from exc
    log.info("%s run %s: %s (%s)", kind, run_id, target.mode, target.reason)
    from state_engine.jobs.spark import app_name

    name = app_name(
        kind, merged.get("job"), dag_id=dag_id, task_id=ti.task_id, airflow_run_id=airflow_run_id
    )
    try:
        merged = check_before_spark(kind, merged, ids)
        if target.in_process:
            report = _run_in_process(kind, merged, ids, target, app_name=name)
        else:
            report = _run_on_cluster(
                kind, merged, ids, target, spark_conf, submit_kwargs, name=name, task_id=ti.task_id
            )
    except _permanent_errors() as exc:
        # retrying cannot fix a name, a parameter or a setting: fail now, with the job's message
        raise AirflowFailException(f"{kind} of job {merged.get('job')!r}: {exc}") from exc
    log.info(
        "%s run %s %s: output snapshot %s, rows %s -> %s%s",
        kind,
        run_id,
        report.get("status", "SUCCEEDED"),
        report.get("output_snapshot_id"),
        report.get("rows_in"),
        report.get("rows_out"),
        " (already done: skipped)" if report.get("skipped") else "",
    )
    log_restore(report)
    if emit:
        emit_snapshot_event(context, report, kind)
    return report


def check_policy(kind: str, params: Mapping[str, Any]) -> None:
    """Fail the task (no retry fixes it) when the job's management policy does not allow the
    deletion ``kind`` makes; nothing is run or recorded."""
    from state_engine.catalog import Catalog
    from state_engine.errors import JobReadOnly
    from state_engine.maintenance.scope import ACTION_OF, check_allowed

    if kind not in ACTION_OF:
        return
    with Catalog.from_settings() as catalog:
        try:
            check_allowed(catalog, kind, params)
        except JobReadOnly as exc:
            raise AirflowFailException(str(exc)) from exc


def log_restore(report: Mapping[str, Any]) -> None:
    """A Flink savepoint written by the run: how to restore it, and what the job must change."""
    stats = report.get("stats") or {}
    restore = stats.get("restore")
    if not isinstance(restore, dict):
        return
    from state_engine.flink.maintain import restore_lines

    if stats.get("no_rewrite_needed"):
        log.info("%s", stats.get("message", "no rewrite needed"))
    for line in restore_lines(restore):
        (log.warning if line.startswith("warning:") else log.info)("%s", line)


def _rewrites_flink(kind: str, params: Mapping[str, Any]) -> bool:
    """Whether the run rewrites a Flink job's snapshot into a Flink savepoint."""
    from state_engine.catalog import Catalog
    from state_engine.flink.maintain import targets_flink

    with Catalog.from_settings() as catalog:
        return targets_flink(catalog, kind, params)


def check_before_spark(kind: str, params: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """The run's params checked against the catalog (and its input pinned) before any Spark
    starts; a refusal is raised (and recorded as a FAILED run unless it is an argument error)."""
    from state_engine.catalog import Catalog
    from state_engine.config import Settings
    from state_engine.maintenance.preflight import check_before_spark as check

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        from state_engine.flink.maintain import targets_flink

        if targets_flink(catalog, kind, params):
            # a Flink job's snapshot is rewritten into a Flink savepoint (jobs/flink_rewrite.py)
            from state_engine.jobs.flink_rewrite import check_before_spark as check_flink

            checked = check_flink(kind, catalog, params, settings=settings, **ids)
            checked.pop("_needs_spark")
            return checked
        return check(kind, catalog, params, settings=settings, **ids)


def _run_in_process(
    kind: str,
    params: dict[str, Any],
    ids: dict[str, str],
    target: SparkTarget,
    *,
    app_name: str,
) -> dict[str, Any]:
    from state_engine.catalog import Catalog
    from state_engine.config import Settings
    from state_engine.jobs.commands import JOBS

    settings = Settings.from_env()
    runner = JOBS[kind].runner()
    spark, started_here = local_session(target.master, app_name)
    try:
        with Catalog.from_settings(settings) as catalog:
            return runner(spark, catalog, settings=settings, **ids, **params)
    finally:
        if started_here:
            spark.stop()


def _run_on_cluster(
    kind: str,
    params: dict[str, Any],
    ids: dict[str, str],
    target: SparkTarget,
    spark_conf: Mapping[str, str] | None,
    submit_kwargs: Mapping[str, Any] | None,
    *,
    name: str,
    task_id: str,
) -> dict[str, Any]:
    from state_engine.catalog import Catalog
    from state_engine.errors import NoSuchRun

    run_id = ids["run_id"]
    with Catalog.from_settings() as catalog:
        try:
            before = catalog.get_run(run_id)
        except NoSuchRun:
            before = None
    if before is not None and before.status == "SUCCEEDED":
        # an earlier try finished on the cluster: no second spark-submit
        return {**(before.stats or {}), "skipped": True}
    args = application_args(
        kind,
        params,
        run_id=run_id,
        dag_id=ids["dag_id"],
        airflow_run_id=ids["airflow_run_id"],
        task_id=task_id,
    )
    from state_engine.errors import SparkMasterUnreachable
    from state_engine.jobs.spark import check_master_reachable

    try:
        check_master_reachable(target.master)
    except SparkMasterUnreachable as exc:
        raise AirflowException(f"{kind} run {run_id!r}: {exc}") from exc  # retried: may come back
    hook = submit_hook(
        target,
        kind,
        args,
        name=name,
        conf=spark_conf,
        env=forwarded_env(os.environ),
        submit_kwargs=submit_kwargs,
    )
    try:
        hook.submit(application_path())
    except AirflowException as exc:
        raise AirflowException(
            f"{kind} run {run_id!r}: {_recorded_failure(run_id) or exc}"
        ) from exc
    with Catalog.from_settings() as catalog:
        try:
            record = catalog.get_run(run_id)
        except NoSuchRun:
            record = None
    if record is None or record.status != "SUCCEEDED":
        state = "never recorded" if record is None else f"{record.status}: {record.error}"
        raise AirflowException(
            f"{kind} run {run_id!r}: spark-submit exited 0 but the catalog has the run {state}; "
            "check that the driver uses the same STATEKEEPER_CATALOG_URL as the Airflow worker"
        )
    return dict(record.stats or {})


def _recorded_failure(run_id: str) -> str | None:
    """The reason the catalog recorded for a failed run, if the driver got that far."""
    from state_engine.catalog import Catalog
    from state_engine.errors import NoSuchRun

    try:
        with Catalog.from_settings() as catalog:
            record = catalog.get_run(run_id)
    except NoSuchRun:
        return None
    if record.status == "FAILED" and record.error:
        return f"the catalog recorded it FAILED: {record.error}"
    return None


def emit_snapshot_event(context: Mapping[str, Any], report: Mapping[str, Any], kind: str) -> bool:
    """An asset event on the job's snapshot asset for the snapshot the run wrote (if any)."""
    snapshot_id = report.get("output_snapshot_id")
    job = report.get("job")
    if snapshot_id is None or not job:
        return False
    extra = {
        "snapshot_id": snapshot_id,
        "input_snapshot_id": report.get("input_snapshot_id"),
        "maintenance": kind,
        "run_id": report.get("run_id"),
        "rows_out": report.get("rows_out"),
        "bytes_out": report.get("bytes_out"),
    }
    context["outlet_events"][SNAPSHOTS].add(snapshot_asset(str(job)), extra=extra)
    return True


class StatekeeperJobOperator(BaseOperator):
    """Run the maintenance job ``maintenance`` (e.g. ``ttl_cleanup``) on Statekeeper job ``job``.

    ``job_params`` are the job's own parameters by their command-line names (``snapshot``,
    ``retain_last``, ``older_than``, ``dry_run``, ...; ``python -m state_engine.jobs KIND -h``
    lists them). ``job`` and ``job_params`` are templated; with a DAG's
    ``render_template_as_native_obj=True`` a ``"{{ params.x }}"`` keeps its type (int, None).
    ``conn_id`` names the Spark connection deciding local vs cluster mode (module docstring);
    ``spark_conf`` and ``submit_kwargs`` go to spark-submit in cluster mode only.
    """

    template_fields: Sequence[str] = ("job", "job_params")
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        maintenance: str,
        job: str | None = None,
        job_params: Mapping[str, Any] | None = None,
        conn_id: str | None = DEFAULT_CONN_ID,
        spark_conf: Mapping[str, str] | None = None,
        submit_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # partial() passes outlets=[] explicitly: a mapped task must name the alias itself
        # (``.partial(..., outlets=[SNAPSHOTS])``) for the scheduler to know it
        if not kwargs.get("outlets"):
            kwargs["outlets"] = [SNAPSHOTS]
        super().__init__(**kwargs)
        self.maintenance = maintenance
        self.job = job
        self.job_params = dict(job_params or {})
        self.conn_id = conn_id
        self.spark_conf = dict(spark_conf or {})
        self.submit_kwargs = dict(submit_kwargs or {})

    def execute(self, context: Any) -> dict[str, Any]:
        return run_maintenance(
            self.maintenance,
            self.job,
            self.job_params,
            context,
            conn_id=self.conn_id,
            spark_conf=self.spark_conf,
            submit_kwargs=self.submit_kwargs,
            emit=SNAPSHOTS in (self.outlets or []),
        )
