"""The rescale and TTL cleanup DAGs on a Flink job: dag.test() runs them end to end, the Spark
rewrite in-process on the session's SparkSession, against the real Flink 2.3 fixture snapshots;
each writes a Flink savepoint, a SAVEPOINT of the job recorded with the DAG's run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.flink.keyed_state import catalog_flink_metadata
from tests.airflow.test_maintenance_dags import dag_of, returned, task_states  # noqa: F401
from tests.flink.conftest import flink_fixtures  # noqa: F401  (fixture)
from tests.jobs.flinkdata import FlinkJob, import_java_job


@pytest.fixture
def flink_job(
    catalog_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spark: Any,
    flink_fixtures: Any,  # noqa: F811
) -> FlinkJob:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", (tmp_path / "statekeeper").as_uri())
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    with Catalog.open(catalog_url) as cat:
        return import_java_job(cat, flink_fixtures, tmp_path)


def test_the_rescale_dag_writes_a_flink_savepoint_at_the_new_max_parallelism(
    dag_of: Any,  # noqa: F811
    flink_job: FlinkJob,
    catalog_url: str,
) -> None:
    conf = {"job": flink_job.name, "parallelism": 2, "max_parallelism": 300}
    dagrun = dag_of("statekeeper_rescale").test(run_conf=conf)
    assert dagrun.state == "success", task_states(dagrun)
    [report] = returned(dagrun, "rescale")
    with Catalog.open(catalog_url) as cat:
        out = cat.get_snapshot(report["output_snapshot_id"])
        [run] = cat.list_runs(job=flink_job.name, kind="rescale")
        meta = catalog_flink_metadata(cat, out.id)
    assert (str(out.kind), str(out.format), out.max_parallelism) == ("SAVEPOINT", "CANONICAL", 300)
    assert meta is not None and meta.max_parallelism == 300
    assert (run.dag_id, run.status, run.output_snapshot_id) == (
        "statekeeper_rescale", "SUCCEEDED", out.id,
    )  # fmt: skip
    restore = report["stats"]["restore"]  # what the task logs
    assert restore["command"].startswith("flink run -s ")
    assert any("max parallelism must change to 300" in w for w in restore["warnings"])


def test_the_ttl_cleanup_dag_cleans_a_flink_job_given_its_ttl(
    dag_of: Any,  # noqa: F811
    flink_job: FlinkJob,
    catalog_url: str,
) -> None:
    conf = {"job": flink_job.name, "ttl": ["lastSeen=1"], "at": 1 << 62}
    dagrun = dag_of("statekeeper_ttl_cleanup").test(run_conf=conf)
    assert dagrun.state == "success", task_states(dagrun)
    [report] = returned(dagrun, "ttl_cleanup")
    with Catalog.open(catalog_url) as cat:
        meta = catalog_flink_metadata(cat, report["output_snapshot_id"])
    assert meta is not None
    from state_engine.flink.snapshot_state import snapshot_rows

    assert {r["state"] for r in snapshot_rows(meta, limit=0)} == {"merchants", "recent", "total"}
