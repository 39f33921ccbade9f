"""Fast decoding of canonical savepoint streams: whole states at once, with numpy, no per-record
dispatch.

:func:`canonical_columns` gives the same keyed state as
:func:`~state_engine.flink.keyed_state.canonical_entries`, one :class:`Columns` per state instead
of one ``Entry`` per record (a key group's records in stream order; key groups interleaved):

1. framing: the records of every key group are found together, one numpy step per record *depth*
   (all key groups advance at once: record i of every key group, then record i + 1, ...), through
   big-endian int32/uint16 views at every byte offset;
2. per state, a decoder compiled from its serializer tuple: the key-group prefix, the key (String
   with a one-byte length, Long, Integer), VoidNamespace, a MAP's user key, and the value (the
   fixed-width types, String, TTL wrappers of those, MAP values, LIST of fixed-width types) are
   read for every record of the state by numpy gathers, fixed widths through ``>i8``-style views,
   strings as one joined buffer decoded once (ASCII directly, else Flink's varint UTF-16 units
   reassembled with numpy) and split on a sentinel.

Anything outside those layouts (other serializers, nulls, a NUL inside a string, a length that
does not fit) decodes that state record by record with the generic
:class:`~state_engine.flink.keyed_state.StateDecoder`; a stream that does not frame (truncated or
corrupt) or is compressed falls back to the record-by-record reader as a whole, which names the
offset of the problem. The values are exactly the generic decoder's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from state_engine.flink.keyed_state import (
    END_OF_KEY_GROUP_MARK,
    LIST_DELIMITER,
    Entry,
    ProxyHeader,
    StateDecoder,
    StateInfo,
    canonical_entries,
    read_proxy_header,
)
from state_engine.flink.serializers import (
    FlinkSerializer,
    ListSerializer,
    MapSerializer,
    TtlSerializer,
)

Ints = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

#: fixed-width scalar kinds: numpy dtype and width
_FIXED: dict[str, tuple[str, int]] = {
    "long": (">i8", 8),
    "int": (">i4", 4),
    "short": (">i2", 2),
    "byte": ("i1", 1),
    "double": (">f8", 8),
    "float": (">f4", 4),
    "boolean": ("u1", 1),
}


@dataclass
class Columns:
    """The decoded records of one state: equal-length columns (None: every row has None)."""

    state: StateInfo
    key_group: list[int]
    key: list[Any]
    value: list[Any]
    user_key: list[Any] | None = None
    namespace: list[Any] | None = None
    expires_at: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.key)

    def entries(self) -> Iterator[Entry]:
        n = len(self.key)
        none = [None] * n
        name = self.state.name
        for kg, k, ns, uk, v, ts in zip(
            self.key_group,
            self.key,
            self.namespace or none,
            self.user_key or none,
            self.value,
            self.expires_at or none,
            strict=True,
        ):
            yield Entry(kg, name, k, ns, uk, v, ts)


class _Data:
    """The stream as numpy sees it: bytes, typed views at every byte offset, a 0 byte's index."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.n = len(data)
        if data[:1] == b"\x00":  # the header's version int starts with a 0 byte
            self.arr: Bytes = np.frombuffer(data, dtype=np.uint8)
            self.zero = 0
        else:
            self.arr = np.frombuffer(data + b"\x00", dtype=np.uint8)
            self.zero = self.n
        self._views: dict[str, Any] = {}

    def fixed(self, start: Ints, dtype: str, width: int) -> Any:
        """The ``dtype`` value at each of ``start`` (bounds checked by the caller)."""
        if width == 1:
            return self.arr[start].view(dtype)
        view = self._views.get(dtype)
        if view is None:
            view = self._views[dtype] = np.ndarray(
                (self.n - width + 1,), dtype=dtype, buffer=self.data, strides=(1,)
            )
        return view[start]


class _NoFastPath(Exception):
    """The layout is not one the vectorized decoder reads: decode record by record."""


