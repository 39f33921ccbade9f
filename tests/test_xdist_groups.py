"""How ``make test`` spreads the suite over pytest-xdist workers (tests/fixtures/xdist_groups.py):
the modules sharing a session resource form one group, which the scheduler keeps together."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fixtures import xdist_groups
from tests.fixtures.xdist_groups import CLUSTER_TESTS, group_modules

TESTS = Path(__file__).parent


def item(nodeid: str, *fixtures: str) -> Any:
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), path=TESTS.parent / nodeid)


def test_modules_sharing_a_resource_form_one_group_scheduled_first() -> None:
    items = [
        item("tests/a/test_plain.py::test_one", "tmp_path"),
        item("tests/airflow/test_dags.py::test_run", "airflow_home", "spark"),
        item("tests/airflow/test_pages.py::test_page", "airflow_home"),
        item("tests/jobs/test_job.py::test_local", "tmp_path"),
        item("tests/jobs/test_job.py::test_spark", "spark"),
        item("tests/cluster/test_path.py::test_dag"),
        item("tests/flink/test_real.py::test_restore", "flink_cluster"),
        item("tests/a/test_plain.py::test_two"),
    ]
    assert CLUSTER_TESTS == TESTS / "cluster"
    groups = group_modules(items)
    assert groups == {
        "tests/a/test_plain.py": "tests/a/test_plain.py",
        "tests/airflow/test_dags.py": "airflow_home+spark",
        "tests/airflow/test_pages.py": "airflow_home+spark",
        "tests/jobs/test_job.py": "airflow_home+spark",  # one test uses spark: the whole module
        "tests/cluster/test_path.py": "cluster",
        "tests/flink/test_real.py": "flink_cluster",
    }
    # resource groups first, in SESSION_RESOURCES order; modules keep their order and stay whole
    assert [i.nodeid for i in items] == [
        "tests/cluster/test_path.py::test_dag",
        "tests/flink/test_real.py::test_restore",
        "tests/airflow/test_dags.py::test_run",
        "tests/airflow/test_pages.py::test_page",
        "tests/jobs/test_job.py::test_local",
        "tests/jobs/test_job.py::test_spark",
        "tests/a/test_plain.py::test_one",
        "tests/a/test_plain.py::test_two",
    ]


def test_the_scheduler_takes_a_modules_group_from_the_published_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "groups.json"
    monkeypatch.setenv(xdist_groups.GROUPS_FILE, str(target))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    xdist_groups.publish({"tests/jobs/test_job.py": "airflow_home+spark"})
    assert json.loads(target.read_text()) == {"tests/jobs/test_job.py": "airflow_home+spark"}
    scheduler = object.__new__(xdist_groups.ResourceGroupScheduling)
    assert scheduler._split_scope("tests/jobs/test_job.py::test_spark[x]") == "airflow_home+spark"
    assert scheduler._split_scope("tests/other.py::test_x") == "tests/other.py"
