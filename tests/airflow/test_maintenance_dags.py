"""The maintenance DAGs run end to end with dag.test() on the session's Airflow home, their Spark
jobs in-process on the session's SparkSession, against real snapshots in a real SQLite catalog."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from statekeeper_airflow.operators import stable_run_id

from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.catalog import Catalog
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import SubtaskState
from state_engine.keygroups import (
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from state_engine.maintenance.plan import delta_chain
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.state import ValueStateDescriptor
from tests.airflow.sk_airflow_support import DAGS
from tests.jobs.jobdata import make_snapshot


@dataclass
class Env:
    url: str
    storage: CheckpointStorage

    def catalog(self) -> Catalog:
        return Catalog.open(self.url)


@pytest.fixture
def env(
    catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any
) -> Iterator[Env]:
    """A migrated catalog and a checkpoint root the DAGs' tasks see (they run in-process);
    ``spark`` is active, so the tasks reuse it instead of starting a JVM of their own."""
    root = (tmp_path / "checkpoints").as_uri()
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", root)
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    yield Env(catalog_url, CheckpointStorage(root))


def load_dag(dag_id: str) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


@pytest.fixture(scope="module")
def dag_of(airflow_home: Path) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}

    def get(dag_id: str) -> Any:
        if dag_id not in cache:
            cache[dag_id] = load_dag(dag_id)
        return cache[dag_id]

    return get


def task_states(dagrun: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ti in sorted(dagrun.get_task_instances(), key=lambda t: (t.task_id, t.map_index)):
        out.setdefault(ti.task_id, []).append(ti.state)
    return out


def returned(dagrun: Any, task_id: str) -> list[Any]:
    """Every return value of ``task_id`` in the run, in map-index order."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = (
            XComModel.get_many(
                run_id=dagrun.run_id, key="return_value", dag_ids=dagrun.dag_id, task_ids=task_id
            )
            .with_only_columns(XComModel.map_index, XComModel.value)
            .order_by(None)
            .order_by(XComModel.map_index)
        )
        rows = session.execute(query).all()
    return [XComModel.deserialize_value(r) for r in rows]


def asset_events(dagrun: Any) -> list[tuple[str, dict[str, Any]]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dagrun.dag_id)
            .where(AssetEvent.source_run_id == dagrun.run_id)
            .order_by(AssetEvent.id)
        ).all()
    return [(uri, dict(extra or {})) for uri, extra in rows]


# --- statekeeper_ttl_cleanup ---


def test_ttl_cleanup_writes_a_cleaned_snapshot_per_job_and_records_the_airflow_run(
    dag_of: Callable[[str], Any], env: Env
) -> None:
    with env.catalog() as cat:
        made = make_snapshot(cat, env.storage, job="orders", keys=120)
        cat.register_job("idle", max_parallelism=128)  # no snapshot: planned out, not failed

    dagrun = dag_of("statekeeper_ttl_cleanup").test()

    assert dagrun.state == "success", task_states(dagrun)
    assert task_states(dagrun) == {"plan": ["success"], "ttl_cleanup": ["success"]}
    [report] = returned(dagrun, "ttl_cleanup")
    assert report["kind"] == "ttl_cleanup" and report["job"] == "orders"
    assert report["input_snapshot_id"] == made.record.id
    # every row of `count` (processing-time TTL, written long before now) expired
    expired_count = sum(1 for r in made.rows if r.state == "count")
    assert report["rows_in"] == len(made.rows)
    assert report["rows_out"] == len(made.rows) - expired_count
    with env.catalog() as cat:
        latest = cat.latest_snapshot("orders")
        [run] = cat.list_runs(job="orders", kind="ttl_cleanup")
    assert latest is not None and latest.id == report["output_snapshot_id"] != made.record.id
    assert latest.entries == report["rows_out"]
    assert (run.status, run.dag_id, run.airflow_run_id) == (
        "SUCCEEDED",
        "statekeeper_ttl_cleanup",
        dagrun.run_id,
    )
    assert run.run_id == report["run_id"] and run.output_snapshot_id == latest.id
    # the id a retry of this task instance computes again: its second try would be a no-op
    assert run.run_id == stable_run_id(
        "ttl_cleanup",
        "orders",
        dag_id="statekeeper_ttl_cleanup",
        airflow_run_id=dagrun.run_id,
        task_id="ttl_cleanup",
        map_index=0,
    )
    assert asset_events(dagrun) == [
        (
            "statekeeper://orders/snapshots",
            {
                "snapshot_id": latest.id,
                "input_snapshot_id": made.record.id,
                "maintenance": "ttl_cleanup",
                "run_id": run.run_id,
                "rows_out": report["rows_out"],
                "bytes_out": report["bytes_out"],
            },
        )
    ]


