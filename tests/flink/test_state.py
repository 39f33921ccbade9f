"""Keyed state of real Flink 2.3 snapshots, decoded from the bytes (issue 12, item 3).

The Java fixture's ``expected/`` files hold the exact state of every snapshot; the PyFlink job is
deterministic, so its state is recomputed here from the source positions the snapshot itself holds.
"""

from __future__ import annotations

import base64
import collections
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.errors import FlinkStateError, InvalidJobParams, UnsupportedFlinkSerializer
from state_engine.flink.keyed_state import canonical_records
from state_engine.flink.metadata import FlinkSnapshotMetadata, read_metadata
from state_engine.flink.pyflink import PyFlinkTypes
from state_engine.flink.snapshot_state import snapshot_entries, snapshot_raw_rows, snapshot_rows
from state_engine.hashing import java_string_hash, murmur_hash
from state_engine.keygroups import compute_operator_index_for_key_group

from .conftest import assert_pyflink_state, delegate_of, local_path

JAVA_SNAPSHOTS = [
    (backend, name)
    for backend in ("rocksdb", "hashmap")
    for name in ("chk-8", "chk-10", "chk-11", "savepoint-canonical-5", "savepoint-native-9")
]
PY_TYPES = PyFlinkTypes(
    {"total": "value:LONG", "recent": "list:LONG", "merchants": "map:STRING:LONG"}
)


def _manifest(fx: Any) -> dict[str, Any]:
    return json.loads((fx.java / "manifest.json").read_text())


def _java_meta(fx: Any, backend: str, name: str) -> tuple[FlinkSnapshotMetadata, dict[str, Any]]:
    info = _manifest(fx)["backends"][backend]
    (snap,) = [s for s in info["snapshots"] if s["expected_file"].endswith(f"/{name}.jsonl")]
    meta = read_metadata(str(fx.java / snap["path"]), job_dir=str(fx.java / info["job_dir"]))
    return meta, {**snap, "run": info["run"]}


def _expected_rows(path: Path) -> list[tuple[Any, ...]]:
    rows = []
    for line in path.read_text().splitlines():
        o = json.loads(line)
        k, kg = o["key"], o["key_group"]
        rows.append((kg, "total", k, None, json.dumps(o["total"])))
        rows.append((kg, "lastSeen", k, None, json.dumps(o["lastSeen"])))
        rows.append((kg, "recent", k, None, json.dumps(o["recent"])))
        rows.extend((kg, "merchants", k, mk, json.dumps(mv)) for mk, mv in o["merchants"].items())
    return sorted(rows, key=str)


@pytest.mark.parametrize(("backend", "name"), JAVA_SNAPSHOTS)
def test_java_snapshot_state_equals_expected(flink_fixtures: Any, backend: str, name: str) -> None:
    meta, snap = _java_meta(flink_fixtures, backend, name)
    rows = snapshot_rows(meta, limit=0)
    assert {r["operator"] for r in rows} == {"agg"}
    assert all(r["namespace"] is None for r in rows)
    got = sorted(
        (
            (
                r["key_group"],
                r["state"],
                r["key"],
                r["user_key"],
                json.dumps(json.loads(r["value"])),
            )
            for r in rows
        ),
        key=str,
    )
    assert got == _expected_rows(flink_fixtures.java / snap["expected_file"])
    assert len({r["key"] for r in rows}) == snap["keys"]
    # TTL: the stored lastAccessTimestamp, a processing time inside the run's window
    run = snap["run"]
    stamps = [r["expires_at"] for r in rows if r["state"] == "lastSeen"]
    assert len(stamps) == snap["keys"]
    assert all(run["start_ms"] <= t <= run["end_ms"] for t in stamps)
    assert all(r["expires_at"] is None for r in rows if r["state"] != "lastSeen")


def test_entries_sit_in_their_subtasks_key_group_range(flink_fixtures: Any) -> None:
    meta, snap = _java_meta(flink_fixtures, "hashmap", "chk-11")
    expected = {
        json.loads(line)["key"]: json.loads(line)
        for line in (flink_fixtures.java / snap["expected_file"]).read_text().splitlines()
    }
    seen = 0
    for op, subtask, e in snapshot_entries(meta):
        assert (
            compute_operator_index_for_key_group(op.max_parallelism, op.parallelism, e.key_group)
            == subtask
        )
        assert expected[e.key]["subtask"] == subtask
        seen += 1
    assert seen > len(expected)


