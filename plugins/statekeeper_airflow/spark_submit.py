"""Where a maintenance job's Spark driver runs, decided by the ``spark_default`` connection.

* No connection, or one whose master is ``local``/``local[n]``/``local[*]``: **in-process**. The
  task itself is the driver on a local SparkSession, as ``@task.pyspark(conn_id=None)`` does; an
  already active session (a test's, another task's in the same process) is reused, never stopped.
* A master that names a cluster (``spark://host:7077``, ``k8s://https://...``, ``yarn``):
  **spark-submit** of ``state_engine/jobs/__main__.py NAME --param ...`` through the provider's
  ``SparkSubmitHook``. The hook itself falls back to ``yarn`` when the connection is missing;
  :func:`spark_target` decides before the hook is built, so that fallback is never reached.
* Spark Connect (``sc://``) is refused: the jobs use the classic API (``SparkContext``).

The master is read from the connection with the provider's own rule (see :func:`master_of`), so
the decision and the submitted ``--master`` always agree.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"
_LOCAL_RE = re.compile(r"local(\[(\*|\d+)(,\s*\d+)?\])?")
# passed to the driver so that it opens the same catalog and storage as the Airflow worker
FORWARDED_ENV = (
    "STATEKEEPER_HOME",
    "STATEKEEPER_CATALOG_URL",
    "STATEKEEPER_CHECKPOINT_ROOT",
    "STATEKEEPER_SPARK_MASTER",
)


class SparkModeError(ValueError):
    """A Spark connection the maintenance jobs cannot run on (e.g. Spark Connect)."""


@dataclass(frozen=True)
class SparkTarget:
    """Where the driver runs: ``local`` (in this process, on ``master``) or ``cluster``."""

    mode: str
    master: str
    conn_id: str | None
    reason: str
    deploy_mode: str | None = None

    @property
    def in_process(self) -> bool:
        return self.mode == "local"


def master_of(conn_type: str | None, host: str | None, port: int | None) -> str:
    """The Spark master of a connection, by the rule of ``SparkSubmitHook._resolve_connection``:
    a ``spark`` connection whose host holds a URL (or has no port) uses the host as is; any
    other connection is ``<conn_type>://<host>``; a port is appended."""
    if conn_type == "spark" and host and ("://" in host or not port):
        master = host
    else:
        master = f"{conn_type}://{host or ''}"
    return f"{master}:{port}" if port else master


def is_local_master(master: str) -> bool:
    return _LOCAL_RE.fullmatch(master.strip()) is not None


def spark_target(conn_id: str | None = DEFAULT_CONN_ID) -> SparkTarget:
    """Decide local vs cluster from the connection (looked up explicitly; missing -> local)."""
    if not conn_id:
        return SparkTarget("local", LOCAL_MASTER, None, "no Spark connection configured")
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return SparkTarget(
            "local", LOCAL_MASTER, None, f"no connection {conn_id!r}: in-process {LOCAL_MASTER}"
        )
    deploy_mode = conn.extra_dejson.get("deploy-mode")
    return target_for(conn_id, conn.conn_type, conn.host, conn.port, deploy_mode)


def target_for(
    conn_id: str,
    conn_type: str | None,
    host: str | None,
    port: int | None,
    deploy_mode: str | None = None,
) -> SparkTarget:
    master = master_of(conn_type, host, port)
    if conn_type == "spark_connect" or master.startswith("sc://"):
        raise SparkModeError(
            f"connection {conn_id!r} points at Spark Connect ({master}); the maintenance jobs need "
            "a classic Spark master: set its host to local[*], spark://HOST:7077, "
            "k8s://https://HOST or yarn"
        )
    if not host and conn_type == "spark":
        return SparkTarget("local", LOCAL_MASTER, conn_id, f"connection {conn_id!r} has no host")
    if is_local_master(master):
        return SparkTarget("local", master, conn_id, f"connection {conn_id!r} is {master}")
    return SparkTarget(
        "cluster", master, conn_id, f"connection {conn_id!r} is {master}", deploy_mode
    )


def local_session(master: str, app_name: str) -> tuple[SparkSession, bool]:
    """The SparkSession to run in-process on, and whether this call started it.

    An existing session is reused as is (a second session in one JVM would fight over the same
    context, and its static settings could not change anyway); only a session started here is
    the caller's to stop.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if SparkContext._active_spark_context is not None:
        # a session started on another thread: getActiveSession is per thread, the context is not
        return SparkSession.builder.getOrCreate(), False
    from state_engine.jobs.spark import build_spark

    return build_spark(master=master, name=app_name), True


# --- spark-submit ---


def application_path() -> str:
    """The spark-submit application: ``state_engine/jobs/__main__.py`` as installed here."""
    import state_engine.jobs

    return str(Path(state_engine.jobs.__file__).with_name("__main__.py"))


def job_parser(kind: str) -> argparse.ArgumentParser:
    """The command line of job ``kind`` (the same parser ``python -m state_engine.jobs`` uses)."""
    from state_engine.jobs.commands import JOBS

    spec = JOBS[kind]
    parser = argparse.ArgumentParser(prog=f"python -m state_engine.jobs {kind}", add_help=False)
    spec.add_arguments(parser)
    return parser


def param_names(kind: str) -> list[str]:
    return sorted(a.dest for a in job_parser(kind)._actions if a.option_strings)


def application_args(
    kind: str,
    params: Mapping[str, Any],
    *,
    run_id: str,
    dag_id: str,
    airflow_run_id: str,
    task_id: str | None = None,
) -> list[str]:
    """``NAME --option value ...`` for spark-submit, built from the job's own parser so that
    option names (``savepoints`` is ``--savepoint``), flags and repeated options come out right."""
    actions = {a.dest: a for a in job_parser(kind)._actions if a.option_strings}
    args = [kind]
    for name, value in params.items():
        if value is None:
            continue
        action = actions.get(name)
        if action is None:
            raise KeyError(name)
        option = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                args.append(option)
        elif isinstance(action, argparse._AppendAction):
            for item in value if isinstance(value, list | tuple) else [value]:
                args += [option, str(item)]
        elif value is True and action.nargs == "?":
            args.append(option)  # e.g. --wait with its default wait time
        elif value is not False:
            args += [option, str(value)]
    args += ["--run-id", run_id, "--dag-id", dag_id, "--airflow-run-id", airflow_run_id]
    if task_id:
        args += ["--task-id", task_id]
    return args


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in FORWARDED_ENV if environ.get(k)}


def submit_hook(
    target: SparkTarget,
    kind: str,
    args: list[str],
    *,
    name: str,
    conf: Mapping[str, str] | None,
    env: Mapping[str, str],
    submit_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """The provider's SparkSubmitHook for one job run (built only for a cluster target)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    if target.in_process or target.conn_id is None:
        raise SparkModeError(f"{kind}: spark-submit needs a cluster connection ({target.reason})")
    if target.master.startswith("spark://") and target.deploy_mode == "cluster":
        # the provider cannot hand environment variables to a standalone-cluster driver: the
        # workers must carry STATEKEEPER_* themselves (spark-env.sh)
        env = {}
    return SparkSubmitHook(
        conn_id=target.conn_id,
        conf=dict(conf or {}),
        name=name,
        application_args=args,
        env_vars=dict(env) or None,
        **dict(submit_kwargs or {}),
    )
