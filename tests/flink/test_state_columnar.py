"""The whole-state (numpy) decoder of canonical savepoints gives exactly the record-by-record
decoder's entries: on the real fixtures, on generated streams covering every layout it reads
vectorized (and the ones it hands back to the generic decoder), and on damaged bytes."""

from __future__ import annotations

import struct
from typing import Any

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
        (["k1", "k2", "k3", "k4", "k5"], ["café", "京东商城", "🍕-pizza", "\ud800lone"], True),
        (["ünïcode-key", "k2"], ["m"], False),  # a non-ASCII key: record by record
        (["x" * 200, "y"], ["m"], False),  # a key of >= 127 chars (two-byte length)
        (["nul\x00inside", "k"], ["m"], False),  # a NUL inside a key
        (["k"], ["m\x00n", "o"], False),  # a NUL inside a user key
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
