"""Snapshots written with snappy compression (``execution.checkpointing.snapshot-compression``).

The fixtures were taken without compression, so the compressed variants are built here from the
real files: every key group (canonical) or state section (heap) re-wrapped in a snappy framed
stream by an independent compressor, then decoded and compared with the original's entries.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from state_engine.errors import FlinkStateError
from state_engine.flink.keyed_state import (
    _heap_section,
    canonical_entries,
    heap_entries,
    read_proxy_header,
)
from state_engine.flink.metadata import read_metadata
from state_engine.flink.pyflink import PyFlinkTypes
from state_engine.flink.serializers import Buf
from state_engine.flink.snappy import STREAM_IDENTIFIER, decompress_block, read_framed
from state_engine.flink.snapshot_state import snapshot_rows

from .conftest import assert_pyflink_state, delegate_of


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _literal(data: bytes) -> bytes:
    n = len(data) - 1
    if n < 60:
        return bytes([n << 2]) + data
    return bytes([61 << 2]) + struct.pack("<H", n) + data


def compress(data: bytes) -> bytes:
    """Greedy snappy: 4-byte matches become 2-byte-offset copies (overlaps allowed)."""
    out = bytearray(_varint(len(data)))
    seen: dict[bytes, int] = {}
    lit_start = i = 0
    while i + 4 <= len(data):
        cand = seen.get(data[i : i + 4])
        seen[data[i : i + 4]] = i
        if cand is not None and 0 < i - cand <= 0xFFFF:
            size = 4
            while i + size < len(data) and size < 64 and data[cand + size] == data[i + size]:
                size += 1
            if lit_start < i:
                for j in range(lit_start, i, 60000):
                    out += _literal(data[j : min(i, j + 60000)])
            out += bytes([((size - 1) << 2) | 2]) + struct.pack("<H", i - cand)
            i += size
            lit_start = i
        else:
            i += 1
    for j in range(lit_start, len(data), 60000):
        out += _literal(data[j : min(len(data), j + 60000)])
    return bytes(out)


def framed(data: bytes) -> bytes:
    """xerial-style framing: identifier, then compressed and raw chunks of <= 64 KiB (CRC 0)."""
    out = bytearray(STREAM_IDENTIFIER)
    out += b"\xfe\x02\x00\x00ok"  # a skippable chunk
    for k, j in enumerate(range(0, len(data), 65536)):
        piece = data[j : j + 65536]
        body = compress(piece) if k % 2 == 0 else piece
        out += bytes([0 if k % 2 == 0 else 1]) + (len(body) + 4).to_bytes(3, "little")
        out += b"\x00\x00\x00\x00" + body
    return bytes(out)


@given(st.one_of(st.binary(max_size=3000), st.text(max_size=400).map(lambda t: (t * 7).encode())))
def test_snappy_block_round_trips(data: bytes) -> None:
    assert decompress_block(compress(data)) == data
    plain, end = read_framed(framed(data), 0, len(framed(data)), "x")
    assert plain == data and end == len(framed(data))


def test_overlapping_copy_and_bad_offsets() -> None:
    # "ab" then copy offset 2, length 6 -> "abababab"
    block = _varint(8) + _literal(b"ab") + bytes([((6 - 1) << 2) | 2]) + struct.pack("<H", 2)
    assert decompress_block(block) == b"abababab"
    with pytest.raises(FlinkStateError, match="copy offset"):
        decompress_block(_varint(4) + bytes([((4 - 1) << 2) | 2]) + struct.pack("<H", 9))
    with pytest.raises(FlinkStateError, match="stream identifier"):
        read_framed(b"\x00\x01\x00\x00x", 0, 5, "x")


def _entries(it: Any) -> list[tuple[Any, ...]]:
    return [(e.key_group, e.state, e.key, str(e.user_key), repr(e.value), e.expires_at) for e in it]


def test_compressed_canonical_savepoint_decodes_like_the_original(flink_fixtures: Any) -> None:
    sp = flink_fixtures.java_savepoints("rocksdb") / "savepoint-0cf791-4e6d47a2e332"
    meta = read_metadata(str(sp))
    kh = meta.operator("agg").subtasks[1].keyed_handles[0]
    data = delegate_of(kh).read_bytes()
    header = read_proxy_header(data, "x")
    starts = sorted(o for o in kh.offsets if o)
    out = bytearray(data[: header.end])
    out[4] = 1  # usingKeyGroupCompression
    new_offsets = []
    for off in kh.offsets:
        if off == 0:
            new_offsets.append(0)
            continue
        i = starts.index(off)
        end = starts[i + 1] if i + 1 < len(starts) else len(data)
        new_offsets.append(len(out))
        out += framed(data[off:end])
    original = _entries(canonical_entries(data, list(kh.offsets), 128, "plain"))
    assert len(out) < len(data)  # the copies did compress
    assert _entries(canonical_entries(bytes(out), new_offsets, 128, "snappy")) == original


def test_compressed_heap_snapshot_decodes_like_the_original(flink_fixtures: Any) -> None:
    sp = flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-1f90111708b1"
    meta = read_metadata(str(sp))
    kh = meta.operator("agg").subtasks[0].keyed_handles[0]
    data = delegate_of(kh).read_bytes()
    header = read_proxy_header(data, "x")
    out = bytearray(data[: header.end])
    out[4] = 1
    new_offsets = []
    for off in kh.offsets:
        new_offsets.append(len(out))
        buf = Buf(data, off)
        kg = buf.i32()
        out += struct.pack(">i", kg)
        for _ in header.states:
            start = buf.pos
            for _entry in _heap_section(header, buf, kg, "x"):
                pass
            out += framed(data[start : buf.pos])
    start_kg = kh.key_groups.start
    original = _entries(heap_entries(data, list(kh.offsets), start_kg, "plain"))
    assert _entries(heap_entries(bytes(out), new_offsets, start_kg, "snappy")) == original
    truncated = bytes(out[: new_offsets[1] - 3])
    with pytest.raises(FlinkStateError):
        list(heap_entries(truncated, new_offsets[:2], start_kg, "snappy"))


# Written by a real Flink 2.3.0 (apache-flink==2.3.0, hashmap backend, snapshot compression on)
# running data/pyflink-snappy/job.py: a canonical and a native savepoint, 128 KB in all.
REAL = Path(__file__).parent / "data" / "pyflink-snappy"


def _positions(meta: Any) -> dict[str, int]:
    """Next index per split from the (compressed) SourceReaderState elements."""
    out = {}
    for op in meta.operators:
        for sub in op.subtasks:
            h = sub.managed_operator_state
            if h is None or not any(e.name == "SourceReaderState" for e in h.states):
                continue
            data = h.delegate.read_bytes()
            for e in h.states:
                for off in e.offsets:
                    plain, _ = read_framed(data, off, len(data), "op", identifier=False)
                    p = 4 + 8  # byte[] length, SimpleVersionedSerialization header
                    (n,) = struct.unpack_from(">H", plain, p)
                    (out[plain[p + 2 : p + 2 + n].decode()],) = struct.unpack_from(
                        ">q", plain, p + 2 + n
                    )
    return out


@pytest.mark.parametrize("kind", ["canonical", "native"])
def test_real_flink_compressed_savepoints_equal_the_jobs_input(kind: str) -> None:
    (sp,) = (REAL / kind).iterdir()
    meta = read_metadata(str(sp))
    for sub in meta.operator("agg").subtasks:
        (kh,) = sub.keyed_handles
        assert read_proxy_header(delegate_of(kh).read_bytes(), "x").compression
    types = PyFlinkTypes.parse(
        ["total=value:LONG", "recent=list:LONG", "merchants=map:STRING:LONG"]
    )
    rows = snapshot_rows(meta, limit=0, pyflink_types=types)
    assert_pyflink_state(rows, _positions(meta), lambda i: f"card-{i % 40:03d}")
