"""A run's history says who ran it and what it did: the Airflow task instance (DAG id, DAG run id,
task id), DRY_RUN for a run that changed nothing, and no record at all for a run refused for its
arguments before it touched anything. Through :func:`recorded_run`, the wrapper every maintenance
job runs in, with bodies of its own."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from state_engine.catalog import Catalog
from state_engine.errors import (
    InvalidCatalogInput,
    InvalidJobParams,
    MaintenanceJobFailed,
    NoSuchJob,
    NoSuchRun,
    RetentionRemovesEverything,
)
from state_engine.maintenance.deletion import resolve_job
from state_engine.maintenance.run import JobResult, RunContext, recorded_run

AIRFLOW = {"dag_id": "statekeeper_maintenance", "airflow_run_id": "manual__1", "task_id": "t.x"}


def body(catalog: Catalog, ctx: RunContext, **params: Any) -> JobResult:
    """Raises what ``params['fail']`` names; otherwise reports one byte out."""
    fail = params.get("fail")
    if fail == "args":
        raise InvalidJobParams("retain_last 0 is out of range: keep at least one")
    if fail == "everything":
        raise RetentionRemovesEverything("retain_last=0 would remove every checkpoint")
    if fail == "storage":
        raise OSError("disk gone")
    return JobResult(bytes_out=0 if params.get("dry_run") else 1, stats={"done": True})


run = recorded_run("expire", resolve_job)(body)


@pytest.fixture
def job(catalog: Catalog) -> str:
    catalog.register_job("orders", max_parallelism=8)
    return "orders"


def test_a_run_records_its_airflow_task_instance(catalog: Catalog, job: str) -> None:
    report = run(catalog, run_id="r1", job=job, **AIRFLOW)
    record = catalog.get_run("r1")
    assert (record.dag_id, record.airflow_run_id, record.task_id) == tuple(AIRFLOW.values())
    assert record.status == report["status"] == "SUCCEEDED"
    assert report["trigger"].startswith("run-") and report["task_id"] == "t.x"
    with catalog.engine.connect() as conn:
        row = conn.execute(
            text("SELECT task_id, dag_id FROM sk_v_maintenance_history WHERE run_id = 'r1'")
        ).one()
    assert tuple(row) == ("t.x", "statekeeper_maintenance")


def test_a_dry_run_is_recorded_dry_run_not_succeeded(catalog: Catalog, job: str) -> None:
    report = run(catalog, run_id="dry", job=job, dry_run=True)
    run(catalog, run_id="real", job=job)
    assert report["status"] == "DRY_RUN" and catalog.get_run("dry").status == "DRY_RUN"
    assert [r.run_id for r in catalog.list_runs(status="DRY_RUN")] == ["dry"]
    assert [r.run_id for r in catalog.list_runs(status="SUCCEEDED")] == ["real"]
    # the same id run for real afterwards is another attempt, not skipped as done
    again = run(catalog, run_id="dry", job=job)
    assert again["status"] == "SUCCEEDED" and not again.get("skipped")
    assert catalog.get_run("dry").attempts == 2


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"job": "no-such-job"}, NoSuchJob),
        ({}, InvalidJobParams),
        ({"job": "orders", "fail": "args"}, InvalidJobParams),
        ({"job": "orders", "fail": "everything"}, RetentionRemovesEverything),
    ],
)
def test_an_argument_error_is_not_recorded(
    catalog: Catalog, job: str, params: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        run(catalog, run_id="bad", **params, **AIRFLOW)
    with pytest.raises(NoSuchRun):
        catalog.get_run("bad")
    assert catalog.list_runs() == []


def test_other_failures_are_recorded_and_a_retry_keeps_its_history(
    catalog: Catalog, job: str
) -> None:
    with pytest.raises(MaintenanceJobFailed, match="disk gone"):
        run(catalog, run_id="r", job=job, fail="storage", **AIRFLOW)
    failed = catalog.get_run("r")
    assert (failed.status, failed.task_id) == ("FAILED", "t.x") and "disk gone" in (
        failed.error or ""
    )
    # an argument error on a later attempt of a recorded run does not erase it
    with pytest.raises(InvalidJobParams):
        run(catalog, run_id="r", job=job, fail="args")
    assert catalog.get_run("r").status == "FAILED" and catalog.get_run("r").attempts == 2


def test_the_status_column_takes_dry_run_and_nothing_else(catalog: Catalog, job: str) -> None:
    catalog.start_run("x", "expire", job=job)
    catalog.finish_run("x", dry_run=True)
    assert catalog.get_run("x").status == "DRY_RUN"
    with pytest.raises(Exception, match="(?i)check|constraint"), catalog.engine.begin() as conn:
        conn.execute(text("UPDATE sk_maintenance_runs SET status = 'BOGUS' WHERE run_id = 'x'"))
    with pytest.raises(InvalidCatalogInput, match="task_id"):
        catalog.start_run("y", "expire", job=job, task_id="")
