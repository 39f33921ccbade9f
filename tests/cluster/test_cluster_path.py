"""The distributed path end to end, on the session's stack (see conftest.py):

1. a stream job checkpoints to ``s3://`` (heap deltas) and is killed midway;
2. the jobs application runs under ``spark-submit`` on the standalone master, as the operator
   submits it;
3. the maintenance, savepoint, TTL-cleanup and rescale DAGs are triggered through Airflow's REST
   API and run by the real scheduler (LocalExecutor), each job a spark-submit to the cluster;
4. ``statectl state show`` reads a snapshot on S3 with Spark on the cluster;
5. the job restores from the rescaled snapshot on S3 at a new parallelism and finishes with
   exactly the output of a run that was never killed.

The tests run in this order and build on each other (module-scoped state).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.runtime import CollectedOutput, CollectSink, JobRunner
from tests.cluster.sk_clicks import clicks_job
from tests.cluster.sk_cluster import APPLICATION, AirflowDeployment, base_env, wait_until

JOB = "clicks"
EVERY, KILL_AT = 300, 1700
TERMINAL = {"success", "failed"}


@pytest.fixture(scope="module")
def s3_env(stack) -> Iterator[None]:
    """This process reaches the stack's S3 the way every process of the stack does."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in stack.s3.env.items():
            mp.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def catalog(stack) -> Iterator[Catalog]:
    with Catalog.open(stack.catalog_url) as cat:
        yield cat


@pytest.fixture(scope="module")
def output() -> CollectedOutput:
    """The job's committed output across its killed and its restored run."""
    return CollectedOutput()


@pytest.fixture(scope="module")
def reference() -> Counter[str]:
    out = CollectedOutput()
    with JobRunner(clicks_job(2, CollectSink(out))) as runner:
        runner.run()
    return Counter(out.records)


def trigger(airflow: AirflowDeployment, dag_id: str, conf: dict[str, Any]) -> str:
    wait_until(
        lambda: airflow.api(f"/dags/{dag_id}")[0] == 200,
        f"the DAG processor to parse {dag_id}",
        airflow.services,
    )
    status, body = airflow.api(f"/dags/{dag_id}", method="PATCH", body={"is_paused": False})
    assert status == 200, body
    status, body = airflow.api(
        f"/dags/{dag_id}/dagRuns", method="POST", body={"logical_date": None, "conf": conf}
    )
    assert status == 200, body
    return str(body["dag_run_id"])