def test_limit_zero_is_every_row_and_limit_cuts(flink_fixtures: Any) -> None:
    meta, _ = _java_meta(flink_fixtures, "hashmap", "savepoint-canonical-5")
    every = snapshot_rows(meta, limit=0)
    assert snapshot_rows(meta, limit=7) == every[:7]
    one = snapshot_rows(meta, state="merchants", key="card-000004")
    assert one and {(r["state"], r["key"]) for r in one} == {("merchants", "card-000004")}


def _source_positions(meta: FlinkSnapshotMetadata) -> dict[str, int]:
    """Next index per split, from the source's SourceReaderState (NumberSequenceSplit)."""
    out = {}
    for op in meta.operators:
        for sub in op.subtasks:
            h = sub.managed_operator_state
            if (
                h is None
                or h.delegate is None
                or not any(e.name == "SourceReaderState" for e in h.states)
            ):
                continue
            data = h.delegate.read_bytes()
            for e in h.states:
                for off in e.offsets:
                    p = off + 4 + 8  # byte[] length, then SimpleVersionedSerialization header
                    (n,) = struct.unpack_from(">H", data, p)
                    split = data[p + 2 : p + 2 + n].decode()
                    (out[split],) = struct.unpack_from(">q", data, p + 2 + n)
    return out


# one snapshot per format (RocksDB incremental, canonical, RocksDB native, heap checkpoint, heap
# native savepoint); the other PyFlink snapshots share these code paths
PY_SNAPSHOTS = [
    "rocks/checkpoints/92444c5a6956ad1f4e7301b84f30217c/chk-2",
    "rocks/savepoints-canonical/savepoint-92444c-91ea7d0af903",
    "rocks/savepoints-native/savepoint-92444c-e1bf658f2800",
    "hashmap/checkpoints/5914b5bc33e17d723e41702377437184/chk-3",
    "hashmap/savepoints-native/savepoint-5914b5-08e3ded7d15f",
]


@pytest.mark.parametrize("path", PY_SNAPSHOTS)
def test_pyflink_state_equals_the_jobs_deterministic_input(flink_fixtures: Any, path: str) -> None:
    meta = read_metadata(str(flink_fixtures.pyflink / path))
    positions = _source_positions(meta)
    assert set(positions) == {"1", "2"}
    rows = snapshot_rows(meta, limit=0, pyflink_types=PY_TYPES)
    assert_pyflink_state(rows, positions, lambda i: f"card-{i % 5000:06d}")
    # PyFlink keys by Row.of(key): Row.hashCode() = String.hashCode() + 62
    for r in rows:
        assert r["key_group"] == murmur_hash(java_string_hash(r["key"]) + 62) % 128


def test_pyflink_without_hints_keeps_lists_and_guesses_coders(flink_fixtures: Any) -> None:
    meta = read_metadata(str(flink_fixtures.pyflink / PY_SNAPSHOTS[1]))
    rows = snapshot_rows(meta, key="card-000019")
    by_state = {(r["state"], r["user_key"]): json.loads(r["value"]) for r in rows}
    hinted = {
        (r["state"], r["user_key"]): json.loads(r["value"])
        for r in snapshot_rows(meta, key="card-000019", pyflink_types=PY_TYPES)
    }
    assert by_state[("total", None)] == [hinted[("total", None)]]  # a Java one-element list
    assert {k: v for k, v in by_state.items() if k[0] != "total"} == {
        k: v for k, v in hinted.items() if k[0] != "total"
    }
    with pytest.raises(FlinkStateError, match="KIND"):
        PyFlinkTypes.parse(["total=number:LONG"])


