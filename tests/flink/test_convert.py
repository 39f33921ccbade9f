"""A Flink snapshot converted into a Statekeeper canonical savepoint, registered in the catalog,
restored into the Statekeeper runtime at another parallelism with the same state (issue 12, item 4).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import CheckpointManager, HeapBackendFactory
from state_engine.cli import main
from state_engine.errors import FlinkConversionError
from state_engine.flink import convert
from state_engine.flink.keyed_state import catalog_flink_metadata
from state_engine.flink.pyflink import PyFlinkTypes
from state_engine.hashing import java_string_hash, murmur_hash
from state_engine.keygroups import compute_operator_index_for_key_group
from state_engine.serde import serializer_from_snapshot
from state_engine.snapshot.metadata import read_metadata, verify
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotKind
from state_engine.state import ManualClock

TTL_MS = 3_600_000  # the Java job's StateTtlConfig (fixture README)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STATEKEEPER_HOME", str(home))
    monkeypatch.delenv("STATEKEEPER_CATALOG_URL", raising=False)
    assert main(["catalog", "upgrade"]) == 0
    return home


def _catalog(home: Path) -> Catalog:
    return Catalog.open(f"sqlite:///{home / 'catalog.db'}")


def _register(cat: Catalog, job: str, directory: Path, checkpoint_id: int, kind: str) -> int:
    """A COMPLETED snapshot of a job of origin flink, as ``statectl flink import`` records it."""
    cat.register_job(job, max_parallelism=128, location=str(directory.parent), origin="flink")
    snap = cat.begin_snapshot(
        job, location=str(directory), parallelism=2, kind=kind, format="NATIVE",
        checkpoint_id=checkpoint_id,
    )  # fmt: skip
    return cat.complete_snapshot(snap.id, snap.version, bytes=0, entries=0).id


def _restored_state(cat: Catalog, root: Path, snapshot_id: int, parallelism: int, now: int) -> dict:
    """Every key's state after a restore into the Statekeeper runtime, decoded."""
    mgr = CheckpointManager(
        cat, str(root), "restored", max_parallelism=128, parallelism=parallelism
    )
    try:
        restored = mgr.restore(
            snapshot_id, parallelism=parallelism, factory=HeapBackendFactory(),
            clock=ManualClock(now),
        )  # fmt: skip
        meta = read_metadata(SnapshotDir.from_url(cat.get_snapshot(snapshot_id).location))
        (op,) = meta.operators
        sers = {
            name: {r: serializer_from_snapshot(s) for r, s in m["serializers"].items()}
            for name, m in op.states.items()
        }
        out: dict[str, dict[str, Any]] = {}
        for index, st in enumerate(restored.subtasks):
            for backend in st.keyed.values():
                with backend.snapshot_view() as view:
                    for e in view.iter_entries():
                        key = e.key.decode()
                        assert (
                            compute_operator_index_for_key_group(128, parallelism, e.key_group)
                            == index
                        )
                        o = out.setdefault(
                            key, {"key": key, "key_group": e.key_group, "merchants": {}}
                        )
                        value = sers[e.state]["value"].deserialize(e.value)
                        if e.state == "merchants":
                            assert e.user_key is not None  # a map entry has one
                            o["merchants"][sers[e.state]["user_key"].deserialize(e.user_key)] = (
                                value
                            )
                        elif e.state == "recent":
                            assert e.user_key is not None  # a list entry has its index
                            o.setdefault("_recent", []).append(
                                (struct.unpack(">I", e.user_key)[0], value)
                            )
                        else:
                            o[e.state] = value
                            if e.state == "lastSeen":
                                o["_expires"] = e.expires_at
                backend.close()
        for o in out.values():
            o["recent"] = [v for _, v in sorted(o.pop("_recent", []))]
        return out
    finally:
        mgr.close()