def finished(airflow: AirflowDeployment, dag_id: str, run_id: str) -> dict[str, Any]:
    """Wait for the DAG run to end; a task that failed or waits for a retry fails the test with
    its log (a retry would only add minutes)."""

    def state() -> dict[str, Any] | None:
        status, run = airflow.api(f"/dags/{dag_id}/dagRuns/{run_id}")
        assert status == 200, run
        if run["state"] in TERMINAL:
            return run
        status, tis = airflow.api(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        assert status == 200, tis
        bad = [t for t in tis["task_instances"] if t["state"] in ("failed", "up_for_retry")]
        if bad:
            raise AssertionError(task_log(airflow, dag_id, run_id, bad[0]))
        return None

    run = wait_until(state, f"{dag_id} run {run_id}", airflow.services)
    if run["state"] != "success":
        status, tis = airflow.api(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        failed = [t for t in tis["task_instances"] if t["state"] == "failed"]
        raise AssertionError(
            task_log(airflow, dag_id, run_id, failed[0]) if failed else json.dumps(run)
        )
    return run


def task_log(airflow: AirflowDeployment, dag_id: str, run_id: str, ti: dict[str, Any]) -> str:
    path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
    if ti.get("map_index", -1) not in (-1, None):
        path += f"?map_index={ti['map_index']}"
    status, body = airflow.api(path)
    text = json.dumps(body)[-6000:] if status == 200 else f"(no log: {status})"
    return f"task {ti['task_id']} of {dag_id} is {ti['state']}:\n{text}"


def spark_apps(stack, name_part: str) -> list[dict[str, Any]]:
    return [a for a in stack.spark.applications() if name_part in a["name"]]


def s3_objects(stack, prefix: str) -> list[str]:
    fs = stack.s3.fs()
    return sorted(fs.find(f"{stack.s3.bucket}/{prefix}"))


# --- 1. the stream job on S3 ---


def test_a_job_checkpoints_to_s3_and_dies(stack, s3_env, catalog, output) -> None:
    runner = JobRunner(
        clicks_job(2, CollectSink(output), checkpoint_interval_records=EVERY,
                   checkpoint_format="delta"),
        catalog=catalog,
        storage=stack.checkpoint_root,
    )  # fmt: skip
    killed = runner.run_until(records=KILL_AT)
    assert killed.killed and len(killed.checkpoints) >= 4
    snapshots = catalog.list_snapshots(JOB, status="COMPLETED")
    root = f"s3://{stack.s3.bucket}/checkpoints/{JOB}/"
    assert len(snapshots) >= 3 and all(s.location.startswith(root) for s in snapshots)
    assert {s.format for s in snapshots} == {"DELTA"}  # a chain of deltas on one base
    objects = s3_objects(stack, f"checkpoints/{JOB}")
    for s in snapshots:
        assert f"{s.location.removeprefix('s3://')}/_metadata" in objects


# --- 2. the application under spark-submit ---


def test_the_jobs_application_runs_under_spark_submit_on_the_master(stack) -> None:
    name = "statekeeper-orphan_cleanup-clicks [by hand]"
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master",
            stack.spark.master_url,
            "--name",
            name,
            str(APPLICATION),
            "orphan_cleanup",
            "--job",
            JOB,
            "--dry-run",
        ],  # fmt: skip
        env=base_env(stack.env),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "DRY_RUN" and report["job"] == JOB  # a dry run (issue 33)
    apps = spark_apps(stack, "[by hand]")
    assert len(apps) == 1, (stack.spark.applications(), done.stderr)
    [app] = apps
    assert app["name"] == name and app["state"] == "FINISHED"


# --- 3. the DAGs under the scheduler ---


def test_the_maintenance_dag_compacts_expires_and_cleans_on_the_cluster(
    stack, airflow, catalog
) -> None:
    before = {s.id for s in catalog.list_snapshots(JOB)}
    run_id = trigger(
        airflow,
        "statekeeper_maintenance",
        {"compaction_min_deltas": 2, "retain_last": 2, "orphan_older_than": "3d"},
    )
    finished(airflow, "statekeeper_maintenance", run_id)
    runs = {r.kind: r for r in catalog.list_runs(job=JOB) if r.airflow_run_id == run_id}
    assert {k: r.status for k, r in runs.items()} == {
        "compaction": "SUCCEEDED", "expire": "SUCCEEDED", "orphan_cleanup": "SUCCEEDED"
    }  # fmt: skip
    compacted = catalog.get_snapshot(runs["compaction"].output_snapshot_id)
    assert compacted.id not in before and compacted.format == "CANONICAL"
    assert compacted.location.startswith("s3://")
    assert s3_objects(stack, compacted.location.removeprefix(f"s3://{stack.s3.bucket}/"))
    for kind in ("compaction", "expire", "orphan_cleanup"):
        [app] = spark_apps(stack, f"statekeeper-{kind}-{JOB} [statekeeper_maintenance.")
        assert app["state"] == "FINISHED" and run_id in app["name"]


def test_savepoint_and_ttl_dags_run_on_the_cluster(stack, airflow, catalog) -> None:
    latest = catalog.latest_snapshot(JOB)
    assert latest is not None and latest.format == "CANONICAL"
    conf = {"job": JOB, "source_snapshot": latest.id}
    savepoint = trigger(airflow, "statekeeper_savepoint", conf)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    ttl = trigger(airflow, "statekeeper_ttl_cleanup", {"at": now_ms})
    finished(airflow, "statekeeper_savepoint", savepoint)
    finished(airflow, "statekeeper_ttl_cleanup", ttl)
    [sp_run] = [r for r in catalog.list_runs(job=JOB) if r.airflow_run_id == savepoint]
    out = catalog.get_snapshot(sp_run.output_snapshot_id)
    assert out.kind == "SAVEPOINT" and out.location.startswith("s3://")
    [ttl_run] = [r for r in catalog.list_runs(job=JOB) if r.airflow_run_id == ttl]
    assert ttl_run.kind == "ttl_cleanup" and ttl_run.status == "SUCCEEDED"
    assert catalog.get_snapshot(ttl_run.output_snapshot_id).location.startswith("s3://")
    assert spark_apps(stack, f"statekeeper-savepoint-{JOB} [statekeeper_savepoint.")
    assert spark_apps(stack, f"statekeeper-ttl_cleanup-{JOB} [statekeeper_ttl_cleanup.")


def test_the_rescale_dag_then_the_job_resumes_exactly_once_from_s3(
    stack, airflow, s3_env, catalog, output, reference
) -> None:
    [compaction] = [r for r in catalog.list_runs(job=JOB) if r.kind == "compaction"]
    source = compaction.output_snapshot_id
    run_id = trigger(
        airflow, "statekeeper_rescale", {"job": JOB, "parallelism": 3, "source_snapshot": source}
    )
    finished(airflow, "statekeeper_rescale", run_id)
    [run] = [r for r in catalog.list_runs(job=JOB) if r.airflow_run_id == run_id]
    rescaled = catalog.get_snapshot(run.output_snapshot_id)
    assert rescaled.parallelism == 3 and rescaled.location.startswith("s3://")
    assert spark_apps(stack, f"statekeeper-rescale-{JOB} [statekeeper_rescale.")

    resumed = JobRunner(
        clicks_job(3, CollectSink(output)),
        catalog=catalog,
        storage=stack.checkpoint_root,
        restore_from=rescaled.id,
    )
    with resumed:
        assert resumed.run().finished
    assert Counter(output.records) == reference  # every output exactly once


# --- 4. reading state on S3 with Spark on the cluster ---


def test_state_show_reads_a_snapshot_on_s3_with_spark_on_the_cluster(stack, catalog) -> None:
    latest = catalog.latest_snapshot(JOB)
    env = base_env({**stack.env, "STATEKEEPER_SPARK_MASTER": stack.spark.master_url})
    done = subprocess.run(
        [str(Path(sys.executable).with_name("statectl")), "state", "show", str(latest.id),
         "--key", "hot1", "--state", "count", "--json", "--spark"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    [row] = json.loads(done.stdout)
    assert row["key"] == "hot1" and row["state"] == "count" and int(row["value"]) > 100


def test_every_application_ran_on_the_master_and_the_objects_it_wrote(stack, catalog) -> None:
    """What ran where, kept beside the logs (``summary.json``) for whoever reads a failed run."""
    apps = stack.spark.applications()
    assert apps and all(a["state"] == "FINISHED" for a in apps), apps
    snapshots = {
        s.id: {"kind": s.kind, "format": s.format, "location": s.location}
        for s in catalog.list_snapshots(JOB)
    }
    summary = {
        "applications": [{"id": a["id"], "name": a["name"]} for a in apps],
        "runs": [
            {"kind": r.kind, "dag": r.dag_id, "output": snapshots.get(r.output_snapshot_id)}
            for r in catalog.list_runs(job=JOB)
        ],
        "objects": s3_objects(stack, f"checkpoints/{JOB}"),
    }
    (stack.workdir / "summary.json").write_text(json.dumps(summary, indent=1))
