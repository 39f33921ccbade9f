"""The command lines of the maintenance jobs, and one run from a parsed line.

:data:`JOBS` holds each job's parameters; :func:`add_job_parsers` makes them subcommands of
``statectl maintain`` (:mod:`state_engine.cli.maintain`) and of ``python -m state_engine.jobs``
(the spark-submit application); the Airflow operators build spark-submit lines from them.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state_engine.config import Settings
from state_engine.snapshot_enums import SnapshotKind

COMMON = ("run_id", "dag_id", "airflow_run_id")
#: The jobs that, on a Flink job, write a Flink savepoint (state_engine.jobs.flink_rewrite).
FLINK_REWRITES = ("rescale", "ttl_cleanup", "flink_rewrite")
_NOT_PARAMS = {
    "handler",
    "command",
    "job_name",
    "maintain_command",
    "state_command",
    "json",
    "task_id",
}
#: Flink conversion options (flink/convert.py), not params of the savepoint Spark job
_CONVERSION_ONLY = {"ttl", "pyflink_types"}


@dataclass(frozen=True)
class JobSpec:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    runner: Callable[[], Callable[..., dict[str, Any]]]  # imported on use: pyspark is heavy


def _ttl_arguments(p: argparse.ArgumentParser) -> None:
    _input_arguments(p)
    p.add_argument(
        "--at", type=int, help="processing time in epoch ms (default: now) for processing-time TTL"
    )
    _flink_ttl_argument(p)
    p.add_argument(
        "--watermark", type=int, help="event-time watermark in epoch ms for event-time TTL states"
    )
    _output_arguments(p)


def _flink_ttl_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ttl",
        action="append",
        metavar="STATE=MS",
        help="Flink jobs: the TTL of a TTL state in ms (a Flink snapshot does not store it); "
        "repeatable",
    )


def flink_rewrite_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a rewrite of a Flink job's snapshot (``statectl flink rewrite``)."""
    _input_arguments(p)
    p.add_argument("--parallelism", type=int, help="new parallelism of every keyed operator")
    p.add_argument("--max-parallelism", type=int, help="new max parallelism (re-assigns keys)")
    _flink_ttl_argument(p)
    p.add_argument("--at", type=int, help="epoch ms the TTL is measured at (default: now)")
    p.add_argument(
        "--drop-state",
        action="append",
        metavar="[UID/]STATE",
        help="leave this keyed state out (restore with --allowNonRestoredState); repeatable",
    )
    p.add_argument(
        "--drop-operator",
        action="append",
        metavar="UID",
        help="leave this operator's state out (uid or hex operator id); repeatable",
    )
    p.add_argument(
        "--uid",
        action="append",
        metavar="OLD=NEW",
        help="give an operator a new uid (and so a new operator id); repeatable",
    )
    p.add_argument(
        "--savepoint-dir", help="the new savepoint's directory (URL or path under the root)"
    )


def _input_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshot", type=int, help="input snapshot id")
    p.add_argument("--job", help="job name (default input: its latest completed snapshot)")


def _output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=tuple(SnapshotKind), default=SnapshotKind.CHECKPOINT)
    p.add_argument("--savepoint-dir", help="savepoint directory (URL or path under the root)")
    p.add_argument("--tasks", type=int, help="Spark tasks to write with (default: 2 per core)")
    p.add_argument("--row-group-bytes", type=int, help="Parquet row-group target (bytes)")


def _deleting_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")
    p.add_argument(
        "--wait",
        nargs="?",
        const=True,
        metavar="SECONDS",
        help="wait for the job's file lease (up to SECONDS, default 600) instead of refusing",
    )


def _expire_arguments(p: argparse.ArgumentParser) -> None:
    _deleting_arguments(p)
    p.add_argument("--retain-last", type=int, help="keep the newest N completed checkpoints")
    p.add_argument(
        "--older-than",
        help="expire checkpoints completed before this ISO timestamp or this long ago ('7d')",
    )
    p.add_argument(
        "--savepoint",
        dest="savepoints",
        action="append",
        metavar="ID_OR_NAME",
        help="also expire this savepoint (snapshot id or directory name); repeatable",
    )
    p.add_argument(
        "--abort-pending-older-than",
        metavar="DURATION",
        help="fail the PENDING snapshots begun before this ISO timestamp or this long ago "
        "('1d'): commits whose writer died, which pin their files and hold orphan cleanup off "
        "shared/",
    )


