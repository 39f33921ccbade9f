"""Framing of canonical savepoint streams (``columnar._frame``: blocks of fixed-length runs,
prefetching) gives exactly what the plain one-step-per-record-depth framing gave: the same
arrays (values and dtypes), the same None for a stream that does not frame, the same exception
for offsets it cannot read. The plain framing is kept below, verbatim, as the reference; the
streams are generated (every layout framing meets: runs of one length, runs of varying lengths,
empty and uneven key groups, one- and two-byte key-group prefixes, a stream large enough to be
prefetched), the real fixtures' canonical savepoints, and damaged copies of them."""

from __future__ import annotations

import random
import struct
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.flink import columnar
from state_engine.flink.keyed_state import END_OF_KEY_GROUP_MARK
from state_engine.flink.metadata import SAVEPOINT_KEY_GROUPS, read_metadata
from tests.flink.test_state_columnar import _string_value

# --- the reference: framing one step per record depth, as it was before blocks ---

_EMPTY = np.zeros(0, dtype=np.int64)


def _reference_frame(data: bytes, offsets: list[int]) -> Any:
    n = len(data)
    starts = [o for o in offsets if o]
    groups = [i for i, o in enumerate(offsets) if o]
    if not starts or n < 8 or max(starts) > n - 2:
        return None if starts else (_EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    arr = np.frombuffer(data, dtype=np.uint8)
    i32 = np.ndarray((n - 3,), dtype=">i4", buffer=data, strides=(1,))
    i32_4 = np.ndarray((n - 7,), dtype=">i4", buffer=data, offset=4, strides=(1,))
    flag4 = arr[4:]
    u16 = np.ndarray((n - 1,), dtype=">u2", buffer=data, strides=(1,))
    cur = np.array(starts, dtype=np.int64)
    sid = u16[cur].astype(np.int64)
    cur += 2
    group = np.array(groups, dtype=np.int64)
    out_pos, out_kl, out_vl, out_sid, out_group = [], [], [], [], []
    try:
        for step in range(n // 9 + 1):
            kl = i32[cur]
            after_key = cur + kl
            vl = i32_4[after_key]
            nxt = after_key + vl
            nxt += 8
            out_pos.append(cur)
            out_kl.append(kl)
            out_vl.append(vl)
            out_sid.append(sid)
            out_group.append(group)
            if step & 15 == 15 and not _reference_lengths_ok(out_kl[-16:], out_vl[-16:]):
                return None
            flags = flag4[cur]
            if flags.max() >= 0x80:
                at = np.flatnonzero(flags >= 0x80)
                ends = nxt[at]
                mark = u16[ends]
                nxt[at] = ends + 2
                sid = sid.copy()
                sid[at] = mark
                done = mark == END_OF_KEY_GROUP_MARK
                if done.any():
                    keep = np.ones(cur.size, dtype=bool)
                    keep[at[done]] = False
                    nxt, sid, group = nxt[keep], sid[keep], group[keep]
                    if not nxt.size:
                        break
            cur = nxt
        else:
            return None
    except IndexError:
        return None
    if not _reference_lengths_ok(out_kl, out_vl):
        return None
    pos = np.concatenate(out_pos)
    klen = np.concatenate(out_kl).astype(np.int64)
    vlen = np.concatenate(out_vl).astype(np.int64)
    if (pos + 8 + klen + vlen > n).any():
        return None
    return pos, klen, vlen, np.concatenate(out_sid), np.concatenate(out_group)


def _reference_lengths_ok(key_lengths: list[Any], value_lengths: list[Any]) -> bool:
    return bool(np.concatenate(key_lengths).min() >= 1 and np.concatenate(value_lengths).min() >= 0)


def _outcome(frame: Any, data: bytes, offsets: list[int]) -> Any:
    try:
        return frame(data, offsets)
    except Exception as exc:  # the reference's exceptions (a negative offset it cannot read)
        return type(exc)


def _assert_frames_the_same(data: bytes, offsets: list[int]) -> Any:
    want = _outcome(_reference_frame, data, offsets)
    got = _outcome(columnar._frame, data, offsets)
    if want is None or isinstance(want, type):
        assert got is want
        return want
    assert isinstance(got, tuple) and len(got) == 5
    for w, g in zip(want, got, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    # what canonical_columns frames with: the same, and each record's first key byte
    records = columnar._frame_records(data, offsets)
    assert records is not None
    first = records[5]
    assert first.dtype == np.uint8
    np.testing.assert_array_equal(first, np.frombuffer(data, dtype=np.uint8)[want[0] + 4])
    return want


# --- generated streams ---

_MERCHANTS = ["amazon", "ikea", "café-de-flore", "Müller-Markt", "京东商城", "🍕-pizza-place"]


@cache
def _stream(
    keys: int,
    groups: int,
    seed: int = 0,
    *,
    skew: bool = False,
    long_keys: bool = False,
    prefix: int = 1,
    first_group: int = 0,
    states: str = "TLMR",
) -> tuple[bytes, list[int]]:
    """A canonical stream after a 64-byte stand-in header (framing does not read it), ``groups``
    key groups from ``first_group`` on (``skew``: keys spread at random, some key groups empty:
    offset 0); per key group the runs of states T (Long), L (two Longs, as a TTL value), M (a
    MAP: user keys of varying lengths, so records of varying lengths), R (a LIST of 1-3
    Longs)."""
    rnd = random.Random(seed)
    by_group: dict[int, list[int]] = {}
    for i in range(keys):
        by_group.setdefault(rnd.randrange(groups) if skew else i % groups, []).append(i)
    q = struct.Struct(">q").pack
    out = bytearray(bytes(range(64)))
    offsets = []
    for kg in range(groups):
        runs = []
        for sid, state in enumerate(states, start=1):
            recs = []
            for i in by_group.get(kg, []):
                k = (q(i) if long_keys else _string_value(f"card-{i:07d}")) + b"\x00"
                if state == "T":
                    recs.append((k, q(rnd.randrange(10**6))))
                elif state == "L":
                    recs.append((k, q(1_795_485_260_770) + q(rnd.randrange(10**12))))
                elif state == "M":
                    for m in rnd.sample(_MERCHANTS, 1 + i % 3):
                        recs.append((k + _string_value(m), b"\x00" + q(rnd.randrange(9))))
                else:
                    recs.append((k, b",".join(q(rnd.randrange(99)) for _ in range(1 + i % 3))))
            if recs:
                runs.append((sid, recs))
        if not runs:
            offsets.append(0)
            continue
        offsets.append(len(out))
        out += struct.pack(">H", runs[0][0])
        head = (first_group + kg).to_bytes(prefix, "big")
        for r, (_sid, recs) in enumerate(runs):
            for j, (k, v) in enumerate(recs):
                last = j == len(recs) - 1
                key = bytes([head[0] | (0x80 if last else 0)]) + head[1:] + k
                out += struct.pack(">i", len(key)) + key + struct.pack(">i", len(v)) + v
                if last:
                    out += struct.pack(">H", runs[r + 1][0] if r + 1 < len(runs) else 0xFFFF)
    return bytes(out), offsets


_SMALL = [
    _stream(40, 4),
    _stream(60, 8, 1, skew=True),
    _stream(120, 8, 2, skew=True, long_keys=True, states="TLR"),
    _stream(30, 1, 3, long_keys=True),
    _stream(200, 40, 4, prefix=2, first_group=300),
    _stream(200, 16, 5, long_keys=True, states="TL"),
    _stream(500, 300, 6, skew=True, prefix=2),  # more key groups than blocks are tried for
]


@pytest.mark.parametrize("index", range(len(_SMALL)))
def test_generated_streams_frame_the_same(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data, offsets = _SMALL[index]
    blocks: list[int] = []
    original = columnar._block

    def spy(*args: Any) -> int:
        taken: int = original(*args)
        blocks.append(taken)
        return taken

    monkeypatch.setattr(columnar, "_block", spy)
    assert _assert_frames_the_same(data, offsets) is not None
    if index < 6:  # some records framed as blocks (the last: too many key groups run at once)
        assert max(blocks, default=0) >= 2


def test_a_large_stream_frames_the_same_prefetched_and_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, offsets = _stream(12000, 128, 6)
    assert len(data) >= columnar._PREFETCH_MIN_DATA
    calls = {"block": 0, "prefetch": 0}
    block, prefetch = columnar._block, columnar._prefetch

    def block_spy(*args: Any) -> int:
        taken: int = block(*args)
        calls["block"] += taken
        return taken

    def prefetch_spy(*args: Any) -> Any:
        calls["prefetch"] += 1
        return prefetch(*args)

    monkeypatch.setattr(columnar, "_block", block_spy)
    monkeypatch.setattr(columnar, "_prefetch", prefetch_spy)
    records = _assert_frames_the_same(data, offsets)
    assert calls["block"] > len(records[0]) // 128 // 4  # many record depths taken as blocks
    assert calls["prefetch"] > 0


def test_every_truncation_of_a_small_stream_frames_the_same() -> None:
    data, offsets = _stream(9, 3, 7)
    for end in range(len(data) + 1):
        _assert_frames_the_same(data[:end], offsets)


def test_empty_and_unreadable_offsets_frame_the_same() -> None:
    data, offsets = _SMALL[0]
    for bad in ([0, 0, 0, 0], [], [len(data)], [-1], [-len(data) - 5], [offsets[0], -3]):
        _assert_frames_the_same(data, bad)


_LENGTHS = [0, 1, 2, 8, 9, -1, -2, -(2**31), 2**31 - 1, 10**6]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_streams_frame_the_same(data: st.DataObject) -> None:
    raw, offsets = data.draw(st.sampled_from(_SMALL))
    records = _reference_frame(raw, offsets)
    pos, klen = records[0], records[1]
    body = min(o for o in offsets if o)
    buf = bytearray(raw)
    damage = data.draw(st.sampled_from(["cut", "bytes", "length", "flag", "mark", "offsets"]))
    if damage == "cut":
        buf = buf[: data.draw(st.integers(0, len(raw)))]
    elif damage == "bytes":
        for at in data.draw(st.lists(st.integers(body, len(raw) - 1), min_size=1, max_size=3)):
            buf[at] = data.draw(st.integers(0, 255))
    elif damage in ("length", "flag"):
        i = data.draw(st.integers(0, len(pos) - 1))
        at = int(pos[i])
        if damage == "flag":
            buf[at + 4] ^= 0x80  # a run ends (or goes on) elsewhere
        else:
            if data.draw(st.booleans()):  # the value's length, else the key's
                at += 4 + int(klen[i])
            (old,) = struct.unpack_from(">i", buf, at)
            new = data.draw(
                st.sampled_from(_LENGTHS)
                | st.integers(-12, 12).map(lambda d: old + d)
                | st.integers(-(2**31), 2**31 - 1)
            )
            struct.pack_into(">i", buf, at, new)
    elif damage == "mark":  # a state id or a key group's end mark
        ends = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8)[pos + 4] >= 0x80)
        i = int(ends[data.draw(st.integers(0, len(ends) - 1))])
        at = int(pos[i] + 8 + klen[i] + records[2][i])
        struct.pack_into(">H", buf, at, data.draw(st.sampled_from([1, 2, 3, 4, 0xFFFF, 0x7FFF])))
    else:
        offsets = list(offsets)
        i = data.draw(st.integers(0, len(offsets) - 1))
        offsets[i] = data.draw(
            st.integers(-40, len(raw) + 4) | st.sampled_from([0, *[o for o in offsets if o]])
        )
    _assert_frames_the_same(bytes(buf), offsets)


def test_fixture_canonical_savepoints_frame_the_same(flink_fixtures: Any) -> None:
    dirs = []
    for backend in ("hashmap", "rocksdb"):
        dirs += sorted(flink_fixtures.java_savepoints(backend).iterdir())
    dirs += sorted(flink_fixtures.pyflink.glob("*/savepoints-canonical/*"))
    rnd = random.Random(0)
    streams = 0
    for d in dirs:
        meta = read_metadata(str(d))
        for op in meta.operators:
            for sub in op.subtasks:
                for kh in sub.keyed_handles:
                    if kh.type != SAVEPOINT_KEY_GROUPS or kh.delegate is None:
                        continue
                    raw, offsets = kh.delegate.read_bytes(), list(kh.offsets)
                    assert _assert_frames_the_same(raw, offsets) is not None
                    streams += 1
                    body = min(o for o in offsets if o)
                    for _ in range(10):
                        _assert_frames_the_same(raw[: rnd.randrange(body, len(raw))], offsets)
                        flipped = bytearray(raw)
                        flipped[rnd.randrange(body, len(raw))] ^= 1 << rnd.randrange(8)
                        _assert_frames_the_same(bytes(flipped), offsets)
    assert streams >= 3
