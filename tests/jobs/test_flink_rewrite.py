"""The Spark rewrite of a Flink job's snapshot into a Flink savepoint (jobs/flink_rewrite.py)
on the real Flink 2.3 fixture snapshots: it writes the very savepoint the writer's in-process
``rewrite_local`` writes, registers it as a canonical SAVEPOINT of the job with its maintenance
run, a retry returns the first result, a failure leaves nothing. (That Flink restores these
savepoints is proven by the writer's own tests against real Flink.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.errors import StatekeeperError
from state_engine.flink.keyed_state import catalog_flink_metadata
from state_engine.flink.maintain import rewrite_options
from state_engine.flink.metadata import read_metadata
from state_engine.flink.rewrite import rewrite_local
from state_engine.flink.snapshot_state import snapshot_rows
from state_engine.jobs import flink_rewrite
from state_engine.maintenance.run import run_tag
from state_engine.snapshot.storage import FileStore
from state_engine.snapshot_enums import SnapshotStatus
from state_engine.verify import verify
from tests.flink.conftest import flink_fixtures  # noqa: F401  (fixture)
from tests.jobs.flinkdata import FlinkJob, import_java_job

T_AT = 1_795_485_345_261  # the median lastSeen access time of chk-11 + 60 s: about half expire


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "statekeeper"
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", root.as_uri())
    return root


@pytest.fixture
def job(catalog: Catalog, flink_fixtures: Any, tmp_path: Path, root: Path) -> FlinkJob:  # noqa: F811
    return import_java_job(catalog, flink_fixtures, tmp_path)


def _local_copy(
    catalog: Catalog, snapshot_id: int, kind: str, params: dict[str, Any], out: Path
) -> Path:
    meta = catalog_flink_metadata(catalog, snapshot_id)
    assert meta is not None
    store, path = FileStore.at(str(out))
    report = rewrite_local(meta, rewrite_options(kind, params), store, path)
    assert report["output_location"] is not None
    return out


def _part_files(directory: Path) -> dict[str, bytes]:
    """The keyed-state part files (the copied operator-state files have random names)."""
    meta = read_metadata(str(directory))
    names = {
        Path(str(st.managed_keyed_state.delegate.location)).name
        for op in meta.operators
        for st in op.subtasks
        if st.managed_keyed_state is not None and st.managed_keyed_state.delegate is not None
    }
    return {n: (directory / n).read_bytes() for n in sorted(names)}


def _state(meta: Any) -> list[tuple[Any, ...]]:
    rows = snapshot_rows(meta, limit=0)
    return sorted(
        (r["operator"], r["state"], r["key"], r["namespace"], r["user_key"], r["value"])
        for r in rows
    )


def test_rescale_to_a_new_max_parallelism_writes_what_rewrite_local_writes(
    spark: Any, catalog: Catalog, job: FlinkJob, tmp_path: Path
) -> None:
    source = job["canonical"]
    params = {"parallelism": 3, "max_parallelism": 256}
    report = flink_rewrite.runner("rescale")(
        spark, catalog, job=job.name, snapshot=source.id, run_id="rescale-1", **params
    )
    assert report["status"] == "SUCCEEDED" and report["kind"] == "rescale"
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert (out.job, str(out.kind), str(out.format), out.status) == (
        job.name, "SAVEPOINT", "CANONICAL", SnapshotStatus.COMPLETED,
    )  # fmt: skip
    assert (out.parallelism, out.max_parallelism, out.trigger) == (3, 256, run_tag("rescale-1"))
    assert report["stats"]["output_location"] == out.location
    assert "flink run -s" in report["stats"]["restore"]["command"]
    assert any("256" in w for w in report["stats"]["restore"]["warnings"])
    run = catalog.get_run("rescale-1")
    assert (run.status, run.output_snapshot_id, run.input_snapshot_id) == (
        "SUCCEEDED", out.id, source.id,
    )  # fmt: skip

    expected = _local_copy(catalog, source.id, "rescale", params, tmp_path / "local")
    written = FileStore.at(out.location)[1]
    assert _part_files(Path(written)) == _part_files(expected)
    meta = catalog_flink_metadata(catalog, out.id)
    assert meta is not None and meta.max_parallelism == 256
    assert _state(meta) == _state(catalog_flink_metadata(catalog, source.id))
    # the catalog's files are the savepoint's: verify finds nothing wrong
    assert verify(catalog, job.name).ok


def test_ttl_cleanup_of_a_rocksdb_checkpoint_drops_what_rewrite_local_drops(
    spark: Any, catalog: Catalog, job: FlinkJob, tmp_path: Path
) -> None:
    source = job["chk-11"]
    params = {"ttl": ["lastSeen=60000"], "at": T_AT}
    report = flink_rewrite.runner("ttl_cleanup")(
        spark, catalog, job=job.name, snapshot=source.id, **params
    )
    out = catalog.get_snapshot(report["output_snapshot_id"])
    expected = _local_copy(catalog, source.id, "ttl_cleanup", params, tmp_path / "local")
    assert _part_files(Path(FileStore.at(out.location)[1])) == _part_files(expected)
    meta = catalog_flink_metadata(catalog, out.id)
    rows = _state(meta)
    before = _state(catalog_flink_metadata(catalog, source.id))
    assert {r[1] for r in rows} <= {r[1] for r in before}
    assert len([r for r in rows if r[1] == "lastSeen"]) < len(
        [r for r in before if r[1] == "lastSeen"]
    )
    assert [r for r in rows if r[1] != "lastSeen"] == [r for r in before if r[1] != "lastSeen"]


def test_a_retry_with_the_same_run_id_returns_the_first_result(
    spark: Any, catalog: Catalog, job: FlinkJob
) -> None:
    run = flink_rewrite.runner("flink_rewrite")
    first = run(spark, catalog, job=job.name, drop_state=["merchants"], run_id="surgery")
    again = run(spark, catalog, job=job.name, drop_state=["merchants"], run_id="surgery")
    assert again["skipped"] is True
    assert again["output_snapshot_id"] == first["output_snapshot_id"]
    outputs = [s for s in catalog.list_snapshots(job.name) if s.trigger == run_tag("surgery")]
    assert len(outputs) == 1
    assert catalog.get_run("surgery").attempts == 1
    meta = catalog_flink_metadata(catalog, first["output_snapshot_id"])
    assert "merchants" not in {r[1] for r in _state(meta)}


def test_a_failed_rewrite_leaves_no_metadata_and_no_completed_snapshot(
    spark: Any, catalog: Catalog, job: FlinkJob, root: Path
) -> None:
    source = job["canonical"]
    meta = catalog_flink_metadata(catalog, source.id)
    assert meta is not None
    # a key-group file cut short after its header: the read tasks fail mid-way
    victim = next(
        Path(str(st.managed_keyed_state.delegate.location))  # type: ignore[union-attr]
        for op in meta.operators
        for st in op.subtasks
        if st.managed_keyed_state is not None
    )
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(StatekeeperError):
        flink_rewrite.runner("rescale")(
            spark, catalog, job=job.name, snapshot=source.id, parallelism=2,
            max_parallelism=512, run_id="broken",
        )  # fmt: skip
    assert catalog.get_run("broken").status == "FAILED"
    mine = [s for s in catalog.list_snapshots(job.name) if s.trigger == run_tag("broken")]
    assert mine and all(s.status is not SnapshotStatus.COMPLETED for s in mine)
    assert not list(root.rglob("_metadata"))
    assert not [p for p in root.rglob("*") if p.is_file()]


def test_a_parallelism_only_change_of_a_canonical_savepoint_needs_no_rewrite_and_no_spark(
    catalog: Catalog, job: FlinkJob, root: Path
) -> None:
    source = job["canonical"]
    # no session: nothing would run on Spark
    report = flink_rewrite.runner("rescale")(
        None, catalog, job=job.name, snapshot=source.id, parallelism=4, run_id="p-only"
    )
    stats = report["stats"]
    assert stats["no_rewrite_needed"] is True and report["output_snapshot_id"] is None
    assert stats["restore"]["command"].startswith(
        f"flink run -s {FileStore.at(source.location)[1]}"
    )
    assert not root.exists() or not [p for p in root.rglob("*") if p.is_file()]
    assert catalog.get_run("p-only").status == "SUCCEEDED"


def test_statectl_maintain_rescale_on_a_flink_job_reports_the_savepoint_and_how_to_restore(
    spark: Any,
    catalog: Catalog,
    catalog_url: str,
    job: FlinkJob,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from state_engine.cli import main

    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    argv = ["maintain", "rescale", "--job", job.name, "--parallelism", "2",
            "--max-parallelism", "200", "--json"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    snap = catalog.get_snapshot(report["output_snapshot_id"])
    assert report["stats"]["output_location"] == snap.location
    assert (str(snap.kind), snap.max_parallelism, snap.job) == ("SAVEPOINT", 200, job.name)
    where = FileStore.at(snap.location)[1]
    assert f"restore with: flink run -s {where} -p 2" in err
    assert "max parallelism must change to 200 (from 128)" in err
    assert catalog.get_run(report["run_id"]).kind == "rescale"