def _orphan_arguments(p: argparse.ArgumentParser) -> None:
    _deleting_arguments(p)
    p.add_argument(
        "--older-than",
        default="3d",
        help="only files last modified before this ISO timestamp or this long ago (default 3d)",
    )


def _expire_runner() -> Callable[..., dict[str, Any]]:
    from state_engine.jobs import expire

    return expire.run


def _orphan_runner() -> Callable[..., dict[str, Any]]:
    from state_engine.jobs import orphan_cleanup

    return orphan_cleanup.run


def _compaction_arguments(p: argparse.ArgumentParser) -> None:
    _input_arguments(p)
    p.add_argument("--target-file-bytes", type=int, help="bin-pack output files toward this size")
    p.add_argument("--row-group-bytes", type=int, help="Parquet row-group target (bytes)")
    p.add_argument(
        "--no-release",
        dest="release",
        action="store_false",
        default=None,
        help="keep the chain's checkpoints COMPLETED (default: subsume them)",
    )


def _savepoint_arguments(p: argparse.ArgumentParser) -> None:
    _input_arguments(p)
    p.add_argument("--savepoint-dir", help="target directory (URL or path under the root)")
    p.add_argument("--at", type=int, help="drop entries of processing-time TTL expired at (ms)")
    p.add_argument("--watermark", type=int, help="drop entries of event-time TTL expired at (ms)")
    p.add_argument("--tasks", type=int, help="Spark tasks to write with (default: 2 per core)")
    p.add_argument("--row-group-bytes", type=int, help="Parquet row-group target (bytes)")
    p.add_argument(
        "--ttl",
        action="append",
        metavar="STATE=MS",
        help="Flink snapshots: the TTL of a TTL state in ms (Flink does not store it); repeatable",
    )
    p.add_argument(
        "--pyflink-type",
        dest="pyflink_types",
        action="append",
        metavar="STATE=KIND[:TYPE[:TYPE]]",
        help="PyFlink snapshots: how a Python state is coded, e.g. total=value:LONG",
    )


def _rescale_arguments(p: argparse.ArgumentParser) -> None:
    _input_arguments(p)
    p.add_argument("--parallelism", type=int, required=True, help="the new parallelism")
    p.add_argument("--max-parallelism", type=int, help="a new max parallelism (re-buckets rows)")
    p.add_argument("--kind", choices=tuple(SnapshotKind), help="output kind (new max p)")
    p.add_argument("--savepoint-dir", help="savepoint directory (new max parallelism)")
    p.add_argument("--tasks", type=int, help="Spark tasks (default: 2 per core)")
    p.add_argument("--row-group-bytes", type=int, help="Parquet row-group target (bytes)")


def _flink_aware(kind: str) -> Callable[[], Callable[..., dict[str, Any]]]:
    """The runner of ``kind``, which on a Flink job writes a Flink savepoint instead."""

    def load() -> Callable[..., dict[str, Any]]:
        from state_engine.flink.maintain import targets_flink
        from state_engine.jobs import flink_rewrite

        own = _runner_of(kind)()

        def run(spark: Any, catalog: Any, **params: Any) -> dict[str, Any]:
            if targets_flink(catalog, kind, params):
                report: dict[str, Any] = flink_rewrite.runner(kind)(spark, catalog, **params)
                return report
            return own(spark, catalog, **params)

        return run

    return load


def _runner_of(module: str) -> Callable[[], Callable[..., dict[str, Any]]]:
    def load() -> Callable[..., dict[str, Any]]:
        import importlib

        run: Callable[..., dict[str, Any]] = importlib.import_module(
            f"state_engine.jobs.{module}"
        ).run
        return run

    return load