def _copy_savepoint(flink_copy: Any, fx: Any) -> Path:
    """A private copy of the hashmap job's canonical savepoint (id 5)."""
    return flink_copy(fx.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1")


def test_unknown_serializer_names_state_and_class_and_raw_still_reads(
    flink_fixtures: Any, flink_copy: Any
) -> None:
    sp = _copy_savepoint(flink_copy, flink_fixtures)
    meta = read_metadata(str(sp))
    assert meta.format == "canonical"
    files = [delegate_of(kh) for st in meta.operator("agg").subtasks for kh in st.keyed_handles]
    long_cls = b"org.apache.flink.api.common.typeutils.base.LongSerializer$LongSerializerSnapshot"
    pojo_cls = b"org.apache.flink.api.java.typeutils.runtime.PojoSerializerSnapshot"
    for h in files:
        path = local_path(h)
        data = path.read_bytes()
        # the first Long snapshot is the value serializer of state "total"; same-length patch
        # keeps the key-group offsets valid
        at = data.index(long_cls)
        patched = pojo_cls + b"_" * (len(long_cls) - len(pojo_cls))
        path.write_bytes(data[:at] + patched + data[at + len(long_cls) :])
    with pytest.raises(UnsupportedFlinkSerializer) as err:
        snapshot_rows(meta)
    text = str(err.value)
    assert "'total'" in text and "PojoSerializerSnapshot" in text and "--raw" in text
    raw = list(snapshot_raw_rows(meta))
    count = sum(
        1
        for h in files
        for _ in canonical_records(local_path(h).read_bytes(), list(_offsets(meta, h)), "x")
    )
    assert len(raw) == count > 0
    assert {r["state"] for r in raw} == {"#0", "#1", "#2", "#3"}  # header unreadable: ids
    first = base64.b64decode(raw[0]["key"])
    assert first[0] == raw[0]["key_group"]


def _offsets(meta: FlinkSnapshotMetadata, handle: Any) -> tuple[int, ...]:
    for sub in meta.operator("agg").subtasks:
        for kh in sub.keyed_handles:
            if kh.delegate is handle:
                return kh.offsets
    raise AssertionError("handle not found")


def test_raw_heap_rows_are_whole_key_groups(flink_fixtures: Any) -> None:
    meta, _ = _java_meta(flink_fixtures, "hashmap", "chk-8")
    raw = list(snapshot_raw_rows(meta))
    assert [r["key_group"] for r in raw] == list(range(128))
    (h0,) = meta.operator("agg").subtasks[0].keyed_handles
    data = delegate_of(h0).read_bytes()
    first = base64.b64decode(raw[0]["value"])
    assert data[h0.offsets[0] : h0.offsets[1]] == first
    assert struct.unpack(">i", first[:4])[0] == 0  # a heap key group starts with its id


def test_raw_rocksdb_rows_name_column_families(flink_fixtures: Any) -> None:
    meta, _ = _java_meta(flink_fixtures, "rocksdb", "chk-10")
    raw = list(snapshot_raw_rows(meta, "agg"))
    decoded = snapshot_rows(meta, limit=0)
    assert {r["state"] for r in raw} == {"total", "lastSeen", "merchants", "recent"}
    assert len(raw) == len(decoded)  # one record per map entry, per value, per list


def test_truncated_keyed_file_is_an_error_naming_file_and_offset(
    flink_fixtures: Any, flink_copy: Any
) -> None:
    sp = _copy_savepoint(flink_copy, flink_fixtures)
    meta = read_metadata(str(sp))
    h = delegate_of(meta.operator("agg").subtasks[0].keyed_handles[0])
    path = local_path(h)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FlinkStateError) as err:
        snapshot_rows(meta)
    assert path.name in str(err.value) and "byte" in str(err.value)


def test_missing_rocksdb_file_is_an_error_not_empty_state(
    flink_fixtures: Any, flink_copy: Any
) -> None:
    job = flink_copy(flink_fixtures.java_job("rocksdb"))
    chk = job / "chk-11"
    meta = read_metadata(str(chk), job_dir=str(job))
    sst = next(
        local_path(lf.handle)
        for lf in meta.operator("agg").subtasks[0].keyed_handles[0].shared
        if not lf.handle.inline
    )
    Path(sst).unlink()
    with pytest.raises(FlinkStateError, match="missing|No such file"):
        snapshot_rows(read_metadata(str(chk), job_dir=str(job)))


def test_fixture_tree_is_left_untouched(flink_fixtures: Any) -> None:
    # the RocksDB reader rebuilds instances in temporary directories, never next to the snapshot
    meta, _ = _java_meta(flink_fixtures, "rocksdb", "savepoint-native-9")
    before = sorted(p.name for p in Path(meta.directory).iterdir())
    snapshot_rows(meta, limit=1)
    assert sorted(p.name for p in Path(meta.directory).iterdir()) == before


