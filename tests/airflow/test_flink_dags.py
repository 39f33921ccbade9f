"""Flink jobs in Airflow: the statekeeper_flink_sync DAG imports and verifies configured Flink
directories (real Flink 2.3 snapshots), and the maintenance and savepoint DAGs work on them
without Spark. Runs with dag.test() on the session's Airflow home and a real SQLite catalog."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from tests.airflow.sk_airflow_support import DAGS

ARCHIVE = Path(os.environ.get("STATEKEEPER_FLINK_FIXTURES", "/work/shared/flink")) / (
    "flink-java-dev.tar.gz"
)
HASHMAP_JOB = "24b66efa530da662b5ea2fccfbe5c4b7"
OLD = 1_700_000_000


@pytest.fixture(scope="module")
def java_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ARCHIVE.exists():
        pytest.skip(f"Flink fixture archive {ARCHIVE} is missing (set STATEKEEPER_FLINK_FIXTURES)")
    root = tmp_path_factory.mktemp("flink-java")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / "flink-java-dev"


@pytest.fixture
def flink_env(
    catalog_url: str, java_fixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Path]]:
    """A private copy of the Java job's hashmap directories, configured through the Variable."""
    src = java_fixture / "hashmap"
    job_dir = tmp_path / "checkpoints" / HASHMAP_JOB
    shutil.copytree(src / "checkpoints" / HASHMAP_JOB, job_dir, copy_function=shutil.copy2)
    sp = tmp_path / "savepoints"
    shutil.copytree(src / "savepoints", sp, copy_function=shutil.copy2)
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.delenv("STATEKEEPER_FLINK_JOBS_FILE", raising=False)
    monkeypatch.setenv(
        "AIRFLOW_VAR_STATEKEEPER_FLINK_JOBS",
        json.dumps({"payments": {"checkpoint_dir": str(job_dir), "savepoint_dirs": [str(sp)]}}),
    )
    yield {"job_dir": job_dir, "savepoints": sp, "url": Path(catalog_url)}


@pytest.fixture(scope="module")
def dag_of(airflow_home: Path) -> Callable[[str], Any]:
    from airflow.dag_processing.dagbag import DagBag

    def get(dag_id: str) -> Any:
        bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
        assert bag.import_errors == {}
        return bag.dags[dag_id]

    return get


def task_states(dagrun: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ti in sorted(dagrun.get_task_instances(), key=lambda t: (t.task_id, t.map_index)):
        out.setdefault(ti.task_id, []).append(ti.state)
    return out


def catalog() -> Catalog:
    return Catalog.open(os.environ["STATEKEEPER_CATALOG_URL"])


def test_flink_sync_imports_then_verifies_and_a_rerun_adds_nothing(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path]
) -> None:
    dagrun = dag_of("statekeeper_flink_sync").test()
    assert dagrun.state == "success", task_states(dagrun)
    assert task_states(dagrun) == {
        "list_flink_jobs": ["success"],
        "flink_job.sync": ["success"],
        "flink_job.verify": ["success"],
    }
    with catalog() as cat:
        job = cat.get_job("payments")
        snaps = cat.list_snapshots("payments")
    assert job.origin == "flink"
    assert sorted((s.checkpoint_id, s.kind) for s in snaps) == [
        (5, "SAVEPOINT"), (8, "CHECKPOINT"), (9, "SAVEPOINT"), (10, "CHECKPOINT"),
        (11, "CHECKPOINT"),
    ]  # fmt: skip
    shutil.rmtree(flink_env["job_dir"] / "chk-8")  # Flink subsumed it
    again = dag_of("statekeeper_flink_sync").test()
    assert again.state == "success", task_states(again)
    with catalog() as cat:
        status = {s.checkpoint_id: s.status for s in cat.list_snapshots("payments")}
    assert status == {5: "COMPLETED", 8: "DISCARDED", 9: "COMPLETED", 10: "COMPLETED",
                      11: "COMPLETED"}  # fmt: skip


