"""The catalog health DAG, run with dag.test() on the session's Airflow home."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.sk_airflow_support import DAGS, Seeded

DAG_ID = "statekeeper_catalog_health"


@pytest.fixture(scope="module")
def health_dag(airflow_home: Path) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{DAG_ID}.py"))
    assert bag.import_errors == {}
    return bag.dags[DAG_ID]


def task_states(dagrun: Any) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dagrun.get_task_instances()}


def returned(dagrun: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(
            run_id=dagrun.run_id, key="return_value", dag_ids=dagrun.dag_id, task_ids=task_id
        ).with_only_columns(XComModel.value)
        row = session.execute(query).first()
    assert row is not None, f"{task_id} returned nothing"
    return XComModel.deserialize_value(row)


def test_reports_latest_snapshots_and_stale_pending_commits(
    health_dag: Any, seeded_catalog: Seeded, catalog_env: Callable[[str], None]
) -> None:
    catalog_env(seeded_catalog.url)

    dagrun = health_dag.test(run_conf={"stale_pending_minutes": 30})

    assert dagrun.state == "success", task_states(dagrun)
    report = returned(dagrun, "report")
    assert report["catalog"] == seeded_catalog.url
    assert report["stale_pending_after_seconds"] == 1800
    assert [j["job"] for j in report["jobs"]] == ["orders", "payments"]
    orders, payments = report["jobs"]
    assert orders["latest_completed"]["snapshot_id"] == seeded_catalog.completed_id
    assert orders["latest_completed"]["checkpoint_id"] == 2
    # Completed an hour ago (by the catalog's clock): the age says so, give or take the test.
    assert 3600 <= orders["latest_completed"]["age_seconds"] < 3600 + 600
    assert orders["pending"] == 2
    assert [p["snapshot_id"] for p in orders["stale_pending"]] == [seeded_catalog.stale_pending_id]
    assert 7200 <= orders["stale_pending"][0]["age_seconds"] < 7200 + 600
    assert payments == {
        "job": "payments",
        "latest_completed": None,
        "pending": 0,
        "stale_pending": [],
    }
    assert report["jobs_without_completed_snapshot"] == ["payments"]
    assert report["stale_pending_total"] == 1


def test_the_threshold_param_decides_what_is_stale(
    health_dag: Any, seeded_catalog: Seeded, catalog_env: Callable[[str], None]
) -> None:
    catalog_env(seeded_catalog.url)

    dagrun = health_dag.test(run_conf={"stale_pending_minutes": 180})

    assert dagrun.state == "success", task_states(dagrun)
    assert returned(dagrun, "report")["stale_pending_total"] == 0


def test_fails_without_retrying_on_a_catalog_that_was_never_migrated(
    health_dag: Any,
    tmp_path: Path,
    catalog_env: Callable[[str], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    catalog_env(f"sqlite:///{tmp_path / 'never-migrated.db'}")

    dagrun = health_dag.test()

    assert dagrun.state == "failed"
    states = task_states(dagrun)
    assert states == {"check_catalog": "failed", "report": "upstream_failed"}
    # Airflow's task logger writes the failure to stdout in dag.test(); the message must say
    # what is wrong and what to do.
    out = capsys.readouterr().out
    assert "never-migrated.db has no schema yet" in out
    assert "run `statectl catalog upgrade`" in out
