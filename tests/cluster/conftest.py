"""The session's cluster: S3 (moto), a Spark standalone master with two 1-core workers, the catalog
and Airflow's metadata on PostgreSQL, and Airflow's scheduler, DAG processor and API server.

Started once per test session, on free ports of 127.0.0.1, stopped by PID at the end; see
``sk_cluster.py``. Every test under this folder is marked ``cluster``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.sk_cluster import (
    AirflowDeployment,
    S3Endpoint,
    SparkCluster,
    airflow_env,
    base_env,
    free_port,
    start_airflow,
    start_s3,
    start_spark,
)

HERE = Path(__file__).parent
# What stops the running stack: the session fixtures register here, and the stack is stopped as
# soon as the last test of this folder is done (not at the end of the session), so its daemons
# do not take CPU from the rest of the suite. Stopping twice is harmless.
_STOPS: list[Callable[[], None]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    leaving = HERE in Path(str(item.fspath)).parents and (
        nextitem is None or HERE not in Path(str(nextitem.fspath)).parents
    )
    if leaving:
        while _STOPS:
            _STOPS.pop()()


def stack_env(workdir: Path, s3: S3Endpoint, catalog_url: str) -> dict[str, str]:
    """What a driver or a stream job on this stack is given (as the compose services are)."""
    return {
        **s3.env,
        "STATEKEEPER_CATALOG_URL": catalog_url,
        "STATEKEEPER_CHECKPOINT_ROOT": f"s3://{s3.bucket}/checkpoints",
        "STATEKEEPER_HOME": str(workdir / "statekeeper-home"),
    }


@dataclass
class Stack:
    workdir: Path
    s3: S3Endpoint
    catalog_url: str
    spark: SparkCluster

    @property
    def env(self) -> dict[str, str]:
        return stack_env(self.workdir, self.s3, self.catalog_url)

    @property
    def checkpoint_root(self) -> str:
        return self.env["STATEKEEPER_CHECKPOINT_ROOT"]


@pytest.fixture(scope="session")
def cluster_dir() -> Iterator[Path]:
    """Logs and work directories; kept when a test failed, so the logs can be read."""
    path = Path(tempfile.mkdtemp(prefix="sk-cluster-"))
    yield path
    if os.environ.get("STATEKEEPER_KEEP_CLUSTER_LOGS") != "1":
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(cluster_dir: Path, make_pg_database: Callable[[], str]) -> Iterator[Stack]:
    s3 = start_s3(cluster_dir)
    try:
        catalog_url = make_pg_database()
        done = subprocess.run(
            [str(Path(sys.executable).with_name("statectl")), "catalog", "upgrade"],
            env=base_env({"STATEKEEPER_CATALOG_URL": catalog_url}),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        spark = start_spark(cluster_dir, stack_env(cluster_dir, s3, catalog_url))
    except BaseException:
        s3.service.stop()
        raise
    stack = Stack(cluster_dir, s3, catalog_url, spark)
    _STOPS.extend([s3.service.stop, spark.stop])  # popped last-first: Spark, then S3
    yield stack
    spark.stop()
    s3.service.stop()


@pytest.fixture(scope="session")
def airflow(
    stack: Stack, cluster_dir: Path, make_pg_database: Callable[[], str]
) -> Iterator[AirflowDeployment]:
    db = make_pg_database()
    env = airflow_env(
        cluster_dir / "airflow",
        db_url=db,
        port=free_port(),
        spark_master_url=stack.spark.master_url,
        extra=stack.env,
    )
    deployment = start_airflow(cluster_dir / "airflow", env)
    _STOPS.append(deployment.stop)
    yield deployment
    deployment.stop()
