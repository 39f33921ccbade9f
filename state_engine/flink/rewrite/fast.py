"""The rewrite's vectorised paths: a canonical (uncompressed) source handle read key group by key
group (only its byte range), its records framed once and turned into Arrow columns with numpy
(new key groups hashed in bulk for String, Long and Integer keys), and an output key group's
bytes assembled from Arrow columns in one pass."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from state_engine.errors import FlinkStateError
from state_engine.flink import metadata as md
from state_engine.flink.keyed_state import END_OF_KEY_GROUP_MARK, META_DATA_FOLLOWS_FLAG
from state_engine.flink.metadata import KeyedStateHandle
from state_engine.flink.rewrite.keys import BINARY_ROW
from state_engine.hashing import murmur_hash_array
from state_engine.keygroups import KeyGroupRange

__all__ = ["assemble_group", "frame_group", "key_group_ranges", "read_key_groups", "scalar_codes"]

_I32 = struct.Struct(">i").unpack_from
_U16 = struct.Struct(">H").unpack_from
_MASK = np.uint32(0xFFFFFFFF)


def key_group_ranges(kh: KeyedStateHandle, key_groups: KeyGroupRange) -> list[tuple[int, int, int]]:
    """``(key group, start, end)`` byte ranges (in the handle's stream) of the non-empty key
    groups of ``key_groups``: each runs to the next key group's start, the last to the end."""
    offsets = kh.offsets
    assert kh.delegate is not None
    if len(offsets) != len(kh.key_groups):
        raise FlinkStateError(
            f"a keyed handle of key groups {kh.key_groups.start}-{kh.key_groups.end} has "
            f"{len(offsets)} key-group offsets (the _metadata is damaged; re-copy the snapshot)"
        )
    size = kh.delegate.size
    starts = sorted(o for o in offsets if o)
    out = []
    for kg in key_groups:
        off = offsets[kg - kh.key_groups.start]
        if not off:
            continue
        i = np.searchsorted(starts, off, side="right")
        end = starts[i] if i < len(starts) else size
        if off >= size or end <= off:
            raise FlinkStateError(
                f"key-group offset {off} is past the end of the {size}-byte file "
                "(the file is truncated; re-copy the snapshot)"
            )
        out.append((kg, off, int(end)))
    return out


def read_key_groups(kh: KeyedStateHandle, key_groups: KeyGroupRange) -> Iterator[tuple[int, bytes]]:
    """Each non-empty key group of ``key_groups`` with its bytes, read one at a time (a seek
    and a read of its range; nothing else of the file)."""
    ranges = key_group_ranges(kh, key_groups)
    delegate = kh.delegate
    assert delegate is not None
    if not ranges:
        return
    if delegate.type == md.INLINE or delegate.location is None:
        data = delegate.read_bytes()
        for kg, start, end in ranges:
            yield kg, data[start:end]
        return
    from state_engine.snapshot.storage import open_url

    base = delegate.start_pos if delegate.type == md.SEGMENT else 0
    with open_url(delegate.location) as f:
        for kg, start, end in ranges:
            f.seek(base + start)
            chunk: bytes = f.read(end - start)
            if len(chunk) != end - start:
                raise FlinkStateError(
                    f"{delegate.location}: key group {kg} ends at byte {end} past the end of the "
                    "file (the file is truncated; re-copy the snapshot)"
                )
            yield kg, chunk


_BLOCK = 4096


def frame_group(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per record of one key group's bytes: its state id, the start of its key, of its value
    and its value's end (int64 arrays; a key ends 4 bytes before its value starts).

    Records are read one by one; after two in a row with the same key and value lengths, the
    run is extended in one numpy step (every predicted record's lengths and flag checked)."""
    n = len(data)
    if n < 10:
        raise FlinkStateError(f"{where}: key group of {n} bytes")
    arr = np.frombuffer(data, dtype=np.uint8)
    lens = np.ndarray((n - 3,), dtype=">i4", buffer=data, strides=(1,))
    chunks: list[tuple[Any, Any, Any, Any]] = []
    # 8 bytes a record each (a list of ints would hold an object per record)
    sids, keys, values, ends = array("q"), array("q"), array("q"), array("q")
    add_k, add_v, add_e, add_s = keys.append, values.append, ends.append, sids.append
    flag = META_DATA_FOLLOWS_FLAG
    sid = _U16(data, 0)[0]
    pos = 2
    prev_kl = prev_vl = -1
    wait = 0
    try:
        while True:
            kl = _I32(data, pos)[0]
            ks = pos + 4
            pos = ks + kl
            vl = _I32(data, pos)[0]
            vs = pos + 4
            pos = vs + vl
            if kl <= 0 or vl < 0 or pos > n:
                raise FlinkStateError(
                    f"{where}: record at byte {ks - 4} of its key group has a bad length "
                    f"(key {kl}, value {vl})"
                )
            add_k(ks)
            add_v(vs)
            add_e(pos)
            add_s(sid)
            if data[ks] & flag:
                sid = _U16(data, pos)[0]
                pos += 2
                if sid == END_OF_KEY_GROUP_MARK:
                    break
                prev_kl = -1
                continue
            if kl == prev_kl and vl == prev_vl:
                if wait:
                    wait -= 1
                    continue
                step = 8 + kl + vl
                m = min((n - pos) // step, _BLOCK)
                if m < 4:
                    continue
                at = pos + step * np.arange(m, dtype=np.int64)
                good = (lens[at] == kl) & (lens[at + 4 + kl] == vl) & (arr[at + 4] & flag == 0)
                taken = m if good.all() else int(good.argmin())
                if not taken:
                    wait = 16
                    continue
                chunks.append((sids, keys, values, ends))
                at = at[:taken]
                vals = at + 8 + kl
                chunks.append((np.full(taken, sid, np.int64), at + 4, vals, vals + vl))
                sids, keys, values, ends = array("q"), array("q"), array("q"), array("q")
                add_k, add_v, add_e, add_s = keys.append, values.append, ends.append, sids.append
                pos += taken * step
            prev_kl, prev_vl = kl, vl
    except struct.error as exc:
        raise FlinkStateError(f"{where}: key group truncated at byte {pos}") from exc
    chunks.append((sids, keys, values, ends))
    return tuple(  # type: ignore[return-value]
        np.concatenate([np.asarray(c[i], dtype=np.int64) for c in chunks]) for i in range(4)
    )


def gather(arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The ranges ``[start, start + length)`` of ``arr`` as an Arrow binary array."""
    from state_engine.flink.columnar import _gather

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    body = arr[_gather(starts, lengths)] if len(lengths) else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(
        pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )


def _polynomial(arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    from state_engine.hashing import _segmented_polynomial

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    from state_engine.flink.columnar import _gather

    units = arr[_gather(starts, lengths)].astype(np.uint32)
    return _segmented_polynomial(units, offsets).view(np.int32)


def scalar_codes(
    kind: str, arr: np.ndarray, at: np.ndarray, limit: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Java hashCodes of keys of serializer ``kind`` starting at ``at`` (each before its
    ``limit``), and which of them were hashed here (False: the caller hashes that one itself)."""
    n = len(at)
    if kind in ("long", "int"):
        width = 8 if kind == "long" else 4
        ok = at + width <= limit
        safe = np.where(ok, at, 0)
        idx = safe[:, None] + np.arange(width, dtype=np.int64)
        raw = arr[idx].copy().view(">i8" if width == 8 else ">i4").ravel()
        if width == 4:
            return raw.astype(np.int32), ok
        u = raw.astype(np.int64).view(np.uint64)
        return (u ^ (u >> np.uint64(32))).astype(np.uint32).view(np.int32), ok
    if kind == "string":
        # StringValue: length + 1 as a varint, then each char < 0x80 as one byte
        first = arr[np.minimum(at, len(arr) - 1)].astype(np.int64)
        ok = (first >= 1) & (first < 0x80) & (at < limit)
        count = np.where(ok, first - 1, 0)
        ok &= at + 1 + count <= limit
        count = np.where(ok, count, 0)
        starts = at + 1
        from state_engine.flink.columnar import _gather

        idx = _gather(starts, count)
        if idx.size:
            high = arr[idx] >= 0x80
            if high.any():
                owner = np.repeat(np.arange(n), count)
                ok[np.unique(owner[high])] = False
                count = np.where(ok, count, 0)
        codes = _polynomial(arr, starts, count)
        return codes, ok
    if kind == BINARY_ROW:
        return _binary_row_codes(arr, at, limit)
    return np.zeros(n, dtype=np.int32), np.zeros(n, dtype=bool)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    k1 = _rotl(k1 * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _binary_row_codes(
    arr: np.ndarray, at: np.ndarray, limit: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``BinaryRowData.hashCode`` of rows written as ``i32`` length + bytes (see
    :func:`~state_engine.flink.rewrite.keys.binary_row_hash`), rows of one length at a time."""
    n = len(at)
    codes = np.zeros(n, dtype=np.uint32)
    ok = at + 4 <= limit
    safe = np.where(ok, at, 0)
    length = arr[safe[:, None] + np.arange(4)].copy().view(">i4").ravel().astype(np.int64)
    ok &= (length >= 0) & (at + 4 + length <= limit)
    length = np.where(ok, length, -1)
    with np.errstate(over="ignore"):
        for size in np.unique(length[ok]).tolist():
            rows = np.flatnonzero(length == size)
            body = arr[(at[rows] + 4)[:, None] + np.arange(size, dtype=np.int64)]
            h1 = np.full(len(rows), 42, dtype=np.uint32)
            aligned = size - size % 4
            words = np.ascontiguousarray(body[:, :aligned]).view("<u4")
            for j in range(aligned // 4):
                h1 = _mix(h1, words[:, j])
            for j in range(aligned, size):
                h1 = _mix(h1, body[:, j].view(np.int8).astype(np.int32).view(np.uint32))
            h1 ^= np.uint32(size)
            h1 ^= h1 >> np.uint32(16)
            h1 *= np.uint32(0x85EBCA6B)
            h1 ^= h1 >> np.uint32(13)
            h1 *= np.uint32(0xC2B2AE35)
            h1 ^= h1 >> np.uint32(16)
            codes[rows] = h1
    return codes.view(np.int32), ok


def new_groups(codes: np.ndarray, max_parallelism: int) -> np.ndarray:
    """``murmurHash(code) % maxParallelism`` of every code."""
    return (murmur_hash_array(codes).astype(np.int64) % max_parallelism).astype(np.int32)


def assemble_group(
    kg: int,
    prefix_len: int,
    sid: np.ndarray,
    key: pa.Array,
    value: pa.Array,
    head: bool = True,
    following: int = END_OF_KEY_GROUP_MARK,
) -> bytes:
    """One key group's canonical bytes from its records sorted by (state, key): the first state
    id, each record ``len | prefix key | len | value`` (the prefix flagged on a state's last
    record, which is followed by the next state id or the end mark).

    A key group may be assembled in consecutive slices: ``head`` says whether this slice starts
    it (and so writes the first state id), ``following`` is the state id of the next slice's
    first record (the end mark after the last slice)."""
    n = len(sid)
    ko, kd = _offsets_data(key)
    vo, vd = _offsets_data(value)
    klen = np.diff(ko)
    vlen = np.diff(vo)
    last = np.ones(n, dtype=bool)
    last[:-1] = sid[1:] != sid[:-1]
    last[-1] = following != int(sid[-1])
    size = 4 + prefix_len + klen + 4 + vlen + 2 * last
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(size[:-1], out=start[1:])
    lead = 2 if head else 0
    start += lead
    total = lead + int(size.sum())
    out = np.zeros(total, dtype=np.uint8)
    if head:
        out[0:2] = np.frombuffer(int(sid[0]).to_bytes(2, "big"), np.uint8)
    four = np.arange(4, dtype=np.int64)
    out[start[:, None] + four] = (klen + prefix_len).astype(">i4").view(np.uint8).reshape(n, 4)
    prefix = kg.to_bytes(prefix_len, "big")
    out[start + 4] = np.where(last, prefix[0] | META_DATA_FOLLOWS_FLAG, prefix[0])
    if prefix_len == 2:
        out[start + 5] = prefix[1]
    kstart = start + 4 + prefix_len
    from state_engine.flink.columnar import _gather

    if kd.size:
        out[_gather(kstart, klen)] = kd
    vlpos = kstart + klen
    out[vlpos[:, None] + four] = vlen.astype(">i4").view(np.uint8).reshape(n, 4)
    vstart = vlpos + 4
    if vd.size:
        out[_gather(vstart, vlen)] = vd
    marks = np.full(n, following, dtype=np.int64)
    marks[:-1] = sid[1:]
    at = (vstart + vlen)[last]
    m = marks[last].astype(">u2").view(np.uint8).reshape(-1, 2)
    out[at[:, None] + np.arange(2)] = m
    return out.tobytes()


def _offsets_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    offsets = offsets.astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    base, stop = int(offsets[0]), int(offsets[-1])
    return offsets - base, data[base:stop]
