"""The SparkSession the maintenance jobs run on: its settings, its name, its master.

Which storage URLs its executors reach is :mod:`state_engine.maintenance.reachable`.
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from state_engine.config import Settings
from state_engine.errors import (
    ConfigurationError,
    InvalidJobParams,
    SparkMasterUnreachable,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "statekeeper-maintenance"
# Spark's default split size: a shuffle partition of this much data keeps a task busy for seconds,
# not milliseconds, and still fits an executor's memory comfortably.
TARGET_PARTITION_BYTES = 128 << 20


def app_name(
    kind: str | None = None,
    job: str | None = None,
    *,
    dag_id: str | None = None,
    task_id: str | None = None,
    airflow_run_id: str | None = None,
) -> str:
    """The Spark application name of one maintenance run, as the master's UI lists it.

    ``statekeeper-<kind>-<job>``, then ``[<dag>.<task> <run>]`` when Airflow runs it, so a row of
    the master's application list says which job, which maintenance and which DAG task it was.
    """
    parts = ["statekeeper", *(p for p in (kind, job) if p)]
    name = "-".join(parts) if len(parts) > 1 else APP_NAME
    airflow = ".".join(p for p in (dag_id, task_id) if p)
    if airflow or airflow_run_id:
        name += f" [{' '.join(p for p in (airflow, airflow_run_id) if p)}]"
    # control characters would garble the UI and spark-submit's --name argument
    return "".join(c if c.isprintable() else "?" for c in name)[:200]


def submitted_settings() -> dict[str, str]:
    """``spark.master`` and ``spark.app.name`` as spark-submit gave them to this driver.

    Empty when this Python process was not launched by spark-submit. Without ``--name`` Spark
    names a Python application after its file (``__main__.py``), which tells nobody anything:
    that counts as no name.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        return {}
    from pyspark import SparkConf, SparkContext

    # Only a conf bound to the JVM sees spark-submit's settings (its system properties); under
    # spark-submit that JVM is already running and this connects to it.
    SparkContext._ensure_initialized()
    conf = SparkConf()
    given = {k: conf.get(k, None) for k in ("spark.master", "spark.app.name")}
    if (given["spark.app.name"] or "").endswith(".py"):
        given["spark.app.name"] = None
    return {k: v for k, v in given.items() if v}


def check_master_reachable(master: str, timeout_s: float = 10.0) -> None:
    """A standalone master (``spark://h1:p1,h2:p2``) that accepts no connection fails now.

    Spark itself would retry registering for about a minute and then stop with "All masters
    are unresponsive"; a refused connection says the same at once, with what to check.
    """
    if not master.startswith("spark://"):
        return
    errors = []
    for hostport in master.removeprefix("spark://").split(","):
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host or hostport, int(port or 7077)), timeout_s):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{hostport}: {exc}")
    raise SparkMasterUnreachable(
        f"Spark master {master} is unreachable ({'; '.join(errors)}); check that the master "
        "runs and the URL (STATEKEEPER_SPARK_MASTER, or the spark_default connection in Airflow)"
    )


def local_cores(master: str) -> int | None:
    """The cores of a ``local``/``local[n]``/``local[*]`` master; None for a cluster."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if m is None:
        return None
    if m.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))


def shuffle_partitions_for(data_bytes: int | None, cores: int) -> int:
    """Enough partitions to keep every core busy twice over, and none above ~128 MiB."""
    by_cores = max(1, 2 * cores)
    if not data_bytes:
        return by_cores
    return max(by_cores, math.ceil(data_bytes / TARGET_PARTITION_BYTES))


def min_tasks(spark: SparkSession, given: int | None) -> int:
    """How many Spark tasks a job cuts its work into at least: ``given``, else two per core."""
    if given is not None:
        if isinstance(given, bool) or int(given) < 1:
            raise InvalidJobParams(f"tasks must be >= 1, not {given!r}")
        return int(given)
    return max(1, 2 * spark.sparkContext.defaultParallelism)


def spark_conf(
    settings: Settings | None = None,
    *,
    master: str | None = None,
    data_bytes: int | None = None,
    ui: bool = False,
    extra: dict[str, str] | None = None,
    name: str | None = None,
) -> dict[str, str]:
    """The configuration a maintenance session starts with (``spark.master`` included)."""
    settings = settings or Settings.from_env()
    master = (master or settings.spark_master).strip()
    if not master:
        raise ConfigurationError(
            "STATEKEEPER_SPARK_MASTER is empty; use 'local[*]' or a cluster URL such as "
            "'spark://host:7077'"
        )
    cores = local_cores(master) or 8
    conf = {
        "spark.master": master,
        "spark.app.name": name or APP_NAME,
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "16384",
        "spark.sql.shuffle.partitions": str(shuffle_partitions_for(data_bytes, cores)),
        "spark.sql.session.timeZone": "UTC",
        # the jobs keep their own files; Spark's _SUCCESS markers would be noise in snapshot dirs
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    }
    if any(s in (settings.checkpoint_root or "") for s in ("s3://", "s3a://")):
        conf["spark.hadoop.fs.s3a.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    conf.update(extra or {})
    return conf


def build_spark(
    settings: Settings | None = None,
    *,
    master: str | None = None,
    data_bytes: int | None = None,
    ui: bool = False,
    extra: dict[str, str] | None = None,
    name: str | None = None,
) -> SparkSession:
    """The active SparkSession, or a new one configured by :func:`spark_conf`.

    An already running session (a test's) is returned as is: its static settings cannot change,
    and a second session in one JVM would fight it for the same context. Under spark-submit its
    ``--master`` and ``--name`` win over the settings and ``name``.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder: Any = SparkSession.builder
    # spark-submit's --master and --name win over the settings: the operator chose them
    submitted = submitted_settings()
    master = submitted.get("spark.master", master)
    name = submitted.get("spark.app.name", name)
    check_master_reachable((master or (settings or Settings.from_env()).spark_master).strip())
    for key, value in spark_conf(
        settings, master=master, data_bytes=data_bytes, ui=ui, extra=extra, name=name
    ).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def quiet_spark_conf() -> dict[str, str]:
    """Spark conf that keeps the driver's log4j below ERROR (no WARN lines around the table)."""
    path = os.path.join(tempfile.gettempdir(), "statekeeper-log4j2-quiet.properties")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(
                "rootLogger.level = error\n"
                "rootLogger.appenderRef.stderr.ref = console\n"
                "appender.console.type = Console\n"
                "appender.console.name = console\n"
                "appender.console.target = SYSTEM_ERR\n"
                "appender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
            )
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}"}
