"""The operators' decisions that need no Spark: local vs cluster by the Spark connection, the
spark-submit command line, the stable run id, and parameter checks."""

from __future__ import annotations

from typing import Any

import pytest
from statekeeper_airflow.operators import check_params, snapshot_asset, stable_run_id
from statekeeper_airflow.spark_submit import (
    application_args,
    application_path,
    forwarded_env,
    master_of,
    spark_target,
    submit_hook,
    target_for,
)

from state_engine.jobs.__main__ import build_parser
from state_engine.jobs.commands import job_params


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SK_CLUSTER", "spark://master.example:7077?deploy-mode=client")
    monkeypatch.setenv("AIRFLOW_CONN_SK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv(
        "AIRFLOW_CONN_SK_K8S", '{"conn_type": "spark", "host": "k8s://https://k:6443"}'
    )
    monkeypatch.setenv("AIRFLOW_CONN_SK_CONNECT", "sc://connect.example:15002")


@pytest.mark.parametrize(
    ("conn_id", "mode", "master"),
    [
        ("sk_cluster", "cluster", "spark://master.example:7077"),
        ("sk_k8s", "cluster", "k8s://https://k:6443"),
        ("sk_local", "local", "local[2]"),
        # no such connection: in-process, never the provider's silent fallback to yarn
        ("sk_missing", "local", "local[*]"),
        (None, "local", "local[*]"),
    ],
)
def test_the_spark_connection_decides_local_or_cluster(
    connections: None, conn_id: str | None, mode: str, master: str
) -> None:
    target = spark_target(conn_id)
    assert (target.mode, target.master) == (mode, master)


def test_spark_connect_is_refused_with_what_to_use_instead(connections: None) -> None:
    with pytest.raises(ValueError, match=r"Spark Connect .* spark://HOST:7077"):
        spark_target("sk_connect")


@pytest.mark.parametrize(
    ("conn_type", "host", "port"),
    [
        ("spark", "spark://m", 7077),
        ("spark", "local[*]", None),
        ("spark", "yarn", None),
        ("spark", "m", 7077),
        ("spark", "m", None),
    ],
)
def test_the_master_is_read_by_the_providers_own_rule(
    monkeypatch: pytest.MonkeyPatch, conn_type: str, host: str, port: int | None
) -> None:
    import json

    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_SK_RULE", json.dumps({"conn_type": conn_type, "host": host, "port": port})
    )
    provider = SparkSubmitHook(conn_id="sk_rule")._connection["master"]
    assert master_of(conn_type, host, port) == provider
    assert target_for("sk_rule", conn_type, host, port).master == provider


def test_the_spark_submit_command_runs_the_job_module_with_its_own_options(
    connections: None,
) -> None:
    params = {
        "job": "orders",
        "retain_last": 3,
        "older_than": "7d",
        "dry_run": True,
        "savepoints": [4, "before-upgrade"],
        "wait": None,
    }
    args = application_args(
        "expire", params, run_id="run-1", dag_id="dag-1", airflow_run_id="manual__1"
    )
    hook = submit_hook(
        spark_target("sk_cluster"),
        "expire",
        args,
        name="dag-1-expire",
        conf={"spark.executor.memory": "2g"},
        env=forwarded_env({"STATEKEEPER_CATALOG_URL": "postgresql://db/sk", "HOME": "/root"}),
    )
    cmd = hook._build_spark_submit_command(application_path())

    assert cmd[:3] == ["spark-submit", "--master", "spark://master.example:7077"]
    assert "spark.executor.memory=2g" in cmd and cmd[cmd.index("--deploy-mode") + 1] == "client"
    app = cmd.index(application_path())
    assert application_path().endswith("state_engine/jobs/__main__.py")
    assert cmd[app + 1 :] == args
    # the driver's own parser reads back exactly the params and the Airflow identity
    parsed = build_parser().parse_args(args)
    assert parsed.job_name == "expire"
    assert job_params(parsed) == {
        "job": "orders",
        "retain_last": 3,
        "older_than": "7d",
        "dry_run": True,
        "savepoints": ["4", "before-upgrade"],
        "run_id": "run-1",
        "dag_id": "dag-1",
        "airflow_run_id": "manual__1",
    }
    # client mode: the catalog URL reaches the driver through its environment, not the command
    assert hook._env == {"STATEKEEPER_CATALOG_URL": "postgresql://db/sk"}
    assert "postgresql://db/sk" not in " ".join(cmd)


def test_the_run_id_is_the_same_for_every_try_of_a_task_instance_and_differs_otherwise() -> None:
    ids: dict[str, Any] = {
        "dag_id": "statekeeper_maintenance",
        "airflow_run_id": "scheduled__2025-01-01T00:00:00+00:00",
        "task_id": "maintain.expire",
        "map_index": 0,
    }
    first = stable_run_id("expire", "orders", **ids)
    assert stable_run_id("expire", "orders", **ids) == first
    assert first.startswith("airflow-expire-orders-")
    others = {
        stable_run_id("expire", "orders", **{**ids, "map_index": 1}),
        stable_run_id("expire", "orders", **{**ids, "airflow_run_id": "manual__x"}),
        stable_run_id("expire", "payments", **ids),
        stable_run_id("orphan_cleanup", "orders", **ids),
    }
    assert first not in others and len(others) == 4
    assert len(stable_run_id("expire", "j" * 400, **ids)) <= 250


def test_unknown_jobs_and_parameters_are_refused_with_what_exists() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"unknown maintenance job 'vacuum'.*expire"):
        check_params("vacuum", {})
    with pytest.raises(AirflowFailException, match=r"no parameter 'retain'.*retain_last"):
        check_params("expire", {"job": "orders", "retain": 3})
    assert check_params("expire", {"job": "orders", "older_than": None}) == {"job": "orders"}


def test_one_asset_per_job_with_a_quoted_uri() -> None:
    assert snapshot_asset("orders").uri == "statekeeper://orders/snapshots"
    assert snapshot_asset("team a/orders").uri == "statekeeper://team%20a%2Forders/snapshots"