def test_a_deleted_savepoint_directory_fails_verify_until_it_is_forgotten(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from state_engine.flink.forget import forget_directory

    assert dag_of("statekeeper_flink_sync").test().state == "success"
    shutil.rmtree(flink_env["savepoints"])  # deleted on purpose (or a volume not mounted)
    missing = dag_of("statekeeper_flink_sync").test()
    assert task_states(missing) == {
        "list_flink_jobs": ["success"],
        "flink_job.sync": ["success"],  # its snapshots are kept: it may come back
        "flink_job.verify": ["failed"],
    }
    with catalog() as cat:
        report = forget_directory(cat, str(flink_env["savepoints"]), "payments")
        assert sorted(d["checkpoint_id"] for d in report.discarded) == [5, 9]
    # still configured, it is a directory that does not exist: the sync says so
    assert task_states(dag_of("statekeeper_flink_sync").test())["flink_job.sync"] == ["failed"]
    monkeypatch.setenv(
        "AIRFLOW_VAR_STATEKEEPER_FLINK_JOBS",
        json.dumps({"payments": {"checkpoint_dir": str(flink_env["job_dir"])}}),
    )
    again = dag_of("statekeeper_flink_sync").test()
    assert again.state == "success", task_states(again)


def test_flink_sync_fails_the_job_whose_metadata_is_corrupt(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path]
) -> None:
    meta = flink_env["job_dir"] / "chk-11" / "_metadata"
    meta.write_bytes(meta.read_bytes()[:-7])
    dagrun = dag_of("statekeeper_flink_sync").test()
    assert dagrun.state == "failed"
    assert task_states(dagrun)["flink_job.sync"] == ["failed"]
    with catalog() as cat:
        assert cat.list_jobs() == []  # nothing half-imported


def test_maintenance_dag_expires_and_cleans_a_flink_job_without_spark(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path]
) -> None:
    assert dag_of("statekeeper_flink_sync").test().state == "success"
    with catalog() as cat:  # imported read-only: the user lets Statekeeper delete
        cat.set_job_policy("payments", ["retention", "orphans"])
    orphan = flink_env["job_dir"] / "shared" / "lost-sst"
    orphan.write_bytes(b"x")
    os.utime(orphan, (OLD, OLD))
    dagrun = dag_of("statekeeper_maintenance").test(run_conf={"retain_last": 1})
    assert dagrun.state == "success", task_states(dagrun)
    states = task_states(dagrun)
    assert states["maintain.compaction"] == ["skipped"]  # a Flink job has no delta chain
    assert states["maintain.expire"] == ["success"]
    assert states["maintain.orphan_cleanup"] == ["success"]
    assert not orphan.exists()
    assert not (flink_env["job_dir"] / "chk-8").exists()
    assert not (flink_env["job_dir"] / "chk-10").exists()
    assert (flink_env["job_dir"] / "chk-11" / "_metadata").exists()
    assert len(list(flink_env["savepoints"].iterdir())) == 2  # savepoints are never expired
    with catalog() as cat:
        runs = {r.kind: r for r in cat.list_runs(job="payments")}
        completed = cat.list_snapshots("payments", status="COMPLETED")
    assert {k: (r.status, r.dag_id) for k, r in runs.items()} == {
        "expire": ("SUCCEEDED", "statekeeper_maintenance"),
        "orphan_cleanup": ("SUCCEEDED", "statekeeper_maintenance"),
    }
    assert sorted(s.checkpoint_id for s in completed) == [5, 9, 11]