def canonical_columns(
    data: bytes, offsets: list[int], max_parallelism: int, where: str
) -> Iterator[Columns]:
    """Every keyed state of one canonical savepoint file, one :class:`Columns` per state."""
    header = read_proxy_header(data, where)
    frames = None if header.compression else _frame(data, offsets)
    if frames is None:
        entries = canonical_entries(data, offsets, max_parallelism, where)
        yield from _columns_of_entries(header, entries)
        return
    pos, klen, vlen, sid = frames
    d = _Data(data)
    # by state, each state's records in framing order: record i of every key group before
    # record i + 1 (a stable radix sort of the 16-bit ids; a key group's records keep their
    # stream order, which is all the rows' sort needs)
    order = np.argsort(sid.astype(np.uint16), kind="stable")
    sid_sorted = sid[order]
    bounds = np.flatnonzero(np.diff(sid_sorted)) + 1
    decoder = StateDecoder(header, max_parallelism, where)
    for idx in np.split(order, bounds):
        if not idx.size:
            continue
        state = header.state(int(sid[idx[0]]), where)
        if state.is_timers:
            continue
        p, kl, vl = pos[idx], klen[idx], vlen[idx]
        try:
            yield _fast_state(d, header, state, decoder.prefix, p, kl, vl)
        except (_NoFastPath, IndexError):
            yield _slow_state(data, decoder, state, p, kl, vl)


