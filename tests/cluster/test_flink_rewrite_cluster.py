"""A Flink job's snapshot on S3 rewritten into a Flink savepoint by the jobs application under
``spark-submit`` on the standalone master (the session's stack), as in ``local[*]``: the same
state, at the new max parallelism, a SAVEPOINT of the job in the PostgreSQL catalog."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.catalog.migrate import upgrade
from state_engine.flink.import_job import import_flink
from state_engine.flink.keyed_state import catalog_flink_metadata
from state_engine.flink.snapshot_state import snapshot_rows
from tests.cluster.sk_cluster import APPLICATION, base_env
from tests.flink.conftest import flink_fixtures  # noqa: F401  (fixture)
from tests.jobs.flinkdata import JAVA_ROCKS_JOB


def _rows(meta: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r["state"], r["key"], r["namespace"], r["user_key"], r["value"])
        for r in snapshot_rows(meta, limit=0)
    )


def test_a_flink_rewrite_runs_under_spark_submit_on_the_cluster(
    stack: Any,
    make_pg_database: Callable[[], str],
    flink_fixtures: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in stack.s3.env.items():
        monkeypatch.setenv(name, value)
    prefix = f"{stack.s3.bucket}/flink-{uuid.uuid4().hex[:8]}"
    stack.s3.fs().put(str(flink_fixtures.java / "rocksdb") + "/", f"{prefix}/", recursive=True)
    url = make_pg_database()
    upgrade(url)
    with Catalog.open(url) as catalog:
        import_flink(
            catalog,
            [f"s3://{prefix}/savepoints", f"s3://{prefix}/checkpoints/{JAVA_ROCKS_JOB}"],
            "fraud",
        )
        source = next(s for s in catalog.list_snapshots("fraud") if s.checkpoint_id == 11)
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master",
            stack.spark.master_url,
            str(APPLICATION),
            "flink_rewrite",
            "--snapshot",
            str(source.id),
            "--parallelism",
            "2",
            "--max-parallelism",
            "256",
            "--run-id",
            "cluster-rewrite",
        ],  # fmt: skip
        env=base_env({**stack.env, "STATEKEEPER_CATALOG_URL": url}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "SUCCEEDED" and report["job"] == "fraud"
    with Catalog.open(url) as catalog:
        out = catalog.get_snapshot(report["output_snapshot_id"])
        assert (str(out.kind), out.max_parallelism) == ("SAVEPOINT", 256)
        assert out.location.startswith(f"{stack.checkpoint_root}/fraud/savepoints/")
        meta = catalog_flink_metadata(catalog, out.id)
        assert meta is not None and meta.max_parallelism == 256
        assert _rows(meta) == _rows(catalog_flink_metadata(catalog, source.id))
