"""A Spark worker killed while a maintenance job's tasks run: Spark moves the lost tasks to the
other worker and the job completes; nothing half-written stays visible (``statectl verify`` is
clean). The worker is started again afterwards, so the session's cluster stays whole.

Runs last in this folder (file order): it takes a worker away for a while.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from state_engine.catalog import Catalog, upgrade
from state_engine.faults import PAUSE_DIR_ENV_VAR, PAUSE_ENV_VAR
from state_engine.runtime import CollectedOutput, CollectSink, JobRunner
from tests.cluster.sk_clicks import clicks_job
from tests.cluster.sk_cluster import APPLICATION, base_env, wait_until

JOB = "worker-loss"
POINT = "spark.task.started"


def test_a_worker_killed_mid_job_loses_nothing(
    stack, make_pg_database, tmp_path: Path, monkeypatch
) -> None:
    for name, value in stack.s3.env.items():
        monkeypatch.setenv(name, value)
    catalog_url = make_pg_database()  # its own: the DAG tests' maintenance sees every job
    upgrade(catalog_url)
    env = base_env({**stack.env, "STATEKEEPER_CATALOG_URL": catalog_url})
    with Catalog.open(catalog_url) as catalog:
        runner = JobRunner(
            clicks_job(2, CollectSink(CollectedOutput()), job=JOB,
                       checkpoint_interval_records=400),
            catalog=catalog,
            storage=stack.checkpoint_root,
        )  # fmt: skip
        with runner:
            assert runner.run().finished
        source = catalog.latest_snapshot(JOB)
        assert source is not None

    pauses = tmp_path / "pauses"
    pauses.mkdir()
    submit = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master",
            stack.spark.master_url,
            "--name",
            "statekeeper-rescale-worker-loss",
            "--conf",
            f"spark.executorEnv.{PAUSE_ENV_VAR}={POINT}",
            "--conf",
            f"spark.executorEnv.{PAUSE_DIR_ENV_VAR}={pauses}",
            str(APPLICATION),
            "rescale",
            "--snapshot",
            str(source.id),
            "--parallelism",
            "3",
            "--max-parallelism",
            "256",
            "--tasks",
            "4",
            "--run-id",
            "worker-loss",
        ],  # fmt: skip
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker = stack.spark.services[-1]
    try:
        # both workers' executors are inside a task: now kill one worker (and its executor)
        wait_until(
            lambda: len(list(pauses.glob(f"{POINT}.*.reached"))) >= 2 or submit.poll() is not None,
            "tasks on both workers",
            stack.spark.services,
        )
        assert submit.poll() is None, submit.communicate()
        os.killpg(worker.pid, signal.SIGKILL)  # the worker, its executor and Python workers
        worker.proc.wait()
        (pauses / f"{POINT}.release").touch()
        out, err = submit.communicate(timeout=900)
    finally:
        (pauses / f"{POINT}.release").touch()
        if not worker.alive():
            worker.start()
    wait_until(
        lambda: stack.spark.alive_workers() >= 2, "the worker to rejoin", stack.spark.services
    )
    assert submit.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["status"] == "SUCCEEDED"
    with Catalog.open(catalog_url) as catalog:
        out_snap = catalog.get_snapshot(report["output_snapshot_id"])
        assert out_snap.status == "COMPLETED" and out_snap.max_parallelism == 256
        assert not catalog.list_snapshots(JOB, status="PENDING")
        assert out_snap.entries == catalog.get_snapshot(source.id).entries
    verify = subprocess.run(
        [str(Path(sys.executable).with_name("statectl")), "verify", JOB],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
