"""The maintenance DAG deletes only where a job's management policy allows it, on both catalogs.

One dag.test() over a mix of jobs: a read-only Flink job (its import's default), a managed Flink
job with a planted orphan, a Flink job imported from savepoint directories only, and a
Statekeeper job with a planted orphan. Real Flink 2.3 directories (private copies), real
Statekeeper snapshots, Spark in-process on the session's SparkSession.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.flink.import_job import import_flink
from tests.airflow.test_maintenance_dags import (
    Env,
    KeyedJob,
    plant,
    returned,
    task_states,
)
from tests.airflow.test_maintenance_dags import dag_of as dag_of  # noqa: F401  (a fixture)
from tests.airflow.test_maintenance_dags import env as env  # noqa: F401  (a fixture)
from tests.fixtures.catalog import on_both_databases

pytest_generate_tests = on_both_databases

ARCHIVE = Path(os.environ.get("STATEKEEPER_FLINK_FIXTURES", "/work/shared/flink")) / (
    "flink-java-dev.tar.gz"
)
ROCKS_JOB = "0cf791d2fa2585d18b369593e6ac454d"
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


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copy2)
    return dst


def _tree(root: Path) -> dict[str, tuple[int, float]]:
    return {
        str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime)
        for f in root.rglob("*")
        if f.is_file()
    }


def _orphan(path: Path) -> Path:
    path.write_bytes(b"nobody references me")
    os.utime(path, (OLD, OLD))
    return path


@pytest.fixture
def mix(env: Env, java_fixture: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:  # noqa: F811
    flink = tmp_path / "flink"
    managed = _copy(java_fixture / "rocksdb" / "checkpoints" / ROCKS_JOB, flink / "m" / ROCKS_JOB)
    readonly = _copy(
        java_fixture / "hashmap" / "checkpoints" / HASHMAP_JOB, flink / "r" / HASHMAP_JOB
    )
    savepoints = _copy(java_fixture / "hashmap" / "savepoints", flink / "sp")
    with env.catalog() as cat:
        import_flink(cat, [str(managed)], "flink-managed", manage=["retention", "orphans"])
        import_flink(cat, [str(readonly)], "flink-readonly")  # read-only: the default
        import_flink(cat, [str(savepoints)], "flink-savepoints", manage=["retention", "orphans"])
        KeyedJob(cat, env.storage, "orders", "canonical").checkpoints(4)
    yield {
        "managed": managed,
        "managed_orphan": _orphan(managed / "shared" / "lost-sst"),
        "readonly": readonly,
        "readonly_orphan": _orphan(readonly / "shared" / "lost-sst"),
        "savepoints": savepoints,
        "orders_orphan": plant(env.storage, "orders/chk-99/lost.parquet", age_days=5),
    }


def test_the_maintenance_dag_deletes_only_in_managed_jobs_and_says_what_it_skipped(
    dag_of: Callable[[str], Any],  # noqa: F811
    env: Env,  # noqa: F811
    mix: dict[str, Path],
) -> None:
    untouched = {k: _tree(mix[k]) for k in ("readonly", "savepoints")}

    dagrun = dag_of("statekeeper_maintenance").test()

    assert dagrun.state == "success", task_states(dagrun)
    jobs = returned(dagrun, "list_jobs")[0]
    assert jobs == ["flink-managed", "flink-readonly", "flink-savepoints", "orders"]
    states = task_states(dagrun)
    assert states["maintain.compaction"] == ["skipped"] * 4  # no delta chain anywhere
    assert states["maintain.expire"] == ["success", "skipped", "success", "success"]
    assert states["maintain.orphan_cleanup"] == ["success", "skipped", "skipped", "success"]

    # deleted in the managed jobs only
    assert not mix["managed_orphan"].exists() and not mix["orders_orphan"].exists()
    assert {k: _tree(mix[k]) for k in untouched} == untouched
    assert mix["readonly_orphan"].exists()

    # what was skipped, per job and why, in the plan list_jobs pushed (and logged)
    plan = _xcom(dagrun, "list_jobs", "plan")
    assert plan["policies"] == {
        "flink-managed": "retention,orphans",
        "flink-readonly": "read-only",
        "flink-savepoints": "retention,orphans",
        "orders": "retention,orphans",
    }
    reasons = {(s["job"], s["step"]): s["reason"] for s in plan["skipped"]}
    assert set(reasons) == {
        ("flink-readonly", "expire"),
        ("flink-readonly", "orphan_cleanup"),
        ("flink-savepoints", "orphan_cleanup"),
    }
    assert "read-only for Statekeeper" in reasons[("flink-readonly", "expire")]
    grant = "set-policy flink-readonly --manage orphans"
    assert grant in reasons[("flink-readonly", "orphan_cleanup")]
    assert "savepoint directories only" in reasons[("flink-savepoints", "orphan_cleanup")]

    # every deletion is in its run's report, by path, with its bytes
    with env.catalog() as cat:
        runs = {(r.job, r.kind): r for r in cat.list_runs()}
    assert set(runs) == {
        ("flink-managed", "expire"),
        ("flink-managed", "orphan_cleanup"),
        ("flink-savepoints", "expire"),
        ("orders", "expire"),
        ("orders", "orphan_cleanup"),
    }
    assert {r.status for r in runs.values()} == {"SUCCEEDED"}
    flink_orphans = runs[("flink-managed", "orphan_cleanup")].stats
    assert flink_orphans is not None
    deleted = flink_orphans["stats"]["deleted"]
    assert deleted["items"] == [mix["managed_orphan"].as_uri()]
    assert deleted["bytes"] == len(b"nobody references me")
    orders_orphans = runs[("orders", "orphan_cleanup")].stats
    assert orders_orphans is not None
    assert mix["orders_orphan"].as_uri() in orders_orphans["stats"]["deleted"]["items"]
    assert orders_orphans["stats"]["bytes_deleted"] > 0
    with Catalog.open(env.url) as cat:
        assert cat.get_job("flink-readonly").manage == ()


def _xcom(dagrun: Any, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(
            run_id=dagrun.run_id, key=key, dag_ids=dagrun.dag_id, task_ids=task_id
        ).with_only_columns(XComModel.value)
        [row] = session.execute(query).all()
    return XComModel.deserialize_value(row)
