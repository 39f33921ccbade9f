"""The whole-state (numpy) decoder of canonical savepoints gives exactly the record-by-record
decoder's entries: on the real fixtures, on generated streams covering every layout it reads
vectorized (and the ones it hands back to the generic decoder), and on damaged bytes."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.errors import FlinkStateError
from state_engine.flink import columnar
from state_engine.flink.columnar import canonical_columns
from state_engine.flink.keyed_state import canonical_entries
from state_engine.flink.metadata import SAVEPOINT_KEY_GROUPS, read_metadata


def _canonical_handles(fx: Any) -> list[tuple[bytes, list[int], int, str]]:
    dirs = []
    for backend in ("hashmap", "rocksdb"):
        dirs += sorted(fx.java_savepoints(backend).iterdir())
    dirs += sorted(fx.pyflink.glob("*/savepoints-canonical/*"))
    out = []
    for d in dirs:
        meta = read_metadata(str(d))
        for op in meta.operators:
            for sub in op.subtasks:
                for kh in sub.keyed_handles:
                    if kh.type == SAVEPOINT_KEY_GROUPS and kh.delegate is not None:
                        out.append(
                            (kh.delegate.read_bytes(), list(kh.offsets), op.max_parallelism, str(d))
                        )
    return out


def _by_state(entries: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Per state, its entries key group by key group, each key group's in the order given."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for e in entries:
        out.setdefault(e.state, []).append(
            (e.key_group, e.key, e.namespace, e.user_key, repr(e.value), e.expires_at)
        )
    return {name: sorted(rows, key=lambda r: r[0]) for name, rows in out.items()}


def _same(data: bytes, offsets: list[int], max_p: int) -> list[str]:
    """Asserts equality with the generic decoder; returns the states decoded record by record."""
    slow: list[str] = []
    original = columnar._slow_state

    def spy(*args: Any) -> Any:
        slow.append(args[2].name)
        return original(*args)

    columnar._slow_state = spy  # type: ignore[assignment]
    try:
        got = _by_state(
            e for c in canonical_columns(data, offsets, max_p, "t") for e in c.entries()
        )
    finally:
        columnar._slow_state = original  # type: ignore[assignment]
    assert got == _by_state(canonical_entries(data, offsets, max_p, "t"))
    return slow


def test_every_fixture_canonical_savepoint_decodes_the_same(flink_fixtures: Any) -> None:
    handles = _canonical_handles(flink_fixtures)
    assert len(handles) >= 3
    fast = 0
    for data, offsets, max_p, _where in handles:
        slow = _same(data, offsets, max_p)
        fast += not slow
    assert fast >= 2  # the Java job's states (String keys, Long/TTL/Map/List) all vectorized


# --- generated streams: the layouts one by one ---

HEADER_STATE = struct.Struct(">h")


def _string_value(s: str) -> bytes:
    units = [u for (u,) in struct.iter_unpack(">H", s.encode("utf-16-be", "surrogatepass"))]
    out = bytearray()
    for v in [len(units) + 1, *units]:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _stream(header: bytes, runs: dict[int, list[tuple[int, list[tuple[bytes, bytes]]]]]) -> Any:
    """A canonical stream: per key group, runs of (state id, [(key after prefix, value)])."""
    out = bytearray(header)
    offsets = []
    for kg in range(4):
        if kg not in runs:
            offsets.append(0)
            continue
        offsets.append(len(out))
        kg_runs = runs[kg]
        out += HEADER_STATE.pack(kg_runs[0][0])
        for r, (_sid, recs) in enumerate(kg_runs):
            for j, (k, v) in enumerate(recs):
                key = bytes([kg | (0x80 if j == len(recs) - 1 else 0)]) + k
                out += struct.pack(">i", len(key)) + key + struct.pack(">i", len(v)) + v
            out += struct.pack(">H", kg_runs[r + 1][0] if r + 1 < len(kg_runs) else 0xFFFF)
    return bytes(out), offsets


@pytest.fixture(scope="module")
def java_header(flink_fixtures: Any) -> bytes:
    from state_engine.flink.keyed_state import read_proxy_header

    sp = flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1"
    data = next(p for p in sp.iterdir() if p.name != "_metadata").read_bytes()
    return data[: read_proxy_header(data, "x").end]


def _ids(header: bytes) -> dict[str, int]:
    from state_engine.flink.keyed_state import read_proxy_header

    return {s.name: s.state_id for s in read_proxy_header(header, "x").states}


def _java_records(ids: dict[str, int], keys: list[str], merchants: list[str]) -> Any:
    q = struct.Struct(">q").pack
    runs = {}
    for kg in range(4):
        mine = [k for i, k in enumerate(keys) if i % 4 == kg]
        if not mine:
            continue
        kb = [_string_value(k) + b"\x00" for k in mine]
        runs[kg] = [
            (ids["total"], [(k, q(i * 7 - 3)) for i, k in enumerate(kb)]),
            (ids["lastSeen"], [(k, q(1_795_000_000_000 + i) + q(-i)) for i, k in enumerate(kb)]),
            (
                ids["merchants"],
                [(k + _string_value(m), b"\x00" + q(len(m))) for k in kb for m in merchants],
            ),
            (
                ids["recent"],
                [(k, b",".join(q(i + j) for j in range(1 + i % 3))) for i, k in enumerate(kb)],
            ),
        ]
    return runs


@pytest.mark.parametrize(
    "keys, merchants, vectorized",
    [
        (["a", "bb", "card-1", "x" * 100], ["amazon", "ikea"], True),
        (["k1", "k2", "k3", "k4", "k5"], ["café", "京东商城", "🍕-pizza", "Müller"], True),
        # a lone surrogate has no UTF-8 (no Arrow string): record by record
        (["k1", "k2"], ["café", "\ud800lone"], False),
        (["ünïcode-key", "k2"], ["m"], False),  # a non-ASCII key: record by record
        (["x" * 200, "y"], ["m"], False),  # a key of >= 127 chars (two-byte length)
        (["nul\x00inside", "k"], ["m"], True),  # a NUL inside a key: Arrow keeps it
        (["k"], ["m\x00n", "o"], True),  # a NUL inside a user key
        (["k"], ["m\x00ü", "o"], True),  # ... a non-ASCII one
        # many distinct non-ASCII user keys: their units reassembled with numpy
        (["k1", "k2", "k3", "k4"], [f"ü-{j}" for j in range(70)], True),
        (["k1", "k2", "k3", "k4"], [f"ü-{j}" for j in range(69)] + ["🍕"], True),
        # ... a NUL inside one of them (the reassembly's separator): record by record
        (["k1", "k2", "k3", "k4"], [f"ü-{j}" for j in range(69)] + ["\x00ü"], False),
    ],
)
def test_generated_layouts_decode_the_same(
    java_header: bytes, keys: list[str], merchants: list[str], vectorized: bool
) -> None:
    data, offsets = _stream(java_header, _java_records(_ids(java_header), keys, merchants))
    slow = _same(data, offsets, 128)
    assert (not slow) == vectorized


def test_map_null_values_and_uneven_lists_decode_the_same(java_header: bytes) -> None:
    ids = _ids(java_header)
    q = struct.Struct(">q").pack
    k = _string_value("key") + b"\x00"
    runs = {
        0: [
            (
                ids["merchants"],
                [(k + _string_value("a"), b"\x01"), (k + _string_value("b"), b"\x00" + q(1))],
            ),
            (ids["recent"], [(k, q(1)), (k, q(1) + b"," + q(2) + b"," + q(3))]),
        ]
    }
    data, offsets = _stream(java_header, runs)
    assert _same(data, offsets, 128) == ["merchants"]  # the null: record by record


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_damaged_streams_fail_like_the_generic_decoder(
    java_header: bytes, data: st.DataObject
) -> None:
    raw, offsets = _stream(
        java_header, _java_records(_ids(java_header), ["k1", "k22", "k333"], ["amazon", "café"])
    )
    at = data.draw(st.integers(offsets[0], len(raw) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = raw[:at] + bytes([raw[at] ^ (1 << bit)]) + raw[at + 1 :]
    try:
        expected: Any = _by_state(canonical_entries(flipped, offsets, 128, "damaged"))
    except FlinkStateError as exc:
        expected = type(exc)
    try:
        got: Any = _by_state(
            e for c in canonical_columns(flipped, offsets, 128, "damaged") for e in c.entries()
        )
    except FlinkStateError as exc:
        assert "damaged" in str(exc)
        got = type(exc)
    assert got == expected


def test_many_distinct_user_keys_go_through_the_unit_reassembly(
    java_header: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = columnar._unicode_strings

    def spy(*args: Any) -> Any:
        calls.append(len(args[1]))
        return original(*args)

    monkeypatch.setattr(columnar, "_unicode_strings", spy)
    runs = _java_records(_ids(java_header), ["k1", "k2"], [f"ü-{j}" for j in range(70)])
    data, offsets = _stream(java_header, runs)
    assert _same(data, offsets, 128) == []
    assert calls  # the dictionary path declined (too many distinct)


def test_columns_are_arrow_tables_of_typed_columns(java_header: bytes) -> None:
    ids = _ids(java_header)
    runs = _java_records(ids, ["a", "bb", "ccc"], ["amazon", "café", "京东"])
    data, offsets = _stream(java_header, runs)
    tables = {c.state.name: c.table for c in canonical_columns(data, offsets, 128, "t")}
    assert set(tables) == {"total", "lastSeen", "merchants", "recent"}
    for table in tables.values():
        assert table is not None
        assert table.column_names == list(columnar.COLUMNS)
        assert table.schema.field("key").type == pa.string()
        assert table.schema.field("key_group").type == pa.int32()
        assert table.column("namespace").null_count == table.num_rows
    assert tables["total"].schema.field("value").type == pa.int64()
    assert tables["lastSeen"].column("expires_at").null_count == 0
    assert tables["total"].column("expires_at").null_count == tables["total"].num_rows
    merchants = tables["merchants"]
    assert pa.types.is_dictionary(merchants.schema.field("user_key").type)
    assert sorted(set(merchants.column("user_key").to_pylist())) == ["amazon", "café", "京东"]
    assert tables["recent"].schema.field("value").type == pa.list_(pa.int64())
    # entries(start, stop) makes Python values of those rows only, the same as all of them
    cols = next(
        c for c in canonical_columns(data, offsets, 128, "t") if c.state.name == "merchants"
    )
    every = list(cols.entries())
    assert list(cols.entries(2, 5)) == every[2:5]
    assert list(cols.entries(len(cols) - 1, len(cols) + 10)) == every[-1:]


@pytest.mark.parametrize("kind, fmt", [("long", ">q"), ("int", ">i")])
def test_long_and_int_keys_decode_the_same(
    java_header: bytes, monkeypatch: pytest.MonkeyPatch, kind: str, fmt: str
) -> None:
    """The same states keyed by a Long or an Integer (the header's key serializer swapped)."""
    import dataclasses

    from state_engine.flink import keyed_state
    from state_engine.flink.serializers import _Scalar

    original = keyed_state.read_proxy_header
    key_ser = _Scalar(f"org.apache.flink.{kind}", struct.calcsize(fmt), kind=kind)

    def header(data: bytes, where: str, pos: int = 0) -> Any:
        return dataclasses.replace(original(data, where, pos), key_serializer=key_ser)

    monkeypatch.setattr(keyed_state, "read_proxy_header", header)
    monkeypatch.setattr(columnar, "read_proxy_header", header)
    ids = _ids(java_header)
    q = struct.Struct(">q").pack
    runs = {}
    for kg in range(4):
        keys = [struct.pack(fmt, v) + b"\x00" for v in (-(2**31), kg, 7 + kg, 2**31 - 1)]
        runs[kg] = [
            (ids["total"], [(k, q(i - kg)) for i, k in enumerate(keys)]),
            (ids["lastSeen"], [(k, q(1_795_000_000_000 + i) + q(i)) for i, k in enumerate(keys)]),
            (
                ids["merchants"],
                [(k + _string_value(m), b"\x00" + q(1)) for k in keys for m in "ab"],
            ),
            (ids["recent"], [(k, q(i) + b"," + q(-i)) for i, k in enumerate(keys)]),
        ]
    data, offsets = _stream(java_header, runs)
    assert _same(data, offsets, 128) == []
    table = next(c.table for c in canonical_columns(data, offsets, 128, "t"))
    assert table is not None and table.schema.field("key").type == (
        pa.int64() if kind == "long" else pa.int32()
    )


def test_a_key_group_prefix_not_its_sections_keeps_the_stream_order(java_header: bytes) -> None:
    """A record in key group 0's section whose prefix says 1 (the generic decoder reports it as
    written): the rows of each state come in stream order all the same."""
    raw, offsets = _stream(
        java_header, _java_records(_ids(java_header), ["k1", "k22", "k333"], ["amazon", "café"])
    )
    prefixes, at = [], offsets[0] + 2  # after the first state id: key group 0's records
    while True:
        (kl,) = struct.unpack_from(">i", raw, at)
        (vl,) = struct.unpack_from(">i", raw, at + 4 + kl)
        prefixes.append(at + 4)
        at += 8 + kl + vl
        if raw[prefixes[-1]] & 0x80:  # the last of its state: the next state id follows
            (mark,) = struct.unpack_from(">H", raw, at)
            at += 2
            if mark == 0xFFFF:
                break
    assert len(prefixes) == 5  # total, lastSeen, merchants x 2, recent
    for where, kg in itertools.product(prefixes, (1, 2, 3)):
        flipped = bytearray(raw)
        flipped[where] = (flipped[where] & 0x80) | kg
        assert _same(bytes(flipped), offsets, 128) == []
