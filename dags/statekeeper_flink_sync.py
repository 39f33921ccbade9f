"""Every 10 minutes: import/sync each configured Apache Flink job into the catalog, then verify."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import dag, task, task_group

DOC = """
### Statekeeper Flink sync

Every 10 minutes, for each configured Apache Flink job (a mapped task group `flink_job`, one
instance per job):

1. **sync**: `statectl flink import` of the job's directories: new completed checkpoints and
   savepoints (a `chk-N` or savepoint directory with a `_metadata`) are added to the catalog as
   snapshots of a job of origin `flink`, snapshots whose directory vanished are marked
   DISCARDED, nothing is duplicated. A directory already imported under another job name, or a
   `_metadata` that cannot be read, fails the task at once with the reason. A configured
   directory that is missing keeps its snapshots (a volume may come back): the task logs a
   warning, and verify fails until it is back or, deleted on purpose, forgotten with
   `statectl flink forget-directory PATH --job NAME` and taken out of the configuration.
2. **verify**: `statectl verify --sync` of the job: every file of every completed snapshot is in
   storage with its size and checksum and every `_metadata` lists exactly the catalog's files;
   an inconsistency fails the task (unreferenced files are warnings: orphan cleanup in the
   maintenance DAG deletes them). A running job may subsume a checkpoint between the two tasks:
   when a `_metadata` is missing, verify syncs the job's directories once more and checks again.

**Configuration**: the Airflow Variable `statekeeper_flink_jobs` (JSON), or, when it is unset,
the JSON file named by the `STATEKEEPER_FLINK_JOBS_FILE` setting:
`{"payments": {"checkpoint_dir": "s3://ckpt/payments/<job-id>", "savepoint_dirs":
["s3://ckpt/payments-savepoints"]}}`. No configured job: the run does nothing.

The maintenance DAG (expire, orphan cleanup) and the savepoint DAG (conversion into a
Statekeeper canonical savepoint) accept the imported Flink jobs as they are; they run without
Spark for them.
"""


@dag(
    dag_id="statekeeper_flink_sync",
    schedule=timedelta(minutes=10),
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["statekeeper", "flink", "catalog"],
    default_args={"owner": "statekeeper", "retries": 2, "retry_delay": timedelta(minutes=2)},
    doc_md=DOC,
)
def statekeeper_flink_sync() -> None:
    @task
    def list_flink_jobs() -> list[dict[str, Any]]:
        from statekeeper_airflow.flink import configured_jobs

        return configured_jobs()

    @task_group(group_id="flink_job")
    def flink_job(job: dict[str, Any]) -> None:
        @task
        def sync(job: dict[str, Any]) -> dict[str, Any]:
            from statekeeper_airflow.flink import sync_job

            return sync_job(job)

        @task
        def verify(job: dict[str, Any]) -> dict[str, Any]:
            from statekeeper_airflow.flink import verify_job

            return verify_job(job["name"])

        sync(job) >> verify(job)

    flink_job.expand(job=list_flink_jobs())


statekeeper_flink_sync()
