"""Real Flink 2.3 restores the savepoints the writer produces (state_engine.flink.rewrite).

One Java harness (tests/flink/java/RewriteHarness.java), compiled once per session with javac
against the apache-flink package's jars, runs every job on a MiniCluster in its own JVM: it
produces the source snapshots (a DataStream job with String and Long keys, Value/List/Map and
TTL state and event-time timers; a Flink SQL GROUP BY), and restores each rewritten savepoint at
its new max parallelism, where the job reports the whole state of every key it is asked about
and every timer that fires. The expected state is what the existing readers read from the source
snapshot, changed as the rewrite says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from state_engine.flink.metadata import read_metadata
from state_engine.flink.rewrite import RewriteOptions, rewrite_local
from state_engine.flink.rewrite.source import handle_header, source_records
from state_engine.flink.serializers import Buf
from state_engine.flink.snapshot_state import snapshot_entries
from state_engine.keygroups import assign_to_key_group
from tests.fixtures.flink_cluster import flink_home

pytestmark = [pytest.mark.flink, pytest.mark.slow]

HARNESS = Path(__file__).parent / "java" / "RewriteHarness.java"
N = 600  # records the source job processes before its snapshot
STATES = ("total", "merchants", "recent", "lastSeen", "seen", "perMerchant")


class Harness:
    def __init__(self, classes: Path, lib: Path, work: Path) -> None:
        self.classpath = f"{classes}{os.pathsep}{lib}/*"
        self.work = work

    def run(self, mode: str, **args: Any) -> str:
        argv = ["java", "-cp", self.classpath, "RewriteHarness", mode]
        for k, v in args.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
        return done.stdout

    def snapshot(self, mode: str, **args: Any) -> Path:
        out = self.run(mode, **args)
        line = next(x for x in out.splitlines() if x.startswith("SNAPSHOT "))
        return Path(line.split(" ", 1)[1])


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    home = flink_home()
    if home is None or not (home / "lib").is_dir() or shutil.which("javac") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no Flink distribution or javac (make test installs them; CI needs them)")
        pytest.skip("no Flink distribution (STATEKEEPER_FLINK_HOME) or no javac")
    assert home is not None
    classes = tmp_path_factory.mktemp("rewrite-harness")
    built = subprocess.run(
        ["javac", "-nowarn", "-cp", f"{home / 'lib'}/*", "-d", str(classes), str(HARNESS)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return Harness(classes, home / "lib", tmp_path_factory.mktemp("rewrite-runs"))


@pytest.fixture(scope="module")
def hashmap_savepoint(harness: Harness) -> Path:
    """A canonical savepoint of the DataStream job on hashmap, max parallelism 128, p 2."""
    return harness.snapshot(
        "produce", backend="hashmap", maxp=128, p=2, n=N, out=harness.work / "hm", kind="canonical"
    )


# --- what went in ---


def _key_text(key: Any) -> Any:
    return key


def state_by_key(snapshot: Path) -> dict[tuple[str, Any], dict[str, Any]]:
    """(operator uid, key) -> every state of that key as the restored job reports it."""
    meta = read_metadata(str(snapshot))
    out: dict[tuple[str, Any], dict[str, Any]] = {}
    for op, _, e in snapshot_entries(meta):
        row = out.setdefault(
            (op.uid, e.key),
            {"total": None, "merchants": {}, "recent": [], "lastSeen": None, "seen": [],
             "perMerchant": {}},
        )  # fmt: skip
        if e.state in ("merchants", "perMerchant"):
            row[e.state][e.user_key] = e.value
        elif e.state in ("recent", "seen"):
            row[e.state] = list(e.value)
        else:
            row[e.state] = e.value
    return out


def timers_of(snapshot: Path) -> set[tuple[str, Any, int]]:
    """(operator uid, key, timestamp) of every event-time timer in the snapshot."""
    meta = read_metadata(str(snapshot))
    out = set()
    for op in meta.operators:
        for st in op.subtasks:
            kh = st.managed_keyed_state
            if kh is None:
                continue
            header, _ = handle_header(kh, "timers")
            states = header.by_name()
            for name, key, _ in source_records(
                kh, header, op.max_parallelism, kh.key_groups, "timers"
            ):
                if name == "_timer_state/event_user-timers":
                    p = 1 if op.max_parallelism <= 128 else 2
                    timer = states[name].value_serializer.read(Buf(key, p))
                    out.add((op.uid, timer["key"], timer["timestamp"]))
    return out


def restore(
    harness: Harness,
    savepoint: Path,
    name: str,
    keys: list[tuple[str, Any]],
    timers: int,
    **args: Any,
) -> tuple[dict[tuple[str, Any], dict[str, Any]], set[tuple[str, Any, int]]]:
    """Restore ``savepoint`` into the job and ask it for the state of ``keys``."""
    work = harness.work / name
    work.mkdir()
    probes = work / "keys.txt"
    uid_str = args.get("uid_str", "agg-str")
    lines = [f"s:{k}" if uid == uid_str else f"l:{k}" for uid, k in keys]
    probes.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    dump = work / "dump"
    harness.run(
        "restore", keys=probes, dump=dump, expect=len(keys) + timers, n=N, **{"from": savepoint},
        **args,
    )  # fmt: skip
    state: dict[tuple[str, Any], dict[str, Any]] = {}
    fired: set[tuple[str, Any, int]] = set()
    for f in sorted(dump.glob("*.jsonl")):
        uid = f.name.rsplit("-", 1)[0]
        for line in f.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "timer" in row:
                fired.add((uid, row["key"], row["timer"]))
                continue
            key = row.pop("key")
            assert (uid, key) not in state, f"{uid} {key!r} reported twice"
            state[(uid, key)] = row
    return state, fired


def normal(rows: dict[tuple[str, Any], dict[str, Any]]) -> dict[tuple[str, Any], Any]:
    """Lists compared as multisets (a restored list keeps its elements, in backend order)."""
    out = {}
    for k, row in rows.items():
        out[k] = {
            s: (sorted(v) if isinstance(v, list) else v) for s, v in row.items() if s in STATES
        }
    return out


def empty_row() -> dict[str, Any]:
    return {"total": None, "merchants": {}, "recent": [], "lastSeen": None, "seen": [],
            "perMerchant": {}}  # fmt: skip


# --- the proofs ---


def test_rescale_to_new_max_parallelism_restores_every_key_on_rocksdb(
    harness: Harness, hashmap_savepoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rescaled"
    report = rewrite_local(
        read_metadata(str(hashmap_savepoint)),
        RewriteOptions(max_parallelism=300, parallelism=3),
        None,
        str(out),
    )
    assert set(report["max_parallelism_changed"]) >= {"agg-str", "agg-long", "src", "sink"}
    expected = state_by_key(hashmap_savepoint)
    timers = timers_of(hashmap_savepoint)
    assert len(expected) > 50 and len(timers) == len(expected)
    # the rewritten keys sit in their new key groups (read back by the readers)
    for op, _, e in snapshot_entries(read_metadata(str(out))):
        assert e.key_group == assign_to_key_group(e.key, 300), (op.uid, e)
    got, fired = restore(
        harness, out, "rescale", sorted(expected, key=repr), len(timers),
        backend="rocksdb", maxp=300, p=3,
    )  # fmt: skip
    assert normal(got) == normal(expected)
    assert fired == timers


def test_rocksdb_incremental_checkpoint_written_canonical_restores_into_hashmap(
    harness: Harness, tmp_path: Path
) -> None:
    chk = harness.snapshot(
        "produce", backend="rocksdb", maxp=128, p=2, n=N, out=harness.work / "rk", kind="checkpoint"
    )
    meta = read_metadata(str(chk))
    assert meta.kind == "checkpoint"
    assert {kh.type for op in meta.operators for st in op.subtasks for kh in st.keyed_handles} == {
        "incremental"
    }
    out = tmp_path / "canonical"
    rewrite_local(meta, RewriteOptions(max_parallelism=256), None, str(out))
    written = read_metadata(str(out))
    assert (written.kind, written.format) == ("savepoint", "canonical")
    expected = state_by_key(chk)
    timers = timers_of(chk)
    got, fired = restore(
        harness, out, "backend-switch", sorted(expected, key=repr), len(timers),
        backend="hashmap", maxp=256, p=2,
    )  # fmt: skip
    assert normal(got) == normal(expected)
    assert fired == timers


def _ttl_elements(snapshot: Path, state: str) -> dict[tuple[str, Any], list[tuple[int, int]]]:
    """(uid, key) -> [(value, lastAccessTimestamp)] of every element of TTL list ``state``."""
    meta = read_metadata(str(snapshot))
    out: dict[tuple[str, Any], list[tuple[int, int]]] = {}
    for op in meta.operators:
        for st in op.subtasks:
            kh = st.managed_keyed_state
            if kh is None:
                continue
            header, _ = handle_header(kh, "ttl")
            info = header.by_name().get(state)
            if info is None:
                continue
            p = 1 if op.max_parallelism <= 128 else 2
            for name, key, value in source_records(
                kh, header, op.max_parallelism, kh.key_groups, "ttl"
            ):
                if name != state:
                    continue
                k = header.key_serializer.read(Buf(key, p))
                buf = Buf(value)
                elems = []
                while buf.pos < buf.end:
                    v = info.value_serializer.element.read(buf)  # type: ignore[attr-defined]
                    elems.append((v.value, v.timestamp))
                    if buf.pos < buf.end:
                        buf.u8()
                out[(op.uid, k)] = elems
    return out


def test_ttl_cleanup_drops_exactly_the_expired_entries(
    harness: Harness, hashmap_savepoint: Path, tmp_path: Path
) -> None:
    meta = read_metadata(str(hashmap_savepoint))
    stamps = sorted(
        {e.expires_at for _, _, e in snapshot_entries(meta) if e.expires_at is not None}
    )
    assert len(stamps) > 2, "the source job wrote its state over too short a time"
    at = stamps[len(stamps) // 2]
    ttl = {"lastSeen": 0, "seen": 0, "perMerchant": 0}
    out = tmp_path / "ttl"
    rewrite_local(meta, RewriteOptions(max_parallelism=200, ttl=ttl, at=at), None, str(out))
    expected = state_by_key(hashmap_savepoint)
    elements = _ttl_elements(hashmap_savepoint, "seen")
    expired_any = 0
    for _, _, e in snapshot_entries(meta):
        if e.state in ttl and e.state != "seen" and (e.expires_at or 0) <= at:
            row = expected[(_uid_of(meta, e), e.key)]
            if e.state == "lastSeen":
                row["lastSeen"] = None
            else:
                del row["perMerchant"][e.user_key]
            expired_any += 1
    for k, elems in elements.items():
        expected[k]["seen"] = [v for v, ts in elems if ts > at]
    assert expired_any > 0
    timers = timers_of(hashmap_savepoint)
    got, fired = restore(
        harness, out, "ttl", sorted(expected, key=repr), len(timers),
        backend="hashmap", maxp=200, p=2,
    )  # fmt: skip
    assert normal(got) == normal(expected)
    assert fired == timers
    # a key whose TTL states all expired keeps no trace of them in the rewritten savepoint
    back = state_by_key(out)
    for k, row in expected.items():
        if row["lastSeen"] is None and not row["seen"] and not row["perMerchant"]:
            got_row = back.get(k, empty_row())
            assert got_row["lastSeen"] is None and got_row["seen"] == [], k


def _uid_of(meta: Any, e: Any) -> str:
    # the state's operator: String keys are agg-str's, int keys agg-long's
    return "agg-str" if isinstance(e.key, str) else "agg-long"


def test_dropped_state_and_changed_uid_restore_with_allow_non_restored_state(
    harness: Harness, hashmap_savepoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "surgery"
    report = rewrite_local(
        read_metadata(str(hashmap_savepoint)),
        RewriteOptions(
            max_parallelism=150,
            drop_states=("agg-str/merchants",),
            uids={"agg-long": "agg-long-v2"},
        ),
        None,
        str(out),
    )
    assert report["uid_changes"] == {"agg-long": "agg-long-v2"}
    expected = state_by_key(hashmap_savepoint)
    for (uid, _), row in expected.items():
        if uid == "agg-str":
            row["merchants"] = {}
    expected = {
        (("agg-long-v2" if uid == "agg-long" else uid), k): row
        for (uid, k), row in expected.items()
    }
    timers = {
        ("agg-long-v2" if uid == "agg-long" else uid, k, ts)
        for uid, k, ts in timers_of(hashmap_savepoint)
    }
    got, fired = restore(
        harness, out, "surgery", sorted(expected, key=repr), len(timers),
        backend="rocksdb", maxp=150, p=2, uid_long="agg-long-v2", allow_non_restored="true",
    )  # fmt: skip
    assert normal(got) == normal(expected)
    assert fired == timers


def _final_rows(directory: Path) -> dict[str, tuple[int, int]]:
    """The last changelog row per key the SQL job's sink wrote (+I / +U; -U retracts)."""
    final: dict[str, tuple[int, int]] = {}
    for f in sorted(directory.glob("rows-*.txt")):
        for line in f.read_text(encoding="utf-8").splitlines():
            kind, k, c, s = line.split("\t")
            if kind in ("+I", "+U"):
                final[k] = (int(c), int(s))
            elif kind == "-D":
                final.pop(k, None)
    return final


def test_flink_sql_group_by_rescaled_continues_as_an_uninterrupted_run(
    harness: Harness, tmp_path: Path
) -> None:
    first = harness.snapshot(
        "sql", backend="hashmap", maxp=128, p=2, n=N, out=harness.work / "sql1", phase="first"
    )
    out = tmp_path / "sql-rescaled"
    rewrite_local(read_metadata(str(first)), RewriteOptions(max_parallelism=256), None, str(out))
    harness.run(
        "sql", backend="rocksdb", maxp=256, p=2, n=N, out=harness.work / "sql2", phase="restore",
        **{"from": out},
    )  # fmt: skip
    harness.run(
        "sql", backend="hashmap", maxp=128, p=2, n=N, out=harness.work / "sql3", phase="full"
    )
    restored = _final_rows(harness.work / "sql2" / "rows")
    uninterrupted = _final_rows(harness.work / "sql3" / "rows")
    assert sum(c for c, _ in uninterrupted.values()) == 2 * N
    # the restored run's rows only cover keys seen after the restore; their totals count all
    for k, v in restored.items():
        assert uninterrupted[k] == v, k
    assert Counter(restored) and len(restored) > 10