# --- real checkpoints from a CheckpointManager ---

MAX_P = 128
COUNT = ValueStateDescriptor("count", int)
KEYS = [f"card-{i}" for i in range(40)]


class KeyedJob:
    """A two-subtask heap job checkpointed by a real CheckpointManager (canonical or delta)."""

    def __init__(self, catalog: Catalog, storage: CheckpointStorage, job: str, fmt: str) -> None:
        self.manager = CheckpointManager(
            catalog,
            storage,
            job,
            max_parallelism=MAX_P,
            parallelism=2,
            format=fmt,
            retained=20,  # retention is the DAG's business here, not the manager's
            row_group_bytes=2048,
        )
        factory = HeapBackendFactory(track_changes=fmt == "delta")
        self.subtasks = []
        for i in range(2):
            rng = compute_key_group_range_for_operator_index(MAX_P, 2, i)
            st = SubtaskState(i)
            st.keyed["agg"] = factory.create("agg", i, str, MAX_P, rng, None)
            st.operator["source"] = OperatorStateBackend(i, 2)
            st.operator["source"].get_list_state("offsets", int).add(i)
            self.subtasks.append(st)

    def checkpoints(self, n: int) -> list[Any]:
        records = []
        for r in range(n):
            for i, key in enumerate(KEYS):
                kg = assign_to_key_group(key, MAX_P)
                backend = next(
                    st.keyed["agg"] for st in self.subtasks if kg in st.keyed["agg"].key_group_range
                )
                backend.set_current_key(key)
                backend.get_state(COUNT).update(r * 1000 + i)
            records.append(self.manager.trigger(self.subtasks).result())
        self.manager.notify_checkpoint_complete()
        return records

    def counts(self, snapshot_id: int, parallelism: int = 3) -> dict[str, int]:
        restored = self.manager.restore(
            snapshot_id, parallelism=parallelism, factory=HeapBackendFactory()
        )
        out = {}
        for key in KEYS:
            kg = assign_to_key_group(key, MAX_P)
            backend = next(
                st.keyed["agg"] for st in restored.subtasks if kg in st.keyed["agg"].key_group_range
            )
            backend.set_current_key(key)
            out[key] = backend.get_state(COUNT).value()
        return out


def plant(storage: CheckpointStorage, relative: str, age_days: float) -> Path:
    """An unreferenced file under the checkpoint root, last modified ``age_days`` ago."""
    info = storage.write_file(relative, b"orphan")
    path = Path(urlparse(storage.url_of(info.path)).path)
    stamp = (datetime.now(UTC) - timedelta(days=age_days)).timestamp()
    os.utime(path, (stamp, stamp))
    return path


def runs_of(env: Env, job: str) -> dict[str, Any]:
    with env.catalog() as cat:
        return {r.kind: r for r in cat.list_runs(job=job)}


# --- statekeeper_maintenance ---