JOBS: dict[str, JobSpec] = {
    "expire": JobSpec(
        "expire",
        "expire old checkpoints (and named savepoints) and delete the files nothing else uses",
        _expire_arguments,
        _expire_runner,
    ),
    "orphan_cleanup": JobSpec(
        "orphan_cleanup",
        "delete files under the job's roots that no snapshot references",
        _orphan_arguments,
        _orphan_runner,
    ),
    "ttl_cleanup": JobSpec(
        "ttl_cleanup",
        "write a new snapshot without the entries whose TTL expired",
        _ttl_arguments,
        _flink_aware("ttl_cleanup"),
    ),
    "compaction": JobSpec(
        "compaction",
        "fold a heap delta chain (or small canonical files) into one canonical checkpoint",
        _compaction_arguments,
        _runner_of("compaction"),
    ),
    "savepoint": JobSpec(
        "savepoint",
        "capture a relocatable canonical savepoint of any completed snapshot",
        _savepoint_arguments,
        _runner_of("savepoint"),
    ),
    "rescale": JobSpec(
        "rescale",
        "rescale a snapshot to a new parallelism (and max parallelism)",
        _rescale_arguments,
        _flink_aware("rescale"),
    ),
    "flink_rewrite": JobSpec(
        "flink_rewrite",
        "write a Flink savepoint from a Flink job's snapshot: rescale, TTL cleanup, state surgery",
        flink_rewrite_arguments,
        _runner_of("flink_rewrite"),
    ),
}


def add_job_parsers(subparsers: Any, handler: Callable[[argparse.Namespace], int]) -> None:
    """One subcommand per job, each with its own parameters and the run-id options."""
    for spec in JOBS.values():
        p = subparsers.add_parser(spec.name, help=spec.help, description=spec.help)
        spec.add_arguments(p)
        p.add_argument("--run-id", help="the run's id: the same id again never redoes a success")
        p.add_argument("--dag-id", help="Airflow DAG id (recorded with the run)")
        p.add_argument("--airflow-run-id", help="Airflow run id (recorded with the run)")
        p.add_argument("--task-id", help="Airflow task id (in the Spark application's name)")
        p.add_argument("--json", action="store_true", help="the report is JSON (it always is)")
        p.set_defaults(handler=handler, job_name=spec.name)


def job_params(args: argparse.Namespace) -> dict[str, Any]:
    skip = _NOT_PARAMS | (
        _CONVERSION_ONLY if getattr(args, "job_name", None) == "savepoint" else set()
    )
    return {k: v for k, v in vars(args).items() if k not in skip and v is not None}


def run_job(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parsed job on the maintenance SparkSession against the configured catalog."""
    from state_engine.catalog import Catalog
    from state_engine.jobs.spark import app_name, build_spark
    from state_engine.maintenance.preflight import check_before_spark

    settings = Settings.from_env()
    if args.job_name in ("expire", "orphan_cleanup"):
        # Jobs imported from Apache Flink are maintained in plain Python: no Spark starts.
        from state_engine.flink.retention import flink_runner, run_maintenance

        with Catalog.from_settings(settings) as catalog:
            if flink_runner(catalog, args.job_name, job_params(args)) is not None:
                return run_maintenance(catalog, args.job_name, settings, **job_params(args))
    if importlib.util.find_spec("pyspark") is None:
        # said before the catalog is asked anything: the [spark] extra is what is missing
        raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
    params = job_params(args)
    ids = {k: params.pop(k) for k in COMMON if k in params}
    if args.job_name in FLINK_REWRITES:
        # a Flink job's snapshot is rewritten into a Flink savepoint (jobs/flink_rewrite.py)
        from state_engine.jobs.flink_rewrite import run_flink_job

        flink_name = app_name(args.job_name, getattr(args, "job", None), dag_id=args.dag_id,
                              task_id=args.task_id, airflow_run_id=args.airflow_run_id)  # fmt: skip
        report = run_flink_job(args.job_name, params, ids, settings=settings, name=flink_name)
        if report is not None:
            return report
    with Catalog.from_settings(settings) as catalog:
        # refused before the JVM starts: a wrong name or id should not cost minutes of Spark
        params = check_before_spark(args.job_name, catalog, params, settings=settings, **ids)
    runner = JOBS[args.job_name].runner()
    name = app_name(
        args.job_name,
        getattr(args, "job", None),
        dag_id=args.dag_id,
        task_id=args.task_id,
        airflow_run_id=args.airflow_run_id,
    )
    spark = build_spark(settings, name=name)
    with Catalog.from_settings(settings) as catalog:
        return runner(spark, catalog, settings=settings, **ids, **params)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
