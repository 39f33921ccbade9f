"""The Spark rewrite of a Flink job's snapshot on S3 (moto's server): read from ``s3://``, written
to ``s3://``, the same savepoint as on a local disk."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.flink.import_job import import_flink
from state_engine.flink.keyed_state import catalog_flink_metadata
from state_engine.flink.snapshot_state import snapshot_rows
from state_engine.jobs import flink_rewrite
from state_engine.snapshot_enums import SnapshotStatus
from state_engine.verify import verify
from tests.cluster.sk_cluster import S3Endpoint
from tests.fixtures.s3 import s3, s3_env  # noqa: F401  (fixtures)
from tests.flink.conftest import flink_fixtures  # noqa: F401  (fixture)
from tests.jobs.flinkdata import JAVA_ROCKS_JOB


@pytest.fixture
def spark_on_s3(spark: Any, s3_env: S3Endpoint) -> Iterator[Any]:  # noqa: F811
    """The session's Spark with its Python workers pointed at the S3 endpoint too (they take
    their environment from the session, not from this process)."""
    env = spark.sparkContext.environment
    before = dict(env)
    env.update(s3_env.env)
    yield spark
    env.clear()
    env.update(before)


def _rows(meta: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r["state"], r["key"], r["namespace"], r["user_key"], r["value"])
        for r in snapshot_rows(meta, limit=0)
    )


def test_a_rewrite_reads_and_writes_s3_as_a_local_disk(
    spark_on_s3: Any,
    catalog: Catalog,
    s3_env: S3Endpoint,  # noqa: F811
    flink_fixtures: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    local = flink_fixtures.java / "rocksdb"
    prefix = f"{s3_env.bucket}/{uuid.uuid4().hex[:8]}"
    s3_env.fs().put(str(local) + "/", f"{prefix}/", recursive=True)
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", f"s3://{prefix}/statekeeper")
    import_flink(
        catalog,
        [f"s3://{prefix}/savepoints", f"s3://{prefix}/checkpoints/{JAVA_ROCKS_JOB}"],
        "fraud",
    )
    sources = {s.checkpoint_id: s for s in catalog.list_snapshots("fraud")}
    for checkpoint_id, options in (
        (5, {"parallelism": 2, "max_parallelism": 200}),  # the canonical savepoint
        (11, {"ttl": ["lastSeen=1"], "at": 1 << 62, "drop_state": ["merchants"]}),  # chk-11
    ):
        source = sources[checkpoint_id]
        report = flink_rewrite.runner("flink_rewrite")(
            spark_on_s3, catalog, snapshot=source.id, **options
        )
        out = catalog.get_snapshot(report["output_snapshot_id"])
        assert out.status is SnapshotStatus.COMPLETED
        assert out.location.startswith(f"s3://{prefix}/statekeeper/fraud/savepoints/")
        meta = catalog_flink_metadata(catalog, out.id)
        assert meta is not None
        rows = _rows(meta)
        before = _rows(catalog_flink_metadata(catalog, source.id))
        if checkpoint_id == 5:
            assert meta.max_parallelism == 200 and rows == before
        else:  # every lastSeen expired, merchants dropped: the other states as they were
            assert {r[0] for r in rows} == {"recent", "total"}
            assert rows == [r for r in before if r[0] in ("recent", "total")]
    assert verify(catalog, "fraud").ok
