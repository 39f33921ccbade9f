"""Inspecting snapshots with Spark, and the job command lines (statectl and spark-submit)."""

from __future__ import annotations

import argparse
import json

import pytest

from state_engine.cli.maintain import register
from state_engine.errors import InvalidJobParams, NoSuchSnapshot, SnapshotNotUsable
from state_engine.jobs import __main__ as jobs_main
from state_engine.jobs.state_inspect import show_rows, snapshot_frame
from state_engine.keygroups import assign_to_key_group
from state_engine.maintenance.inputs import load_input
from state_engine.maintenance.state_decode import decoder_specs, parse_key, read_plan, render
from state_engine.serde import IntSerializer, StrSerializer
from tests.jobs.jobdata import OP, T0, TTL_MS, make_snapshot

pytestmark = pytest.mark.spark


def expected_rows(made, key=None, state=None):
    out = []
    for r in made.rows:
        k = r.key.decode()  # str keys: StrSerializer writes UTF-8
        if (key is None or k == key) and (state is None or r.state == state):
            out.append((r.key_group, k, r.state, r.expires_at))
    return sorted(out)


def test_frame_decodes_every_row(spark, catalog, snapshot):
    df = snapshot_frame(spark, catalog, snapshot.record.id)
    rows = df.collect()
    assert len(rows) == len(snapshot.rows)
    got = sorted((r.key_group, r.key, r.state, r.expires_at) for r in rows)
    assert got == expected_rows(snapshot)
    assert {r.operator for r in rows} == {OP}
    by_key = {(r.key, r.state, r.namespace, r.user_key): r.value for r in rows}
    # user-4 was written with count 4, list ["user-4-a", "user-4-b"], tags x=4 and w=-4 in ns 1
    assert by_key[("user-4", "count", None, None)] == "4"
    assert by_key[("user-4", "seen", None, "0")] == "user-4-a"
    assert by_key[("user-4", "seen", None, "1")] == "user-4-b"
    assert by_key[("user-4", "tags", None, "x")] == "4"
    assert by_key[("user-4", "tags", "1", "w")] == "-4"


def test_key_filter_reads_only_its_key_group(spark, catalog, snapshot):
    rows = show_rows(spark, catalog, snapshot.record.id, key="user-7", limit=None)
    assert sorted((r["key_group"], r["key"], r["state"], r["expires_at"]) for r in rows) == (
        expected_rows(snapshot, key="user-7")
    )
    assert {r["key_group"] for r in rows} == {assign_to_key_group("user-7", 128)}
    # the files read are only those whose key-group index holds that key group
    inp = load_input(catalog, snapshot.record.id)
    files, key_groups, _ = read_plan(inp, OP, decoder_specs(inp.meta), "user-7")
    assert len(files) == 1 and len(inp.keyed_files(OP)) > 1
    assert key_groups == (assign_to_key_group("user-7", 128),) * 2
    only_count = show_rows(spark, catalog, snapshot.record.id, key="user-7", state="count")
    assert [(r["state"], r["value"]) for r in only_count] == [("count", "7")]
    assert show_rows(spark, catalog, snapshot.record.id, key="nobody") == []


def test_state_filter_and_limit(spark, catalog, snapshot):
    rows = show_rows(spark, catalog, snapshot.record.id, state="seen", limit=None)
    assert len(rows) == len(expected_rows(snapshot, state="seen"))
    assert len(show_rows(spark, catalog, snapshot.record.id, limit=5)) == 5
    with pytest.raises(InvalidJobParams, match="no state 'nope'.*count, seen, tags"):
        snapshot_frame(spark, catalog, snapshot.record.id, state="nope")


def test_refuses_unreadable_snapshots(spark, catalog, snapshot, storage):
    pending = catalog.begin_snapshot("orders", location=storage.url_of("orders/x"), parallelism=1)
    with pytest.raises(SnapshotNotUsable, match="PENDING"):
        snapshot_frame(spark, catalog, pending.id)
    with pytest.raises(NoSuchSnapshot):
        snapshot_frame(spark, catalog, 12345)


def test_render_and_parse_key():
    assert render("a") == "a" and render(3) == "3" and render([1, "x"]) == '[1,"x"]'
    assert render(b"\x01\xff") == "01ff" and render(None) is None
    assert parse_key("42", IntSerializer()) == 42
    assert parse_key("42", StrSerializer()) == "42"
    with pytest.raises(InvalidJobParams, match="not a int key"):
        parse_key("x", IntSerializer())


# --- command lines ---


def statectl() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statectl")
    register(parser.add_subparsers(dest="command"))
    return parser


@pytest.fixture
def env(monkeypatch, tmp_path, catalog_url, storage):
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", storage.root_url)


def test_statectl_maintain_ttl_cleanup(spark, catalog, snapshot, env, capsys):
    args = statectl().parse_args(
        ["maintain", "ttl_cleanup", "--snapshot", str(snapshot.record.id), "--at",
         str(T0 + TTL_MS), "--run-id", "cli-1", "--dag-id", "ttl_dag", "--airflow-run-id", "m1"]
    )  # fmt: skip
    assert args.handler(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["run_id"] == "cli-1" and report["status"] == "SUCCEEDED"
    assert report["params"]["at"] == T0 + TTL_MS
    run = catalog.get_run("cli-1")
    assert (run.dag_id, run.airflow_run_id) == ("ttl_dag", "m1")
    assert run.output_snapshot_id == report["output_snapshot_id"]
    assert report["stats"]["states"][f"{OP}/count"]["dropped"] > 0


def test_statectl_state_show(spark, snapshot, env, capsys):
    parser = statectl()
    args = parser.parse_args(["state", "show", str(snapshot.record.id), "--key", "user-4"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["operator", "key_group", "state", "key", "namespace", "user_key",
                              "value", "expires_at"]  # fmt: skip
    assert len(out) == 2 + len(expected_rows(snapshot, key="user-4"))
    args = parser.parse_args(
        ["state", "show", str(snapshot.record.id), "--state", "count", "--limit", "3", "--json"]
    )
    assert args.handler(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and {r["state"] for r in rows} == {"count"}


def test_spark_submit_entry_point(spark, catalog, storage, env, capsys):
    made = make_snapshot(catalog, storage, job="sub", parallelism=1)
    code = jobs_main.main(["ttl_cleanup", "--job", "sub", "--at", str(T0), "--kind", "SAVEPOINT"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["input_snapshot_id"] == made.record.id
    assert catalog.get_snapshot(report["output_snapshot_id"]).kind == "SAVEPOINT"
    assert jobs_main.main(["ttl_cleanup", "--snapshot", "999"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "999" in err[0] and err[0].startswith("python -m state_engine.jobs")


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        jobs_main.main(["ttl_cleanup", "--kind", "BOTH"])
    assert exc.value.code == 2
    assert jobs_main.main([]) == 2