def test_maintenance_compacts_long_chains_expires_and_removes_orphans_per_job(
    dag_of: Callable[[str], Any], env: Env
) -> None:
    with env.catalog() as cat:
        orders = KeyedJob(cat, env.storage, "orders", "delta")
        chain = orders.checkpoints(6)  # a base and 5 deltas
        want = orders.counts(chain[-1].id)
        payments = KeyedJob(cat, env.storage, "payments", "canonical")
        pay = payments.checkpoints(5)
    old_orphan = plant(env.storage, "payments/chk-99/lost.parquet", age_days=5)
    young_orphan = plant(env.storage, "payments/chk-98/recent.parquet", age_days=1)

    dagrun = dag_of("statekeeper_maintenance").test()

    assert dagrun.state == "success", task_states(dagrun)
    by_job = dict(zip(returned(dagrun, "list_jobs")[0], range(2), strict=True))
    states = task_states(dagrun)
    assert states["maintain.compaction"][by_job["orders"]] == "success"
    assert states["maintain.compaction"][by_job["payments"]] == "skipped"  # no delta chain
    assert states["maintain.expire"] == ["success", "success"]
    assert states["maintain.orphan_cleanup"] == ["success", "success"]

    # orders: the chain folded into one canonical checkpoint that restores equal to it, the
    # chain's head released; then expire kept the newest 3 completed checkpoints (the compacted
    # one among them) and deleted the files of everything else
    [compacted] = returned(dagrun, "maintain.compaction")
    with env.catalog() as cat:
        latest = cat.latest_snapshot("orders")
        snapshots = cat.list_snapshots("orders")
        assert delta_chain(cat, "orders").deltas == 0  # the next hourly run compacts nothing
    assert latest is not None and latest.id == compacted["output_snapshot_id"]
    assert latest.format == "CANONICAL" and compacted["input_snapshot_id"] == chain[-1].id
    assert orders.counts(latest.id) == want
    completed = [s for s in snapshots if s.status == "COMPLETED"]
    assert len(completed) == 3 and completed[0].id == latest.id
    gone = [s for s in snapshots if s.status != "COMPLETED"]
    assert chain[-1].id in {s.id for s in gone} and len(gone) == len(chain) - 2
    for record in gone:
        location = Path(urlparse(record.location).path)
        assert not any(p.is_file() for p in location.rglob("*")), f"{location} still has files"
    assert runs_of(env, "orders")["expire"].stats["stats"]["snapshots_expired"] == len(gone) - 1

    # payments: the newest 3 checkpoints kept, the 2 older expired; only the old orphan deleted
    with env.catalog() as cat:
        completed = cat.list_snapshots("payments", status="COMPLETED")
    assert sorted(s.id for s in completed) == [s.id for s in pay[2:]]
    assert not old_orphan.exists() and young_orphan.exists()

    # every run carries this DAG run; the compaction produced the only asset event
    for job in ("orders", "payments"):
        for run in runs_of(env, job).values():
            assert (run.status, run.dag_id, run.airflow_run_id) == (
                "SUCCEEDED",
                "statekeeper_maintenance",
                dagrun.run_id,
            ), run
    assert set(runs_of(env, "orders")) == {"compaction", "expire", "orphan_cleanup"}
    assert set(runs_of(env, "payments")) == {"expire", "orphan_cleanup"}
    assert [(uri, extra["snapshot_id"]) for uri, extra in asset_events(dagrun)] == [
        ("statekeeper://orders/snapshots", latest.id)
    ]


# --- statekeeper_savepoint ---