@pytest.mark.parametrize(
    ("backend", "snapshot", "cid", "kind"),
    [
        ("rocksdb", "checkpoints/0cf791d2fa2585d18b369593e6ac454d/chk-11", 11, "CHECKPOINT"),
        ("hashmap", "savepoints/savepoint-24b66e-d8d099a6f7d1", 5, "SAVEPOINT"),
    ],
)
def test_converted_flink_snapshot_restores_at_another_parallelism_with_the_same_state(
    home: Path, flink_fixtures: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    backend: str, snapshot: str, cid: int, kind: str,
) -> None:  # fmt: skip
    source = flink_fixtures.java / backend / snapshot
    expected_name = "chk-11" if cid == 11 else "savepoint-canonical-5"
    lines = (flink_fixtures.java / "expected" / backend / f"{expected_name}.jsonl").read_text()
    expected = {o["key"]: o for o in map(json.loads, lines.splitlines())}
    manifest = json.loads((flink_fixtures.java / "manifest.json").read_text())
    run = manifest["backends"][backend]["run"]
    with _catalog(home) as cat:
        sid = _register(cat, "fraud", source, cid, kind)
    target = (tmp_path / "converted").as_uri()
    code = main(["maintain", "savepoint", "--snapshot", str(sid), "--savepoint-dir", target,
                 "--ttl", f"lastSeen={TTL_MS}"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["skipped"]["operator_state"] == ["txn-source"]
    with _catalog(home) as cat:
        sp = cat.get_snapshot(report["output_snapshot_id"])
        assert (sp.kind, sp.format, sp.status, sp.job) == (
            "SAVEPOINT",
            "CANONICAL",
            "COMPLETED",
            "fraud",
        )
        assert catalog_flink_metadata(cat, sp.id) is None  # a Statekeeper snapshot now
        snap = SnapshotDir.from_url(sp.location, allow_shared=False)
        meta = read_metadata(snap)
        verify(snap, meta, deep=True)
        assert meta.kind is SnapshotKind.SAVEPOINT and meta.max_parallelism == 128
        state = _restored_state(cat, tmp_path / "sk-root", sp.id, 3, run["start_ms"])
    assert set(state) == set(expected)
    for key, o in expected.items():
        got = state[key]
        assert got["key_group"] == o["key_group"]
        assert (got["total"], got["lastSeen"], got["recent"], got["merchants"]) == (
            o["total"],
            o["lastSeen"],
            o["recent"],
            o["merchants"],
        )
        # expires_at = Flink's stored lastAccessTimestamp + the TTL given on the command line
        assert run["start_ms"] + TTL_MS <= got["_expires"] <= run["end_ms"] + TTL_MS
    assert report["rows_out"] == sum(
        3 + len(o["recent"]) - 1 + len(o["merchants"]) for o in expected.values()
    )


def test_pyflink_keys_keep_flinks_row_hash_and_key_group(
    home: Path, flink_fixtures: Any, tmp_path: Path
) -> None:
    source = flink_fixtures.pyflink / "rocks/savepoints-canonical/savepoint-92444c-91ea7d0af903"
    with _catalog(home) as cat:
        sid = _register(cat, "py", source, 4, "SAVEPOINT")
        types = PyFlinkTypes.parse(
            ["total=value:LONG", "recent=list:LONG", "merchants=map:STRING:LONG"]
        )
        report = convert.run(
            cat, sid, savepoint_dir=(tmp_path / "py-sp").as_uri(), pyflink_types=types
        )
        meta = read_metadata(SnapshotDir.from_url(report["output_location"], allow_shared=False))
        again = convert.run(cat, sid, pyflink_types=types, run_id=report["run_id"])
        assert again["recovered"] and again["output_snapshot_id"] == report["output_snapshot_id"]
        assert [r.status for r in cat.list_runs(job="py")] == ["SUCCEEDED"]
    from state_engine.snapshot.canonical import read_entries

    rows = list(
        read_entries(
            SnapshotDir.from_url(report["output_location"], allow_shared=False),
            meta,
            (0, 127),
            operator="agg",
        )
    )
    assert len(rows) == report["rows_out"] > 0
    for r in rows[:500]:
        key = r.key.decode()
        assert r.key_hash == java_string_hash(key) + 62  # Row.of(key).hashCode()
        assert r.key_group == murmur_hash(r.key_hash) % 128
    assert {m for m in meta.operators[0].states} == {"total", "recent", "merchants"}


def test_unconvertible_snapshot_leaves_nothing_behind(
    home: Path, flink_fixtures: Any, flink_copy: Any, tmp_path: Path
) -> None:
    sp = flink_copy(flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1")
    long_cls = b"org.apache.flink.api.common.typeutils.base.LongSerializer$LongSerializerSnapshot"
    kryo_cls = b"org.apache.flink.api.java.typeutils.runtime.kryo.KryoSerializerSnapshot"
    for f in sp.iterdir():
        if f.name != "_metadata":
            data = f.read_bytes()
            f.write_bytes(data.replace(long_cls, kryo_cls.ljust(len(long_cls), b"_"), 1))
    target = tmp_path / "never"
    with _catalog(home) as cat:
        sid = _register(cat, "fraud", sp, 5, "SAVEPOINT")
        with pytest.raises(FlinkConversionError, match="KryoSerializerSnapshot"):
            convert.run(cat, sid, savepoint_dir=target.as_uri())
        statuses = {s.id: s.status for s in cat.list_snapshots("fraud")}
        assert [r.status for r in cat.list_runs(job="fraud")] == ["FAILED"]
    assert statuses[sid] == "COMPLETED"
    assert [s for i, s in statuses.items() if i != sid] == ["FAILED"]
    assert not target.exists() or not any(target.iterdir())
    with pytest.raises(FlinkConversionError, match="STATE=MS"):
        convert.parse_ttl(["lastSeen=1h"])


def test_a_conversion_killed_after_its_metadata_recovers_on_retry(
    home: Path, flink_fixtures: Any, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys

    statectl = Path(sys.executable).parent / "statectl"
    source = flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1"
    with _catalog(home) as cat:
        sid = _register(cat, "fraud", source, 5, "SAVEPOINT")
    # the default savepoint directory: a retry writes under a new name (with a fixed
    # --savepoint-dir the killed attempt's registered _metadata name blocks the retry)
    argv = [str(statectl), "maintain", "savepoint", "--snapshot", str(sid), "--run-id", "conv-1"]
    env = {**os.environ, "STATEKEEPER_CRASH_AT": "commit.after_metadata"}
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with _catalog(home) as cat:
        (pending,) = [s for s in cat.list_snapshots("fraud") if s.id != sid]
        assert pending.status == "PENDING"
    env.pop("STATEKEEPER_CRASH_AT")
    retry = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0, retry.stderr
    report = json.loads(retry.stdout.splitlines()[-1])
    with _catalog(home) as cat:
        statuses = {s.id: s.status for s in cat.list_snapshots("fraud")}
        assert statuses == {
            sid: "COMPLETED",
            pending.id: "FAILED",
            report["output_snapshot_id"]: "COMPLETED",
        }
        assert [r.status for r in cat.list_runs(job="fraud")] == ["SUCCEEDED"]
        out = cat.get_snapshot(report["output_snapshot_id"])
    snap = SnapshotDir.from_url(out.location, allow_shared=False)
    verify(snap, read_metadata(snap), deep=True)
    # the killed attempt's directory is gone (or is the retry's own, reused)
    if pending.location != out.location:
        assert not Path(pending.location.removeprefix("file://")).exists()


def test_conversion_on_both_catalog_databases(
    catalog: Catalog, flink_fixtures: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    source = flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1"
    sid = _register(catalog, "fraud", source, 5, "SAVEPOINT")
    report = convert.run(catalog, sid, savepoint_dir=(tmp_path / "sp").as_uri())
    out = catalog.get_snapshot(report["output_snapshot_id"])
    assert (out.status, out.format, out.entries) == ("COMPLETED", "CANONICAL", report["rows_out"])
    # the newest snapshot is now the converted one; --job converts the newest *Flink* snapshot
    assert catalog.list_snapshots("fraud")[0].id == out.id
    assert convert.latest_flink_snapshot(catalog, "fraud") == sid
    stats = catalog.key_group_stats(out.id)
    assert len(stats) == 128 and sum(s.rows for s in stats) == report["rows_out"]
    (skew,) = catalog.key_group_skew(out.id)
    assert skew.operator == "agg" and skew.total_rows == report["rows_out"]
    expected = (flink_fixtures.java / "expected/hashmap/savepoint-canonical-5.jsonl").read_text()
    keys = {json.loads(line)["key"] for line in expected.splitlines()}
    state = _restored_state(catalog, tmp_path / "root", out.id, 5, 1_795_485_307_258)
    assert set(state) == keys