def _frame(data: bytes, offsets: list[int]) -> tuple[Ints, Ints, Ints, Ints] | None:
    """Per record: position of its key length, key length, value length, state id; None when
    the stream does not frame cleanly (the record-by-record reader then names the problem)."""
    n = len(data)
    starts = [o for o in offsets if o]
    if not starts or n < 8 or max(starts) > n - 2:
        return None if starts else (_EMPTY, _EMPTY, _EMPTY, _EMPTY)
    arr = np.frombuffer(data, dtype=np.uint8)
    i32 = np.ndarray((n - 3,), dtype=">i4", buffer=data, strides=(1,))
    u16 = np.ndarray((n - 1,), dtype=">u2", buffer=data, strides=(1,))
    cur = np.array(starts, dtype=np.int64)
    sid = u16[cur].astype(np.int64)
    cur += 2
    out_pos, out_kl, out_vl, out_sid = [], [], [], []
    # Bounds: an index past the views' ends raises IndexError; lengths >= 1 (key) and >= 0
    # (value) keep every position moving forward, so none goes negative (numpy would wrap it).
    try:
        for _ in range(n // 9 + 1):  # each record takes >= 9 bytes: a bound on the steps
            kl = i32[cur]  # big-endian int32; arithmetic with ``cur`` gives int64
            vpos = cur + 4 + kl
            vl = i32[vpos]
            if min(kl.min(), vl.min() + 1) < 1:
                return None
            nxt = vpos + 4 + vl
            out_pos.append(cur)
            out_kl.append(kl)
            out_vl.append(vl)
            out_sid.append(sid)
            last = arr[cur + 4] >= 0x80
            if last.any():
                at = np.flatnonzero(last)
                mark = u16[nxt[at]].astype(np.int64)
                nxt[at] += 2
                sid = sid.copy()
                sid[at] = mark
                keep = np.ones(cur.size, dtype=bool)
                keep[at[mark == END_OF_KEY_GROUP_MARK]] = False
                cur, sid = nxt[keep], sid[keep]
                if not cur.size:
                    break
            else:
                cur = nxt
        else:
            return None
    except IndexError:
        return None
    pos = np.concatenate(out_pos)
    klen = np.concatenate(out_kl).astype(np.int64)
    vlen = np.concatenate(out_vl).astype(np.int64)
    if (pos + 8 + klen + vlen > n).any():
        return None
    return pos, klen, vlen, np.concatenate(out_sid)


_EMPTY: Ints = np.zeros(0, dtype=np.int64)


# --- the vectorized decoder of one state ---


def _fast_state(
    d: _Data,
    header: ProxyHeader,
    state: StateInfo,
    prefix: int,
    pos: Ints,
    klen: Ints,
    vlen: Ints,
) -> Columns:
    arr = d.arr
    ks = pos + 4
    key_end = ks + klen
    vs = key_end + 4
    # the key-group prefix, its first byte without the last-record flag
    first = arr[ks] & 0x7F
    kg = first if prefix == 1 else (first.astype(np.int64) << 8) | arr[ks + 1]
    ns_ser = state.namespace_serializer
    if ns_ser is None or getattr(ns_ser, "kind", "") != "void":
        raise _NoFastPath
    keys, at = _read(d, header.key_serializer, ks + prefix, key_end)
    if (arr[at] != 0).any():  # VoidNamespace: one 0 byte
        raise _NoFastPath
    at = at + 1
    ser = state.value_serializer
    user_keys = None
    if state.kind == "MAP" and isinstance(ser, MapSerializer):
        assert ser.key is not None and ser.value is not None
        user_keys, at = _read(d, ser.key, at, key_end, to_end=True)
        if (arr[vs] != 0).any():  # the value's null flag: nulls decode record by record
            raise _NoFastPath
        _check_end(at, key_end)
        values, expires, end = _read_maybe_ttl(d, ser.value, vs + 1, vs + vlen)
    elif state.kind == "LIST" and isinstance(ser, ListSerializer):
        _check_end(at, key_end)
        assert ser.element is not None
        values, expires, end = _read_list(d, ser.element, vs, vlen)
    else:
        _check_end(at, key_end)
        values, expires, end = _read_maybe_ttl(d, ser, vs, vs + vlen)
    _check_end(end, vs + vlen)
    return Columns(
        state,
        kg.tolist(),
        keys,
        values,
        user_key=user_keys,
        expires_at=expires,
    )


def _check_end(at: Ints, end: Ints) -> None:
    if not np.array_equal(at, end):
        raise _NoFastPath


def _read_maybe_ttl(
    d: _Data, ser: FlinkSerializer, start: Ints, end: Ints
) -> tuple[list[Any], list[Any] | None, Ints]:
    if isinstance(ser, TtlSerializer):
        assert ser.value is not None
        if getattr(ser.timestamp, "kind", "") != "long" or (start + 8 > end).any():
            raise _NoFastPath
        ts = d.fixed(start, ">i8", 8)
        values, at = _read(d, ser.value, start + 8, end, to_end=True)
        return values, ts.tolist(), at
    values, at = _read(d, ser, start, end, to_end=True)
    return values, None, at


def _read(
    d: _Data, ser: FlinkSerializer, start: Ints, end: Ints, *, to_end: bool = False
) -> tuple[list[Any], Ints]:
    """One value of ``ser`` per record at ``start`` (bounded by ``end``): values, next offsets.
    ``to_end``: the value is the last thing before ``end``."""
    kind = getattr(ser, "kind", "")
    if kind in _FIXED:
        dtype, width = _FIXED[kind]
        if (start + width > end).any():
            raise _NoFastPath
        values = d.fixed(start, dtype, width)
        if kind == "boolean":
            if (values > 1).any():
                raise _NoFastPath
            return values.astype(bool).tolist(), start + width
        return values.tolist(), start + width
    if kind == "string":
        count = d.arr[start].astype(np.int64)
        # one length byte (strings < 127 chars), not null (0)
        if (count == 0).any() or (count >= 0x80).any():
            raise _NoFastPath
        return _strings(d, start + 1, count - 1, end, to_end=to_end)
    raise _NoFastPath


def _ranges(starts: Ints, lengths: Ints) -> tuple[Ints, Ints]:
    """Indexes of the ranges ``[start, start + length)`` back to back, each followed by one slot
    (returned: the slots' positions in the result, to be filled by the caller)."""
    if lengths.size and (lengths == lengths[0]).all():  # one length (ids, codes): a 2-D grid
        width = int(lengths[0]) + 1
        grid = starts[:, None] + np.arange(width, dtype=np.int64)
        return grid.ravel(), np.arange(width - 1, grid.size, width, dtype=np.int64)
    size = lengths + 1
    total = int(size.sum())
    first = np.cumsum(size) - size
    idx = np.arange(total, dtype=np.int64) - np.repeat(first - starts, size)
    return idx, first + lengths


def _strings(
    d: _Data, start: Ints, count: Ints, end: Ints, *, to_end: bool = False
) -> tuple[list[str], Ints]:
    """``StringValue`` bodies (``count`` UTF-16 units as varints) at ``start``: the strings and
    where each ends. ASCII strings are ``count`` bytes. ``to_end``: each string runs to ``end``
    (it is the last thing in its key or value), so it may be any text: its units are
    reassembled from their varints (and must number exactly ``count``)."""
    size = (end - start) if to_end else count
    if (start + count > end).any():
        raise _NoFastPath
    idx, slots = _ranges(start, size)
    idx[slots] = d.zero  # a 0 byte: the separator
    raw = d.arr[idx]
    if not (raw >= 0x80).any():
        if to_end and not np.array_equal(size, count):
            raise _NoFastPath
        return _split(raw.tobytes().decode("ascii"), len(start)), start + count
    if not to_end:
        raise _NoFastPath
    stops = raw < 0x80  # the last byte of each unit (low 7 bits first, the stop byte highest)
    last = np.flatnonzero(stops)
    width = np.diff(last, prepend=-1)
    if width.max() > 3:
        raise _NoFastPath
    units = raw[last].astype(np.int32)
    two = np.flatnonzero(width >= 2)
    if two.size:
        at = last[two]
        units[two] = (units[two] << 7) | (raw[at - 1] & 0x7F)
        three = two[width[two] == 3]
        if three.size:
            units[three] = (units[three] << 7) | (raw[last[three] - 2] & 0x7F)
    if units.max() > 0xFFFF:
        raise _NoFastPath
    per_string = np.add.reduceat(stops, _ranges_first(size), dtype=np.int64)
    if not np.array_equal(per_string, count + 1):
        raise _NoFastPath
    text = units.astype(">u2").tobytes().decode("utf-16-be", "surrogatepass")
    return _split(text, len(start)), end.copy()


def _split(text: str, count: int) -> list[str]:
    parts = text.split("\x00")
    if len(parts) != count + 1:
        raise _NoFastPath  # a NUL inside a string
    parts.pop()
    return parts


def _ranges_first(lengths: Ints) -> Ints:
    size = lengths + 1
    return np.cumsum(size) - size


def _read_list(
    d: _Data, element: FlinkSerializer, start: Ints, length: Ints
) -> tuple[list[Any], None, Ints]:
    """RocksDB list values of a fixed-width element: ``e , e , e`` (no count, ',' between)."""
    kind = getattr(element, "kind", "")
    if kind not in _FIXED or kind == "boolean":
        raise _NoFastPath
    dtype, width = _FIXED[kind]
    step = width + 1
    if (length <= 0).any() or ((length + 1) % step).any():
        raise _NoFastPath
    arr = d.arr
    counts = (length + 1) // step
    c = int(counts[0])
    if (counts == c).all():  # the common case: lists of one length, one 2-D gather
        elem_start = start[:, None] + np.arange(c, dtype=np.int64) * step
        if c > 1 and (arr[elem_start[:, :-1] + width] != LIST_DELIMITER).any():
            raise _NoFastPath
        return d.fixed(elem_start, dtype, width).tolist(), None, start + length
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    j = np.arange(total, dtype=np.int64) - np.repeat(first, counts)
    elem_start = np.repeat(start, counts) + j * step
    not_last = j < np.repeat(counts, counts) - 1
    if (arr[elem_start[not_last] + width] != LIST_DELIMITER).any():
        raise _NoFastPath
    items = d.fixed(elem_start, dtype, width).tolist()
    bounds = np.append(first, total).tolist()
    values = [items[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    return values, None, start + length


# --- record by record ---


def _slow_state(
    data: bytes, decoder: StateDecoder, state: StateInfo, pos: Ints, klen: Ints, vlen: Ints
) -> Columns:
    entries = []
    for p, kl, vl in zip(pos.tolist(), klen.tolist(), vlen.tolist(), strict=True):
        key = data[p + 4 : p + 4 + kl]
        if key[0] & 0x80:
            key = bytes([key[0] & 0x7F]) + key[1:]
        value = data[p + 8 + kl : p + 8 + kl + vl]
        entries.append(decoder.decode(state, key, value))
    return _columns(state, entries)


def _columns(state: StateInfo, entries: list[Entry]) -> Columns:
    return Columns(
        state,
        [e.key_group for e in entries],
        [e.key for e in entries],
        [e.value for e in entries],
        user_key=[e.user_key for e in entries],
        namespace=[e.namespace for e in entries],
        expires_at=[e.expires_at for e in entries],
    )


def _columns_of_entries(header: ProxyHeader, entries: Iterator[Entry]) -> Iterator[Columns]:
    by_state: dict[str, list[Entry]] = {}
    for e in entries:
        by_state.setdefault(e.state, []).append(e)
    states = header.by_name()
    for name, group in by_state.items():
        yield _columns(states[name], group)