def test_savepoint_captures_the_latest_snapshot_into_the_target_directory(
    dag_of: Callable[[str], Any], env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with env.catalog() as cat:
        made = make_snapshot(cat, env.storage, job="orders", keys=120)
    target = (tmp_path / "savepoints" / "before-upgrade").as_uri()
    # outside the job's checkpoint root: allowed only because the setting names it
    monkeypatch.setenv("STATEKEEPER_ALLOWED_SAVEPOINT_DIRS", (tmp_path / "savepoints").as_uri())

    dagrun = dag_of("statekeeper_savepoint").test(
        run_conf={"job": "orders", "target_dir": target, "drop_expired": True}
    )

    assert dagrun.state == "success", task_states(dagrun)
    [report] = returned(dagrun, "savepoint")
    assert report["input_snapshot_id"] == made.record.id
    # drop_expired: the processing-time TTL state `count` (written long ago) is left out
    expired = sum(1 for r in made.rows if r.state == "count")
    assert report["rows_out"] == len(made.rows) - expired
    with env.catalog() as cat:
        savepoint = cat.get_snapshot(report["output_snapshot_id"])
        [run] = cat.list_runs(job="orders", kind="savepoint")
    assert (savepoint.kind, savepoint.status) == ("SAVEPOINT", "COMPLETED")
    assert savepoint.location.rstrip("/") == target
    assert (tmp_path / "savepoints" / "before-upgrade" / "_metadata").is_file()
    assert (run.dag_id, run.airflow_run_id) == ("statekeeper_savepoint", dagrun.run_id)
    assert [uri for uri, _ in asset_events(dagrun)] == ["statekeeper://orders/snapshots"]


def test_savepoint_of_an_unknown_job_fails_at_once_and_is_recorded_failed(
    dag_of: Callable[[str], Any], env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    dagrun = dag_of("statekeeper_savepoint").test(run_conf={"job": "no-such-job"})

    assert dagrun.state == "failed"
    [ti] = dagrun.get_task_instances()
    # not retried: a missing job is not going to appear on a retry
    assert (ti.state, ti.try_number) == ("failed", 1)
    assert "savepoint of job 'no-such-job'" in capsys.readouterr().out
    with env.catalog() as cat:
        [run] = cat.list_runs(kind="savepoint")
    assert (run.status, run.dag_id, run.airflow_run_id) == (
        "FAILED",
        "statekeeper_savepoint",
        dagrun.run_id,
    )
    assert "no-such-job" in (run.error or "")


# --- statekeeper_rescale ---


def test_rescale_to_a_new_parallelism_restores_the_same_state(
    dag_of: Callable[[str], Any], env: Env
) -> None:
    with env.catalog() as cat:
        orders = KeyedJob(cat, env.storage, "orders", "canonical")
        [source] = orders.checkpoints(1)
        want = orders.counts(source.id)

    dagrun = dag_of("statekeeper_rescale").test(run_conf={"job": "orders", "parallelism": 3})

    assert dagrun.state == "success", task_states(dagrun)
    [report] = returned(dagrun, "rescale")
    assert report["input_snapshot_id"] == source.id
    with env.catalog() as cat:
        out = cat.get_snapshot(report["output_snapshot_id"])
        [run] = cat.list_runs(job="orders", kind="rescale")
    assert (out.parallelism, out.max_parallelism, out.status) == (3, MAX_P, "COMPLETED")
    assert orders.counts(out.id, parallelism=3) == want
    assert (run.dag_id, run.airflow_run_id, run.status) == (
        "statekeeper_rescale",
        dagrun.run_id,
        "SUCCEEDED",
    )


def trigger_params(dag: Any, conf: dict[str, Any]) -> Any:
    """The params a trigger with ``conf`` resolves: the serialized DAG's, as the API server and
    ``create_dagrun`` see them, with ``conf`` merged in."""
    from airflow.serialization.serialized_objects import DagSerialization

    served = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    return served.params.deep_merge(conf)


@pytest.mark.parametrize(
    ("conf", "param", "says"),
    [
        ({"job": "orders", "parallelism": 0}, "parallelism", "less than the minimum of 1"),
        ({"job": "orders", "parallelism": 40000}, "parallelism", "greater than the maximum"),
        ({"job": "orders", "parallelism": "three"}, "parallelism", "is not of type 'integer'"),
        (
            {"job": "orders", "parallelism": 2, "max_parallelism": 0},
            "max_parallelism",
            "less than the minimum of 1",
        ),
        ({"parallelism": 2}, "job", ""),
    ],
)
def test_rescale_params_out_of_range_are_refused_at_trigger_time(
    dag_of: Callable[[str], Any], conf: dict[str, Any], param: str, says: str
) -> None:
    from airflow.exceptions import ParamValidationError

    params = trigger_params(dag_of("statekeeper_rescale"), conf)
    with pytest.raises(ParamValidationError, match=f"param {param}") as refused:
        params.validate()
    assert says in str(refused.value)


def test_rescale_params_in_range_resolve_with_their_defaults(
    dag_of: Callable[[str], Any],
) -> None:
    params = trigger_params(dag_of("statekeeper_rescale"), {"job": "orders", "parallelism": 4})
    assert params.validate() == {
        "job": "orders",
        "parallelism": 4,
        "max_parallelism": None,
        "source_snapshot": None,
        "savepoint_dir": None,
    }