@pytest.fixture(scope="module")
def damaged_inputs(flink_fixtures: Any) -> dict[str, tuple[bytes, list[int], int]]:
    """Two key groups of a canonical and of a heap savepoint file: (bytes, offsets, first kg)."""
    out = {}
    for name, sp in (
        ("canonical", "savepoint-24b66e-d8d099a6f7d1"),
        ("heap", "savepoint-24b66e-1f90111708b1"),
    ):
        meta = read_metadata(str(flink_fixtures.java_savepoints("hashmap") / sp))
        kh = meta.operator("agg").subtasks[0].keyed_handles[0]
        data = delegate_of(kh).read_bytes()
        offsets = [o for o in kh.offsets if o][:3]
        out[name] = (data[: offsets[2]], offsets[:2], kh.key_groups.start)
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_bit_flips_decode_or_fail_with_a_flink_state_error(
    damaged_inputs: dict[str, tuple[bytes, list[int], int]], data: st.DataObject
) -> None:
    from state_engine.flink.keyed_state import canonical_entries, heap_entries

    kind = data.draw(st.sampled_from(sorted(damaged_inputs)))
    raw, offsets, first = damaged_inputs[kind]
    at = data.draw(st.integers(offsets[0], len(raw) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = raw[:at] + bytes([raw[at] ^ (1 << bit)]) + raw[at + 1 :]
    try:
        if kind == "canonical":
            list(canonical_entries(flipped, offsets, 128, "damaged"))
        else:
            list(heap_entries(flipped, offsets[:1], first, "damaged"))
    except FlinkStateError as exc:
        assert "damaged" in str(exc)


def test_corrupt_sst_block_is_an_error_not_partial_state(
    flink_fixtures: Any, flink_copy: Any
) -> None:
    # RocksDB iterators stop at a bad block as if the data ended; only status() says otherwise
    sp = flink_copy(flink_fixtures.java_savepoints("rocksdb") / "savepoint-0cf791-72b072c25cc0")
    meta = read_metadata(str(sp))
    sst = next(
        local_path(lf.handle)
        for lf in meta.operator("agg").subtasks[0].keyed_handles[0].shared
        if not lf.handle.inline
    )
    data = bytearray(sst.read_bytes())
    for i in range(100, 2000, 50):
        data[i] ^= 0xFF
    sst.write_bytes(bytes(data))
    with pytest.raises(FlinkStateError, match="Corruption|checksum"):
        snapshot_rows(read_metadata(str(sp)))


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("name", ["savepoint-canonical-5", "savepoint-native-9", "chk-11"])
def test_limit_gives_the_first_rows_of_the_whole_sorted_state(
    flink_fixtures: Any, backend: str, name: str
) -> None:
    meta, _ = _java_meta(flink_fixtures, backend, name)
    every = snapshot_rows(meta)
    for limit in (1, 7, 300, len(every) + 5):
        assert snapshot_rows(meta, limit=limit) == every[:limit]
    merchants = [r for r in every if r["state"] == "merchants"]
    assert snapshot_rows(meta, state="merchants", limit=4) == merchants[:4]
    key = every[-1]["key"]
    assert snapshot_rows(meta, key=key, limit=2) == [r for r in every if r["key"] == key][:2]
    with pytest.raises(InvalidJobParams, match="states with rows: lastSeen, merchants"):
        snapshot_rows(meta, state="nope", limit=3)


def test_limit_decodes_only_the_key_groups_it_needs(
    flink_fixtures: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from state_engine.flink import keyed_state

    meta, _ = _java_meta(flink_fixtures, "hashmap", "savepoint-canonical-5")
    decoded: collections.Counter[str] = collections.Counter()
    original = keyed_state.StateDecoder.decode

    def counting(self: Any, state: Any, key: bytes, value: bytes) -> Any:
        decoded["records"] += 1
        return original(self, state, key, value)

    monkeypatch.setattr(keyed_state.StateDecoder, "decode", counting)
    # the canonical file is decoded into Arrow tables; Python entries are made from them only
    # for the key groups the first rows need
    from state_engine.flink import columnar

    original_entries = columnar.Columns.entries

    def counting_entries(self: Any, *args: Any) -> Any:
        for e in original_entries(self, *args):
            decoded["entries"] += 1
            yield e

    monkeypatch.setattr(columnar.Columns, "entries", counting_entries)
    rows = snapshot_rows(meta, limit=3)
    first_kgs = {r["key_group"] for r in rows}
    total = sum(1 for _ in snapshot_entries(meta))
    decoded.clear()
    snapshot_rows(meta, limit=3)
    assert len(rows) == 3 and max(first_kgs) <= 2
    assert decoded["records"] == 0  # no record decoded one at a time: all vectorized
    assert 0 < decoded["entries"] < total / 20
