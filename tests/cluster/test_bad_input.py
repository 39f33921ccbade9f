"""What the distributed path says when its parts are wrong: an S3 endpoint that is down, wrong
credentials, a missing bucket, a Spark master that is not there. Each is one line on stderr that
names what to fix, the run is recorded FAILED with its job, and nothing is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from state_engine.catalog import Catalog, upgrade
from tests.cluster.sk_cluster import base_env, free_port

JOB = "bad-input"


@pytest.fixture(scope="module")
def catalog_url(stack, make_pg_database) -> str:
    """A catalog of this module's own: its broken jobs must not reach the DAG tests' catalog."""
    url = make_pg_database()
    upgrade(url)
    with Catalog.open(url) as catalog:
        catalog.register_job(JOB, max_parallelism=128, location=f"{stack.checkpoint_root}/{JOB}")
        catalog.register_job(
            "bad-bucket", max_parallelism=128, location="s3://no-such-bucket/checkpoints/bad-bucket"
        )
    return url


def statectl(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("statectl")), *args],
        env=base_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_storage_and_master_failures_are_named_and_change_nothing(stack, catalog_url) -> None:
    closed = free_port()
    env = {**stack.env, "STATEKEEPER_CATALOG_URL": catalog_url}
    local = {**env, "STATEKEEPER_SPARK_MASTER": "local[1]"}
    cases = {
        "endpoint": ({**local, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}"},
                     ["unreachable", "AWS_ENDPOINT_URL"]),
        "credentials": ({**local, "AWS_SECRET_ACCESS_KEY": "not-the-secret"},
                        ["refused", "AWS_SECRET_ACCESS_KEY"]),
        "bucket": ({**local, "STATEKEEPER_CHECKPOINT_ROOT": "s3://no-such-bucket/checkpoints"},
                   ["bucket 'no-such-bucket'", "does not exist"]),
        "master": ({**env, "STATEKEEPER_SPARK_MASTER": f"spark://127.0.0.1:{closed}"},
                   [f"Spark master spark://127.0.0.1:{closed} is unreachable",
                    "STATEKEEPER_SPARK_MASTER"]),
    }  # fmt: skip
    before = sorted(stack.s3.fs().find(stack.s3.bucket))
    procs = {
        name: statectl(
            env,
            "maintain",
            "orphan_cleanup",
            "--job",
            "bad-bucket" if name == "bucket" else JOB,
            "--dry-run",
            "--run-id",
            f"bad-{name}",
        )  # fmt: skip
        for name, (env, _) in cases.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 1, (name, out, err)
        # Spark's JVM may say a few lines of its own first; the error is the one last line
        assert "Traceback" not in err, (name, err)
        last = err.strip().splitlines()[-1]
        assert "error" in last, (name, err)
        for text in cases[name][1]:
            assert text in last, (name, last)
    with Catalog.open(catalog_url) as catalog:
        for name in ("endpoint", "credentials", "bucket"):
            run = catalog.get_run(f"bad-{name}")
            assert run.status == "FAILED" and run.job in (JOB, "bad-bucket"), (name, run)
    assert sorted(stack.s3.fs().find(stack.s3.bucket)) == before
