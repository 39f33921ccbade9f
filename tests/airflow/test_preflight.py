"""Refusals before Spark: each bad input fails the task at once (AirflowFailException, no
retry), no Spark session is started; the catalog records the FAILED run with its job and task
when the job's state refused it, and nothing when its arguments did (an unknown job, a bad
parameter); a retry of a run reads the input snapshot its first attempt read."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from tests.airflow.sk_airflow_support import DAGS


class SparkStarted(AssertionError):
    """Raised by the patched session factories: a refusal came too late."""


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every Spark session factory the operator and statectl use, patched to record and fail."""
    import statekeeper_airflow.operators as operators

    import state_engine.jobs.spark as spark

    started: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        started.append(repr(args))
        raise SparkStarted("a Spark session was started before the inputs were refused")

    monkeypatch.setattr(operators, "local_session", refuse)
    monkeypatch.setattr(operators, "submit_hook", refuse)
    monkeypatch.setattr(spark, "build_spark", refuse)
    return started


@pytest.fixture
def cat_env(
    catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """Job ``orders`` (max p 128): COMPLETED canonical chk-1, COMPLETED native chk-2, PENDING
    chk-3. Job ``payments``: COMPLETED canonical chk-1."""
    root = (tmp_path / "checkpoints").as_uri()
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", root)
    monkeypatch.delenv("STATEKEEPER_ALLOWED_SAVEPOINT_DIRS", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    ids: dict[str, Any] = {"url": catalog_url, "root": root}
    with Catalog.open(catalog_url) as cat:
        cat.register_job("orders", max_parallelism=128, location=f"{root}/orders")
        cat.register_job("payments", max_parallelism=128, location=f"{root}/payments")
        for name, job, fmt in (
            ("canonical", "orders", "CANONICAL"),
            ("native", "orders", "NATIVE"),
            ("other", "payments", "CANONICAL"),
        ):
            snap = cat.begin_snapshot(
                job, location=f"{root}/{job}/{name}", parallelism=2, format=fmt
            )
            ids[name] = cat.complete_snapshot(snap.id, snap.version).id
        ids["pending"] = cat.begin_snapshot("orders", location=f"{root}/orders/p", parallelism=2).id
    yield ids


def context(task_id: str = "t") -> dict[str, Any]:
    ti = types.SimpleNamespace(dag_id="sk_dag", run_id="manual__1", task_id=task_id, map_index=-1)
    return {"ti": ti}


#: (kind, job, params, message, the job the FAILED run is recorded with; None: not recorded)
REFUSALS: list[
    tuple[str, str | None, Callable[[dict[str, Any]], dict[str, Any]], str, str | None]
] = [
    ("savepoint", "no-such-job", lambda ids: {}, r"job 'no-such-job' is not in the catalog", None),
    (
        "savepoint",
        "orders",
        lambda ids: {"snapshot": ids["other"]},
        r"belongs to job 'payments', not 'orders'",
        None,
    ),
    (
        "ttl_cleanup",
        "orders",
        lambda ids: {"snapshot": ids["pending"]},
        r"is PENDING, not COMPLETED",
        "orders",
    ),
    ("ttl_cleanup", "orders", lambda ids: {}, r"is NATIVE; ttl_cleanup reads CANONICAL", "orders"),
    (
        "rescale",
        "orders",
        lambda ids: {"snapshot": ids["canonical"], "parallelism": 129},
        r"parallelism 129 is above the max parallelism 128",
        None,
    ),
    (
        "rescale",
        "orders",
        lambda ids: {"parallelism": 3},
        r"NATIVE; rescale reads CANONICAL",
        "orders",
    ),
    (
        "savepoint",
        "orders",
        lambda ids: {"savepoint_dir": "file:///tmp/elsewhere/sp"},
        r"outside job 'orders'.s storage roots",
        None,
    ),
    (
        "savepoint",
        "orders",
        lambda ids: {"savepoint_dir": "../payments/sp"},
        r"escapes|outside|\.\.",
        None,
    ),
    ("expire", "no-such-job", lambda ids: {"retain_last": 2}, r"not in the catalog", None),
    ("savepoint", "bad\njob", lambda ids: {}, r"unprintable characters", None),
    ("savepoint", "orders", lambda ids: {"snapshot": 1 << 63}, r"out of range", None),
]


@pytest.mark.parametrize(("kind", "job", "params", "message", "recorded_job"), REFUSALS)
def test_a_refusal_fails_the_task_at_once_before_spark_and_is_recorded_with_its_job(
    cat_env: dict[str, Any],
    no_spark: list[str],
    kind: str,
    job: str | None,
    params: Callable[[dict[str, Any]], dict[str, Any]],
    message: str,
    recorded_job: str | None,
) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from statekeeper_airflow.operators import run_maintenance

    with pytest.raises(AirflowFailException, match=message):
        run_maintenance(kind, job, params(cat_env), context(), emit=False)

    assert no_spark == []
    with Catalog.open(cat_env["url"]) as cat:
        runs = cat.list_runs(kind=kind)
    if recorded_job is None:  # an argument error is not a run
        assert runs == []
        return
    [run] = runs
    assert (run.status, run.job, run.dag_id, run.airflow_run_id, run.task_id) == (
        "FAILED",
        recorded_job,
        "sk_dag",
        "manual__1",
        "t",
    )
    assert run.error and len(run.error) > 20


def test_an_allow_listed_savepoint_dir_passes_the_checks(
    cat_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from state_engine.config import Settings
    from state_engine.maintenance.preflight import check_before_spark

    target = (tmp_path / "backups" / "sp-1").as_uri()
    with Catalog.open(cat_env["url"]) as cat:
        with pytest.raises(Exception, match="outside"):
            check_before_spark("savepoint", cat, {"job": "orders", "savepoint_dir": target})
        monkeypatch.setenv("STATEKEEPER_ALLOWED_SAVEPOINT_DIRS", (tmp_path / "backups").as_uri())
        params = check_before_spark(
            "savepoint",
            cat,
            {"job": "orders", "savepoint_dir": target},
            settings=Settings.from_env(),
        )
        # inside the job's own root needs no allow-list
        inside = check_before_spark("savepoint", cat, {"job": "orders", "savepoint_dir": "o/sp"})
    # the latest completed snapshot is made explicit: the run's input is fixed from here on
    assert params["snapshot"] == inside["snapshot"] == cat_env["native"]


def test_a_retry_reads_the_input_snapshot_of_its_first_attempt(cat_env: dict[str, Any]) -> None:
    from state_engine.jobs.spark_job import maintenance_job
    from state_engine.maintenance.inputs import resolve_input
    from state_engine.maintenance.preflight import check_before_spark
    from state_engine.maintenance.run import JobResult

    seen: list[int] = []

    def body(spark: Any, catalog: Catalog, ctx: Any, *, snapshot: int, **_: Any) -> JobResult:
        seen.append(snapshot)
        if len(seen) == 1:
            raise OSError("storage went away")  # a failure a retry may fix
        return JobResult()

    run = maintenance_job("savepoint", resolve_input)(body)
    with Catalog.open(cat_env["url"]) as cat:
        with pytest.raises(Exception, match="storage went away"):
            run(None, cat, run_id="r-1", job="orders")
        # a newer snapshot completes between the attempts
        snap = cat.begin_snapshot("orders", location=f"{cat_env['root']}/orders/new", parallelism=2)
        cat.complete_snapshot(snap.id, snap.version)
        assert (
            check_before_spark("savepoint", cat, {"job": "orders"}, run_id="r-1")["snapshot"]
            == (cat_env["native"])
        )
        run(None, cat, run_id="r-1", job="orders")
        assert cat.get_run("r-1").status == "SUCCEEDED"
        # a task retried after its run succeeded passes (its report is returned), even though
        # its input is no longer usable
        pending_input = cat.begin_snapshot("orders", location="file:///x", parallelism=1)
        cat.start_run("r-2", "ttl_cleanup", job="orders", input_snapshot_id=pending_input.id)
        cat.finish_run("r-2")
        assert check_before_spark("ttl_cleanup", cat, {"job": "orders"}, run_id="r-2") == {
            "job": "orders",
            "snapshot": pending_input.id,
        }
    assert seen == [cat_env["native"], cat_env["native"]]


def test_statectl_maintain_refuses_before_spark(
    cat_env: dict[str, Any], no_spark: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from state_engine.cli import main

    code = main(["maintain", "rescale", "--job", "orders", "--parallelism", "500", "--snapshot",
                 str(cat_env["canonical"])])  # fmt: skip

    assert code != 0 and no_spark == []
    assert "above the max parallelism 128" in capsys.readouterr().err
    with Catalog.open(cat_env["url"]) as cat:
        assert cat.list_runs(job="orders", kind="rescale") == []  # an argument error: no run


@pytest.mark.dag_run
def test_the_rescale_dag_fails_at_once_without_retry_or_spark(
    airflow_home: Path, cat_env: dict[str, Any], no_spark: list[str]
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "statekeeper_rescale.py"))
    dagrun = bag.dags["statekeeper_rescale"].test(
        run_conf={"job": "orders", "parallelism": 3}  # its latest snapshot is NATIVE
    )

    assert dagrun.state == "failed"
    [ti] = dagrun.get_task_instances()
    assert (ti.state, ti.try_number) == ("failed", 1)  # the DAG's retries=1 was not used
    assert no_spark == []
    with Catalog.open(cat_env["url"]) as cat:
        [run] = cat.list_runs(job="orders", kind="rescale")
    assert (run.status, run.dag_id, run.airflow_run_id, run.task_id) == (
        "FAILED",
        "statekeeper_rescale",
        dagrun.run_id,
        "rescale",
    )
