"""Session-wide fixtures: one SparkSession and at most one real Flink cluster per test session;
the catalog fixtures every folder shares come from the plugin ``tests/fixtures/catalog.py``.

Markers follow from the fixtures a test uses (:func:`pytest_collection_modifyitems`), so
``make test-fast`` can leave out what starts a JVM or a browser without each test saying so.
The same hook groups the modules for pytest-xdist (``make test``: ``--dist loadgroup``,
tests/fixtures/xdist_groups.py): every module that uses a session resource runs on the one
worker that holds it, so each resource still exists once per run; the other modules are spread
over the workers a module at a time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from tests.fixtures import xdist_groups

if TYPE_CHECKING:
    from tests.fixtures.flink_cluster import FlinkCluster

pytest_plugins = ["tests.fixtures.catalog"]

# No wall-clock bound on a property test's examples (Hypothesis's default is 200 ms each): CI
# machines may be loaded several times over. Loaded before the test modules, so a test's own
# @settings (its example count) keep this too.
settings.register_profile("statekeeper", deadline=None)
settings.load_profile("statekeeper")

#: fixture -> the marker every test using it (directly or through another fixture) gets
MARKER_OF_FIXTURE = {
    "spark": "spark",  # the session's SparkSession (a JVM)
    "flink_cluster": "flink",  # a real Flink cluster (two JVMs)
    "chromium_binary": "browser",  # headless Chromium against a real Airflow
    "dag_of": "dag_run",  # tests/airflow: a DAG from its file, to run with dag.test()
    "health_dag": "dag_run",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in used:
                item.add_marker(marker)
    xdist_groups.publish(xdist_groups.group_modules(items))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        where = Path(tempfile.mkdtemp(prefix="sk-test-groups-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        os.environ[xdist_groups.GROUPS_FILE] = str(where / "groups.json")  # workers inherit it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the resource groups of tests/fixtures/xdist_groups.py."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    return xdist_groups.ResourceGroupScheduling(config, log)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("statekeeper-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def flink_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlinkCluster]:
    """A real Flink 2.3 cluster (see ``tests/fixtures/flink_cluster.py``), started on first use."""
    from tests.fixtures.flink_cluster import flink_cluster_at

    with flink_cluster_at(tmp_path_factory.mktemp("flink-cluster")) as cluster:
        yield cluster
