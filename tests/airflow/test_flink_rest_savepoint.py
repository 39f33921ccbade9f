"""FlinkSavepointOperator against a real Flink 2.3 cluster (the apache-flink package's scripts).

A SQL job (datagen -> GROUP BY -> blackhole, keyed state on the hashmap backend) runs on the
session's Flink cluster (``tests/fixtures/flink_cluster.py``); the operator triggers savepoints
through the REST API over the Airflow HTTP connection ``flink_default``, waits for them and
imports them into a real catalog, where verify passes. The job's own checkpoint directory is
imported too: metadata Flink wrote for a job unlike the fixtures' (RowData keys, SQL operators).
"""

from __future__ import annotations

import pytest

from state_engine.catalog import Catalog
from tests.fixtures.flink_cluster import PATIENCE_S, FlinkCluster

pytestmark = pytest.mark.slow

JOB_SQL = [
    "CREATE TABLE src (k STRING, v BIGINT) WITH ('connector'='datagen', "
    "'rows-per-second'='200', 'fields.k.length'='2', 'fields.v.min'='1', 'fields.v.max'='100')",
    "CREATE TABLE snk (k STRING, c BIGINT, s BIGINT) WITH ('connector'='blackhole')",
    "INSERT INTO snk SELECT k, COUNT(*), SUM(v) FROM src GROUP BY k",
]


def test_rest_savepoints_are_triggered_awaited_and_imported(
    flink_cluster: FlinkCluster, catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeeper_airflow.flink import FlinkSavepointOperator

    from state_engine.flink.import_job import import_flink
    from state_engine.verify import verify

    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("AIRFLOW_CONN_FLINK_DEFAULT", flink_cluster.rest)
    job_id = flink_cluster.submit_sql(JOB_SQL)
    flink_cluster.wait_checkpoints(job_id, 1)
    reports = []
    for fmt in ("CANONICAL", "NATIVE"):
        op = FlinkSavepointOperator(
            task_id=f"savepoint_{fmt.lower()}",
            flink_job_id=job_id,
            job="sql-agg",
            format_type=fmt,
            import_paths=[str(flink_cluster.savepoints)],
            poll_interval=0.5,
            max_polls=int(PATIENCE_S / 0.5),
        )
        reports.append(op.execute({}))
    locations = [r["location"] for r in reports]
    assert all(loc.startswith("file:") and "savepoint-" in loc for loc in locations)
    with Catalog.open(catalog_url) as catalog:
        snaps = {s.location.rstrip("/"): s for s in catalog.list_snapshots("sql-agg")}
        for loc, fmt in zip(locations, ("CANONICAL", "NATIVE"), strict=True):
            snap = snaps["file://" + loc.removeprefix("file:").rstrip("/")]
            assert (snap.kind, snap.format, snap.status) == ("SAVEPOINT", fmt, "COMPLETED")
            assert snap.parallelism == 2 and snap.max_parallelism == 128
        # the job's retained checkpoints import and verify too, once it is cancelled (a running
        # job subsumes checkpoints at any moment)
        flink_cluster.cancel(job_id)
        report = import_flink(
            catalog, [str(flink_cluster.checkpoints / job_id)], "sql-agg-checkpoints"
        )
        assert report.added and all(a["kind"] == "CHECKPOINT" for a in report.added)
        for job in ("sql-agg", "sql-agg-checkpoints"):
            result = verify(catalog, job)
            errors = [f for f in result.findings if f.level == "ERROR"]
            assert errors == [], result.render()
