"""``statectl state show`` reads small snapshots without Spark, with the same rows as the Spark
path, and refuses bad requests before either starts."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

import state_engine.jobs.spark as spark_module
from state_engine.catalog import Catalog
from state_engine.cli.maintain import register
from state_engine.errors import InvalidJobParams, SnapshotNotUsable
from state_engine.jobs.state_inspect import show_rows
from state_engine.maintenance.state_local import plan_show, read_rows
from state_engine.snapshot.storage import CheckpointStorage
from tests.jobs.jobdata import make_snapshot


def statectl() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statectl")
    register(parser.add_subparsers(dest="command"))
    return parser


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, catalog_url: str, storage: Any) -> None:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", storage.root_url)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        started.append("build_spark")
        raise AssertionError("Spark was started")

    monkeypatch.setattr(spark_module, "build_spark", refuse)
    return started


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


@pytest.mark.spark
def test_the_local_read_gives_the_spark_paths_rows(
    spark: Any, catalog: Catalog, snapshot: Any
) -> None:
    sid = snapshot.record.id
    # every row, and a key and state filter together (each Spark read costs seconds)
    for filters in ({}, {"key": "user-7", "state": "tags"}):
        local = read_rows(plan_show(catalog, sid, **filters), limit=None)
        spark_rows = show_rows(spark, catalog, sid, limit=None, **filters)
        assert local, filters
        assert sorted(map(_key, local)) == sorted(map(_key, spark_rows)), filters
        # the same order on the columns Spark sorts by
        order = [(r["operator"], r["key_group"], r["key"], r["state"]) for r in local]
        assert order == [(r["operator"], r["key_group"], r["key"], r["state"]) for r in spark_rows]


def test_state_show_of_a_small_snapshot_starts_no_spark(
    catalog: Catalog,
    storage: CheckpointStorage,
    env: None,
    no_spark: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    made = make_snapshot(catalog, storage, keys=60)
    args = statectl().parse_args(
        ["state", "show", str(made.record.id), "--key", "user-4", "--json"]
    )
    assert args.handler(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["key"] for r in rows} == {"user-4"}
    assert no_spark == []


def test_refusals_come_before_any_spark_start(
    catalog: Catalog, storage: CheckpointStorage, env: None, no_spark: list[str]
) -> None:
    made = make_snapshot(catalog, storage, keys=20)
    native = catalog.begin_snapshot(
        "orders", location=storage.url_of("orders/n"), parallelism=1, format="NATIVE"
    )
    catalog.complete_snapshot(native.id, native.version)
    parser = statectl()
    for argv, error in (
        (["state", "show", str(native.id), "--spark"], SnapshotNotUsable),
        (["state", "show", str(made.record.id), "--state", "nope", "--spark"], InvalidJobParams),
        (["state", "show", str(made.record.id), "--operator", "x", "--spark"], InvalidJobParams),
    ):
        args = parser.parse_args(argv)
        with pytest.raises(error):
            args.handler(args)
    assert no_spark == []