def test_flink_savepoint_operator_reports_an_unreachable_cluster(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowException
    from statekeeper_airflow.flink import FlinkRest, FlinkSavepointOperator

    # port 9 (discard) on localhost: nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_FLINK_DEFAULT", "http://127.0.0.1:9")
    op = FlinkSavepointOperator(task_id="sp", flink_job_id=HASHMAP_JOB, job="payments")
    rest = FlinkRest(op.http_conn_id, timeout=5)
    assert rest.base == "http://127.0.0.1:9"
    with pytest.raises(AirflowException, match="unreachable"):
        op.trigger(rest)


def test_plugin_pages_show_an_imported_flink_job(
    flink_env: dict[str, Path], make_token: Callable[..., str]
) -> None:
    from fastapi.testclient import TestClient
    from statekeeper_airflow.app import create_app
    from statekeeper_airflow.catalog_access import CatalogHolder

    from state_engine.flink.import_job import import_flink

    url = os.environ["STATEKEEPER_CATALOG_URL"]
    with catalog() as cat:
        import_flink(cat, [str(flink_env["job_dir"]), str(flink_env["savepoints"])], "payments")
        chk11 = next(s for s in cat.list_snapshots("payments") if s.checkpoint_id == 11)
    auth = {"Authorization": f"Bearer {make_token()}"}
    with TestClient(create_app(CatalogHolder(lambda: Catalog.open(url)))) as client:
        history = client.get("/api/jobs/payments/size-history", headers=auth).json()
        points = [(p["checkpoint_id"], p["operator"]) for p in history["items"]]
        assert (11, "agg") in points and (5, "agg") in points
        agg11 = next(
            p for p in history["items"] if (p["checkpoint_id"], p["operator"]) == (11, "agg")
        )
        assert agg11["bytes"] == 727_011  # the two keyed-state files of chk-11 (README)
        job_page = client.get("/jobs/payments", headers=auth)
        assert job_page.status_code == 200 and "payments" in job_page.text
        # imported, so read-only until the user says otherwise; the page says how
        assert "read-only: Statekeeper deletes nothing" in job_page.text
        assert "statectl jobs set-policy payments --manage orphans" in job_page.text
        assert client.get("/api/jobs/payments", headers=auth).json()["manage"] == []
        page = client.get(f"/snapshots/{chk11.id}", headers=auth)
        assert page.status_code == 200
        assert "Operator agg" in page.text and "128 recorded" in page.text


def test_savepoint_dag_converts_the_latest_flink_snapshot_without_spark(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path], tmp_path: Path
) -> None:
    assert dag_of("statekeeper_flink_sync").test().state == "success"
    target = (tmp_path / "converted").as_uri()
    dagrun = dag_of("statekeeper_savepoint").test(
        run_conf={"job": "payments", "target_dir": target}
    )
    assert dagrun.state == "success", task_states(dagrun)
    with catalog() as cat:
        [run] = cat.list_runs(job="payments", kind="savepoint")
        chk11 = next(s for s in cat.list_snapshots("payments") if s.checkpoint_id == 11)
        assert run.status == "SUCCEEDED" and run.input_snapshot_id == chk11.id
        assert run.output_snapshot_id is not None
        output = cat.get_snapshot(run.output_snapshot_id)
    assert (output.kind, output.format, output.status) == ("SAVEPOINT", "CANONICAL", "COMPLETED")
    assert output.location.rstrip("/") == target
    assert (tmp_path / "converted" / "_metadata").is_file()


def test_take_savepoint_on_a_flink_job_converts_a_flink_snapshot_not_a_converted_one(
    flink_env: dict[str, Path], tmp_path: Path
) -> None:
    # The plugin's "Take savepoint" action sends only the job: the first conversion makes a
    # Statekeeper savepoint the job's newest snapshot; the next one must still read Flink's.
    from statekeeper_airflow.flink import run_flink_maintenance

    from state_engine.flink.import_job import import_flink

    with catalog() as cat:
        import_flink(cat, [str(flink_env["job_dir"])], "payments")
        chk11 = next(s for s in cat.list_snapshots("payments") if s.checkpoint_id == 11)
    outputs = []
    for n in (1, 2):
        report = run_flink_maintenance(
            "savepoint",
            {"job": "payments", "savepoint_dir": (tmp_path / f"sp-{n}").as_uri()},
            {"run_id": f"take-savepoint-{n}"},
        )
        assert report is not None and report["input_snapshot_id"] == chk11.id
        outputs.append(report["output_snapshot_id"])
    with catalog() as cat:
        assert cat.list_snapshots("payments")[0].id == outputs[1]
        assert cat.get_snapshot(outputs[0]).format == "CANONICAL"


def test_verify_after_flink_subsumed_a_checkpoint_since_the_sync_syncs_again(
    dag_of: Callable[[str], Any], flink_env: dict[str, Path]
) -> None:
    """A running job subsumes checkpoints at any moment, also between the sync task and the
    verify task: the verify syncs once more rather than fail the run for nothing."""
    from statekeeper_airflow.flink import verify_job

    assert dag_of("statekeeper_flink_sync").test().state == "success"
    shutil.rmtree(flink_env["job_dir"] / "chk-8")  # Flink subsumed it after the sync
    verify_job("payments")  # raises when it finds inconsistencies
    with catalog() as cat:
        status = {s.checkpoint_id: s.status for s in cat.list_snapshots("payments")}
    assert status[8] == "DISCARDED" and status[10] == "COMPLETED"
    # a data file gone is not explained by a sync: verify still fails
    victim = next(p for p in (flink_env["job_dir"] / "chk-10").iterdir() if p.name != "_metadata")
    victim.unlink()
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="inconsistencies"):
        verify_job("payments")
