"""Session-wide fixtures: one SparkSession and at most one real Flink cluster per test session;
the catalog fixtures every folder shares come from the plugin ``tests/fixtures/catalog.py``.

Markers follow from the fixtures a test uses (:func:`pytest_collection_modifyitems`), so
``make test-fast`` can leave out what starts a JVM or a browser without each test saying so.
The same hook groups the tests for pytest-xdist (``--dist loadgroup``): every test of a module
that uses a session resource runs on the one worker that holds it, so each resource still
exists once per run; the other modules are spread over the workers a module at a time.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

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


#: what a run holds once, by the fixture a test asks for ("cluster": the services of every test
#: under tests/cluster/); the first of a group's resources here decides when it is scheduled:
#: the longest-running groups first, so no worker is left alone with one at the end
SESSION_RESOURCES = ("cluster", "flink_cluster", "spark", "airflow_home", "chromium_binary")
CLUSTER_TESTS = Path(__file__).parent / "cluster"


# tryfirst: the groups must be marked before pytest-xdist reads them in its own hook
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in used:
                item.add_marker(marker)
    group_by_resource(items)


def group_by_resource(items: list[pytest.Item]) -> None:
    """Mark each module's tests with one ``xdist_group``, the modules that share a session
    resource (directly or through another module) with the same one; put those groups first."""
    used_by: dict[Path, set[str]] = defaultdict(set)
    module_id: dict[Path, str] = {}
    for item in items:
        module_id.setdefault(item.path, item.nodeid.partition("::")[0])
        used = used_by[item.path]
        used.update(r for r in SESSION_RESOURCES if r in getattr(item, "fixturenames", ()))
        if CLUSTER_TESTS in item.path.parents:
            used.add("cluster")
    joined = {r: {r} for r in SESSION_RESOURCES}  # resource -> every resource in its group
    for used in used_by.values():
        merged = set().union(*(joined[r] for r in used))
        for r in merged:
            joined[r] = merged
    group_of: dict[Path, tuple[int, str]] = {}
    for path, used in used_by.items():
        if used:
            members = joined[next(iter(used))]
            rank = min(SESSION_RESOURCES.index(r) for r in members)
            group_of[path] = (rank, "+".join(sorted(members)))
        else:
            group_of[path] = (len(SESSION_RESOURCES), module_id[path])
    items.sort(key=lambda item: group_of[item.path][0])  # stable: modules keep their order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of[item.path][1]))


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
