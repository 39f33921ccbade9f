"""Fast decoding of canonical savepoint streams: whole states at once, into Arrow columns.

:func:`canonical_columns` gives the same keyed state as
:func:`~state_engine.flink.keyed_state.canonical_entries`, one :class:`Columns` per state instead
of one ``Entry`` per record. The framing (one numpy step per record depth across all key groups,
runs of fixed-width records predicted and then checked) and the per-state decoders are described
in ``docs/flink-format.md §7.2``. The fast path is chosen per state, never per record: any other
layout decodes that state record by record with
:class:`~state_engine.flink.keyed_state.StateDecoder`, and a stream that does not frame or is
compressed falls back to the record-by-record reader as a whole (which names the file and offset
of the problem). The values are exactly the generic decoder's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.errors import FlinkStateError
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
    Buf,
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


#: the columns of a state's table, in this order
COLUMNS = ("key_group", "key", "namespace", "user_key", "value", "expires_at")


@dataclass
class Columns:
    """The decoded records of one state: an Arrow table (the vectorized path: columns
    :data:`COLUMNS`, built from numpy arrays and gathered byte buffers, no Python object per
    value; ``namespace`` and absent ``user_key``/``expires_at`` are null columns) or, for a state
    the vectorized decoder does not read, the generic decoder's entries."""

    state: StateInfo
    table: pa.Table | None = None
    rows: list[Entry] | None = None

    def __len__(self) -> int:
        if self.table is not None:
            rows: int = self.table.num_rows
            return rows
        assert self.rows is not None
        return len(self.rows)

    def key_groups(self) -> npt.NDArray[np.int64]:
        """Every row's key group (no Python object per row for a table)."""
        if self.table is not None:
            key_groups: npt.NDArray[np.int64] = (
                self.table.column("key_group").to_numpy().astype(np.int64)
            )
            return key_groups
        assert self.rows is not None
        return np.array([e.key_group for e in self.rows], dtype=np.int64)

    def entries_up_to(self, key_group: int | None) -> Iterator[Entry]:
        """The entries of key groups up to ``key_group`` (None: all); Python values are made
        for those rows only."""
        if key_group is None:
            yield from self.entries()
        elif self.rows is not None:
            yield from (e for e in self.rows if e.key_group <= key_group)
        else:
            assert self.table is not None
            kept = self.table.filter(pc.less_equal(self.table.column("key_group"), key_group))
            yield from Columns(self.state, table=kept).entries()

    def entries(self, start: int = 0, stop: int | None = None) -> Iterator[Entry]:
        """Entries ``start`` to ``stop`` (Python values made for those rows only)."""
        if self.rows is not None:
            yield from self.rows[start:stop]
            return
        assert self.table is not None
        n = self.table.num_rows
        stop = n if stop is None else min(stop, n)
        if start >= stop:
            return
        part = self.table.slice(start, stop - start)
        name = self.state.name
        cols = [part.column(c).to_pylist() for c in COLUMNS]
        for kg, k, ns, uk, v, ts in zip(*cols, strict=True):
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
    frames = None if header.compression else _frame_records(data, offsets)
    if frames is None:
        entries = canonical_entries(data, offsets, max_parallelism, where)
        yield from _columns_of_entries(header, entries)
        return
    pos, klen, vlen, sid, group, first = frames
    d = _Data(data)
    decoder = StateDecoder(header, max_parallelism, where)
    key_groups = _key_groups(d, decoder.prefix, pos, first)
    in_their_sections = _prefixes_follow_groups(key_groups, group)
    # by state (ascending ids), each state's records in framing order: record i of every key
    # group before record i + 1 (a key group's records keep their stream order, which is all the
    # rows' sort needs)
    for idx in _by_state(sid):
        state = header.state(int(sid[idx[0]]), where)
        if state.is_timers:
            continue
        if not in_their_sections and not _prefixes_follow_groups(key_groups[idx], group[idx]):
            # a key-group prefix that is not its section's (the generic decoder reports it as
            # written): the records in stream order, as the generic decoder gives them
            idx = idx[np.argsort(pos[idx], kind="stable")]
        p, kl, vl = pos[idx], klen[idx], vlen[idx]
        try:
            yield _fast_state(d, header, state, decoder.prefix, key_groups[idx], p, kl, vl)
        except (_NoFastPath, IndexError):
            yield _slow_state(data, decoder, state, p, kl, vl)


def _by_state(sid: Ints) -> list[Ints]:
    """The indexes of each state's records (ascending), the states by ascending id."""
    if not sid.size:
        return []
    counts = np.bincount(sid)
    ids = np.flatnonzero(counts)
    if ids.size <= 8:  # a pass over the ids per state
        return [np.flatnonzero(sid == i) for i in ids.tolist()]
    # a stable radix sort of the 16-bit ids, cut where the id changes
    order = np.argsort(sid.astype(np.uint16), kind="stable")
    return np.split(order, np.cumsum(counts[ids])[:-1])


def _frame(data: bytes, offsets: list[int]) -> tuple[Ints, Ints, Ints, Ints, Ints] | None:
    """Per record: position of its key length, key length, value length, state id, and the index
    in ``offsets`` of the key group it is in; None when the stream does not frame cleanly (the
    record-by-record reader then names the problem). See :func:`_frame_records`."""
    records = _frame_records(data, offsets)
    return None if records is None else records[:5]


def _frame_records(
    data: bytes, offsets: list[int]
) -> tuple[Ints, Ints, Ints, Ints, Ints, Bytes] | None:
    """:func:`_frame`'s arrays, and each record's first key byte (its key group prefix's first,
    with the last-of-its-state flag), which framing reads anyway.

    The records come record depth by record depth: record i of every key group (in ``offsets``
    order), then record i + 1, ... Each step reads one record of every key group still running;
    a run of records with the same lengths in every key group (a state's fixed-width keys and
    values; tried while at most ``_BLOCK_LANES`` key groups run) is taken as one block (see
    :func:`_block`): positions predicted arithmetically, every one verified. A block holds only
    records the steps would read the same way, and reads nothing past the data; the records,
    and whether the stream frames at all (None), are the steps' alone."""
    n = len(data)
    starts = [o for o in offsets if o]
    groups = [i for i, o in enumerate(offsets) if o]
    if not starts or n < 8 or max(starts) > n - 2:
        return None if starts else (_EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY_BYTES)
    arr = np.frombuffer(data, dtype=np.uint8)
    i32 = np.ndarray((n - 3,), dtype=">i4", buffer=data, strides=(1,))
    # the same 4 bytes further on: i32_4[x] is i32[x + 4], flag4[x] is arr[x + 4]
    i32_4 = np.ndarray((n - 7,), dtype=">i4", buffer=data, offset=4, strides=(1,))
    flag4 = arr[4:]
    u16 = np.ndarray((n - 1,), dtype=">u2", buffer=data, strides=(1,))
    # the same bytes as raw little-endian words, for blocks to compare
    raw8 = np.ndarray((n - 7,), dtype="<u8", buffer=data, strides=(1,))
    raw4 = np.ndarray((n - 7,), dtype="<i4", buffer=data, offset=4, strides=(1,))
    cur = np.array(starts, dtype=np.int64)
    sid = u16[cur].astype(np.int64)
    cur += 2
    group = np.array(groups, dtype=np.int64)
    # Blocks and prefetching read ahead of the records framed so far: only from positions >= 0
    # (a negative offset is read, as numpy wraps it, record by record).
    ahead = min(starts) > 0
    prefetch = _prefetch_rows(arr, n, cur.size) if ahead else None
    out_pos: list[Any] = []
    out_kl: list[Any] = []
    out_vl: list[Any] = []
    out_first: list[Any] = []
    # (state ids, key groups, steps): the arrays of each stretch of steps between run ends
    spans: list[tuple[Ints, Ints, int]] = []
    span_start = checked = 0
    limit = n // 9 + 1  # each record takes >= 9 bytes: a bound on the steps
    # the steps at which to try a block next (and how long to wait after one more miss), to
    # prefetch next, to check the lengths read since the last check next; the first of them
    wait, next_check = 1, 64
    next_block = 0 if ahead else limit
    next_prefetch = 0 if prefetch is not None else limit
    next_event = min(next_check, next_block, next_prefetch)
    step = 0
    # Bounds: an index past the views' ends raises IndexError. Lengths >= 1 (key) and >= 0
    # (value) keep every position moving forward; a bad length could send one backwards (numpy
    # wraps negative indexes): checked every 64 steps (which bounds the time a corrupt stream
    # takes) and over all records at the end (which decides). A block is only tried from good
    # lengths and reads inside the data only.
    try:
        while step < limit:
            kl = i32[cur]  # big-endian int32; arithmetic with ``cur`` gives int64
            after_key = cur + kl
            vl = i32_4[after_key]
            nxt = after_key + vl
            nxt += 8
            flags = flag4[cur]
            last = not flags.tobytes().isascii()  # some key group's run of a state ends here
            if step >= next_event:
                if step >= next_check:
                    if not _lengths_ok(out_kl[checked:], out_vl[checked:]):
                        return None
                    checked, next_check = len(out_kl), step + 64
                if not last and step >= next_block:
                    # each next record's key length as this one's (the next step reads it: an
                    # IndexError here is that step's), then the whole block checked
                    rows = min(_BLOCK_ELEMENTS // cur.size, limit - step)
                    taken = 0
                    if cur.size <= _BLOCK_LANES and (i32[nxt] == kl).all():
                        taken = _block(raw8, raw4, n, cur, after_key, nxt, rows)
                    if taken:
                        if not _lengths_ok(out_kl[checked:], out_vl[checked:]):
                            return None
                        depth = np.arange(taken, dtype=np.int64)[:, None]
                        out_pos.append((cur + depth * (nxt - cur)).ravel())
                        out_kl.append(np.tile(kl, taken))
                        out_vl.append(np.tile(vl, taken))
                        out_first.append(np.tile(flags, taken))
                        checked = len(out_kl)  # a block's lengths are good
                        step += taken
                        cur = cur + taken * (nxt - cur)
                        # a long block: try the next at once; a short one (as a miss, below): a
                        # run ends in some key group every few records
                        wait = 1 if taken >= 8 else min(2 * wait, 64)
                        next_block = step if taken >= 8 else step + wait
                        next_event = step
                        continue
                    wait = min(2 * wait, 64)  # no run here: try again later, less often
                    next_block = step + wait
                if step >= next_prefetch:
                    next_prefetch = step + _prefetch(prefetch, cur, nxt)
                next_event = min(next_check, next_prefetch, next_block)
            out_pos.append(cur)
            out_kl.append(kl)
            out_vl.append(vl)
            out_first.append(flags)
            step += 1
            if last:
                at = np.flatnonzero(flags >= 0x80)
                ends = nxt[at]
                mark = u16[ends]  # the next state's id, or the key group's end
                nxt[at] = ends + 2
                spans.append((sid, group, step - span_start))
                span_start = step
                sid = sid.copy()
                sid[at] = mark
                done = mark == END_OF_KEY_GROUP_MARK
                if done.any():
                    keep = np.ones(cur.size, dtype=bool)
                    keep[at[done]] = False
                    nxt, sid, group = nxt[keep], sid[keep], group[keep]
                    if not nxt.size:
                        break
                if ahead:  # a state's records begin: maybe a run of one length
                    next_block = next_event = min(next_block, step)
            cur = nxt
        else:
            return None
    except IndexError:
        return None
    pos = np.concatenate(out_pos)
    klen = np.concatenate(out_kl)
    vlen = np.concatenate(out_vl)
    if not (klen.min() >= 1 and vlen.min() >= 0):
        return None
    klen = klen.astype(np.int64)
    vlen = vlen.astype(np.int64)
    if (pos + 8 + klen + vlen > n).any():
        return None
    sids = np.concatenate([_repeat(s, k) for s, _g, k in spans if k])
    key_groups = np.concatenate([_repeat(g, k) for _s, g, k in spans if k])
    return pos, klen, vlen, sids, key_groups, np.concatenate(out_first)


def _repeat(values: Ints, times: int) -> Ints:
    """``values`` ``times`` over, back to back."""
    return values if times == 1 else np.tile(values, times)


#: a block's most positions (rows x key groups); the most key groups stepped at once for which
#: blocks are tried (with more, a step's cost per record is as low as a block's)
_BLOCK_ELEMENTS = 1 << 18
_BLOCK_LANES = 256
#: the bytes a block compares at each position: the key length and the key's first byte (the
#: key group prefix and its last-of-the-state flag), the low 5 bytes of a little-endian uint64
_HEAD = (1 << 40) - 1


def _block(raw8: Any, raw4: Any, n: int, cur: Ints, after_key: Ints, nxt: Ints, rows: int) -> int:
    """How many records from ``cur`` on (at most ``rows``; 0: fewer than 2) every key group has
    with the key and value lengths and the key's first byte (flag clear) of its first: at
    ``cur + i * stride``, each ending where the next starts, they are the records framing reads
    from ``cur`` one step at a time.

    ``raw8``/``raw4``: little-endian uint64/int32 views at every byte offset (raw4 4 bytes on),
    compared as raw bytes; the first records are not the last of their state. Where the run
    ends is found by probing single rows (1, 3, 7, ..., then bisecting); the rows before it are
    all checked, in chunks 4 times larger each (a check stops at the first chunk with a wrong
    row: the work done is at most a few times the rows taken, whatever the probes found)."""
    if rows < 2 or cur.min() < 0:
        return 0
    klen = after_key - cur
    stride = nxt - cur
    if klen.min() < 1 or (stride - klen).min() < 8:  # a key length < 1, a value length < 0
        return 0
    # every position read lies inside the data (the last row is each key group's furthest)
    rows = min(rows, int(((n - 8 - after_key) // stride).min()) + 1)
    if rows < 2:
        return 0
    head = raw8[cur] & _HEAD
    value = raw4[after_key]

    def same(at: Any, head: Any = head, value: Any = value, klen: Any = klen) -> Any:
        return ((raw8[at] & _HEAD) == head) & (raw4[at + klen] == value)

    good, bad = 1, rows  # rows < good look right; rows >= bad are out
    while good < bad:  # rows 1, 3, 7, 15, ... until one is not right
        probe = min(2 * good - 1, bad - 1)
        if not same(cur + probe * stride).all():
            bad = probe
            break
        good = probe + 1
    while good < bad:  # bisected
        mid = (good + bad) // 2
        if same(cur + mid * stride).all():
            good = mid + 1
        else:
            bad = mid
    taken = 1
    columns = (head[:, None], value[:, None], klen[:, None])
    while taken < good:
        upto = min(good, 4 * taken)
        chunk = cur[:, None] + stride[:, None] * np.arange(taken, upto, dtype=np.int64)
        ok = same(chunk, *columns).all(axis=0)
        if not ok.all():
            taken += int(np.argmin(ok))
            break
        taken = upto
    return taken if taken >= 2 else 0


def _prefetch_rows(arr: Bytes, n: int, lanes: int) -> Any:
    """Rows of the data at every byte offset, for :func:`_prefetch` (None: not worth it: the
    data fits the caches, or so many key groups are stepped that their reads overlap anyway)."""
    width = min(2048, _PREFETCH_BYTES // lanes)
    if n < _PREFETCH_MIN_DATA or width < 1024:
        return None
    return np.lib.stride_tricks.as_strided(arr, (n - width + 1, width), (1, 1))


#: prefetching: data below this size stays in the caches; bytes read ahead in all
_PREFETCH_MIN_DATA = 1 << 21
_PREFETCH_BYTES = 1 << 18


def _prefetch(rows: Any, cur: Ints, nxt: Ints) -> int:
    """Reads the bytes ahead of each key group's position (one sequential copy each, which the
    CPU prefetches, where the steps' scattered reads would each wait for memory); returns the
    steps until the next prefetch (about the records one row covers)."""
    width = int(rows.shape[1])
    rows[np.minimum(cur, rows.shape[0] - 1)]
    stride = int((nxt - cur).max())
    return max(1, min(64, width // max(stride, 1)))


def _key_groups(d: _Data, prefix: int, pos: Ints, first: Bytes) -> Any:
    """The key group in each record's key prefix (without the last-record flag); ``first``:
    each key's first byte."""
    high = (first & 0x7F).astype(np.int32)
    if prefix == 1:
        return high
    return (high << 8) | d.arr[pos + 5]


def _prefixes_follow_groups(key_groups: Any, group: Ints) -> bool:
    """Whether each record's prefix is its key-group section's (the section's index plus one
    constant): then the framing order, within a key group, is the stream order."""
    if not group.size:
        return True
    gap = key_groups - group
    return bool(gap.min() == gap.max())


def _lengths_ok(key_lengths: list[Any], value_lengths: list[Any]) -> bool:
    if not key_lengths:
        return True
    return bool(np.concatenate(key_lengths).min() >= 1 and np.concatenate(value_lengths).min() >= 0)


_EMPTY: Ints = np.zeros(0, dtype=np.int64)
_EMPTY_BYTES: Bytes = np.zeros(0, dtype=np.uint8)


# --- the vectorized decoder of one state ---


def _fast_state(
    d: _Data,
    header: ProxyHeader,
    state: StateInfo,
    prefix: int,
    kg: Any,
    pos: Ints,
    klen: Ints,
    vlen: Ints,
) -> Columns:
    arr = d.arr
    n = len(pos)
    ks = pos + 4
    key_end = ks + klen
    vs = key_end + 4
    ns_ser = state.namespace_serializer
    if ns_ser is None or getattr(ns_ser, "kind", "") != "void":
        raise _NoFastPath
    keys, at = _read(d, header.key_serializer, ks + prefix, key_end)
    if (arr[at] != 0).any():  # VoidNamespace: one 0 byte
        raise _NoFastPath
    at = at + 1
    ser = state.value_serializer
    user_keys: pa.Array = pa.nulls(n)
    expires: pa.Array = pa.nulls(n, pa.int64())
    if state.kind == "MAP" and isinstance(ser, MapSerializer):
        assert ser.key is not None and ser.value is not None
        user_keys, at = _read(d, ser.key, at, key_end, to_end=True)
        if (arr[vs] != 0).any():  # the value's null flag: nulls decode record by record
            raise _NoFastPath
        _check_end(at, key_end)
        values, ttl, end = _read_maybe_ttl(d, ser.value, vs + 1, vs + vlen)
    elif state.kind == "LIST" and isinstance(ser, ListSerializer):
        _check_end(at, key_end)
        assert ser.element is not None
        values, ttl, end = _read_list(d, ser.element, vs, vlen)
    else:
        _check_end(at, key_end)
        values, ttl, end = _read_maybe_ttl(d, ser, vs, vs + vlen)
    _check_end(end, vs + vlen)
    if ttl is not None:
        expires = ttl
    table = pa.Table.from_arrays(
        [pa.array(kg), keys, pa.nulls(n), user_keys, values, expires], names=list(COLUMNS)
    )
    return Columns(state, table=table)


def _check_end(at: Ints, end: Ints) -> None:
    if not np.array_equal(at, end):
        raise _NoFastPath


def _native(values: Any) -> Any:
    """A big-endian numpy array in native byte order (what Arrow takes without a copy)."""
    return values.astype(values.dtype.newbyteorder("="))


def _read_maybe_ttl(
    d: _Data, ser: FlinkSerializer, start: Ints, end: Ints
) -> tuple[pa.Array, pa.Array | None, Ints]:
    if isinstance(ser, TtlSerializer):
        assert ser.value is not None
        if getattr(ser.timestamp, "kind", "") != "long" or (start + 8 > end).any():
            raise _NoFastPath
        ts = pa.array(_native(d.fixed(start, ">i8", 8)))
        values, at = _read(d, ser.value, start + 8, end, to_end=True)
        return values, ts, at
    values, at = _read(d, ser, start, end, to_end=True)
    return values, None, at


def _read(
    d: _Data, ser: FlinkSerializer, start: Ints, end: Ints, *, to_end: bool = False
) -> tuple[pa.Array, Ints]:
    """One value of ``ser`` per record at ``start`` (bounded by ``end``): an Arrow array, and
    the next offsets. ``to_end``: the value is the last thing before ``end``."""
    kind = getattr(ser, "kind", "")
    if kind in _FIXED:
        dtype, width = _FIXED[kind]
        if (start + width > end).any():
            raise _NoFastPath
        values = d.fixed(start, dtype, width)
        if kind == "boolean":
            if (values > 1).any():
                raise _NoFastPath
            return pa.array(values.astype(bool)), start + width
        return pa.array(_native(values)), start + width
    if kind == "string":
        count = d.arr[start].astype(np.int64)
        # one length byte (strings < 127 chars), not null (0)
        if (count == 0).any() or (count >= 0x80).any():
            raise _NoFastPath
        return _strings(d, start + 1, count - 1, end, to_end=to_end)
    raise _NoFastPath


def _gather_bytes(d: _Data, starts: Ints, lengths: Ints) -> Bytes:
    """The bytes of the ranges ``[start, start + length)`` back to back."""
    if lengths.size and (lengths == lengths[0]).all():  # one length (ids, codes): the items of
        width = int(lengths[0])  # a view of ``width``-byte items at every byte offset
        if width == 0:
            return np.zeros(0, dtype=np.uint8)
        gathered: Bytes = _rows(d, width)[starts].view(np.uint8)
        return gathered
    return d.arr[_gather(starts, lengths)]


def _rows(d: _Data, width: int) -> Any:
    """The data as ``width``-byte items (numpy void) at every byte offset: a gather of them
    copies each item's bytes whole (a 2-D uint8 view's rows are copied byte by byte)."""
    return np.ndarray(
        (d.n - width + 1,), dtype=np.dtype((np.void, width)), buffer=d.arr, strides=(1,)
    )


def _gather(starts: Ints, lengths: Ints) -> Ints:
    """Indexes of the ranges ``[start, start + length)`` back to back."""
    # ones (each next byte), and at each range's first slot the jump to its start: summed up
    idx = np.ones(int(lengths.sum()), dtype=np.int64)
    some = lengths > 0
    s, length = starts[some], lengths[some]
    if not s.size:
        return idx
    first = np.cumsum(length) - length
    jump = s.copy()
    jump[1:] -= s[:-1] + length[:-1] - 1
    idx[first] = jump
    return np.cumsum(idx, out=idx)


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


def _offsets(lengths: Ints) -> Any:
    """Arrow's int32 offsets of values of ``lengths``: 0, then the running sums."""
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


def _strings(
    d: _Data, start: Ints, count: Ints, end: Ints, *, to_end: bool = False
) -> tuple[pa.Array, Ints]:
    """``StringValue`` bodies (``count`` UTF-16 units as varints) at ``start``: an Arrow string
    array and where each ends. ASCII strings are ``count`` bytes, which are their UTF-8: one
    gather of them and their offsets make the array. ``to_end``: each string runs to ``end``
    (it is the last thing in its key or value), so it may be any text: its units are
    reassembled from their varints (and must number exactly ``count``)."""
    n = len(start)
    if (start + count > end).any():
        raise _NoFastPath
    if int(count.sum()) >= 2**31:
        raise _NoFastPath
    if not to_end or np.array_equal(end - start, count):
        raw = _gather_bytes(d, start, count)
        if not raw.size or raw.max() < 0x80:
            array = pa.StringArray.from_buffers(n, pa.py_buffer(_offsets(count)), pa.py_buffer(raw))
            return array, start + count
    if not to_end:
        raise _NoFastPath
    distinct = _distinct_strings(d, start, end)
    if distinct is not None:
        return distinct, end.copy()
    return _unicode_strings(d, start, count, end), end.copy()


def _distinct_strings(d: _Data, start: Ints, end: Ints) -> pa.Array | None:
    """Strings running to ``end`` (the length byte at ``start - 1``) when few are distinct (a
    MAP's user keys: names, codes): their whole encodings (as fixed-width rows: the size, then
    the bytes, zero-padded) dictionary-encoded by Arrow, each distinct one decoded once by the
    generic reader (which must end exactly at its end); the column is that dictionary with the
    rows' indices. None when too many are distinct or they are long."""
    n = len(start)
    first = start - 1
    size = end - first
    width = int(size.max())
    if width > 64 or int(first.max()) + width > d.n:
        return None
    padded = _rows(d, width)[first].view(np.uint8)
    # zeroed past each row's size: ANDed with the row of 0xFF x size, 0 x (width - size)
    masks = (np.arange(width) < np.arange(width + 1)[:, None]).astype(np.uint8) * np.uint8(0xFF)
    padded &= masks.view(np.dtype((np.void, width))).ravel()[size].view(np.uint8)
    encoded = pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(padded)])
    dictionary = pc.dictionary_encode(encoded)
    uniques = dictionary.dictionary.to_pylist()
    if len(uniques) > max(64, n // 8):
        return None
    texts, sizes = [], []
    for row in uniques:
        buf = Buf(row)
        try:
            text = buf.string_value()
        except FlinkStateError:
            raise _NoFastPath from None
        if text is None:
            raise _NoFastPath
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the generic decoder keeps it
            raise _NoFastPath from None
        texts.append(text)
        sizes.append(buf.pos)
    # each record's string ends where its row's does: exactly at its end
    indices = dictionary.indices
    if not np.array_equal(np.array(sizes, dtype=np.int64)[indices.to_numpy()], size):
        raise _NoFastPath
    return pa.DictionaryArray.from_arrays(dictionary.indices, pa.array(texts, pa.string()))


def _unicode_strings(d: _Data, start: Ints, count: Ints, end: Ints) -> pa.Array:
    """Strings running to ``end``, some of them not ASCII: the varint UTF-16 units of all of
    them (a 0 unit after each) reassembled with numpy, decoded as one text, encoded as UTF-8
    and cut at the 0 bytes. A lone surrogate (no UTF-8 for it) or a NUL in a string: none."""
    n = len(start)
    size = end - start
    idx, slots = _ranges(start, size)
    idx[slots] = d.zero  # a 0 byte: the separator
    raw = d.arr[idx]
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
    # the separators are the 0 units, each a byte of its own where it was put, and between
    # two of them each string has its ``count`` units
    zero_units = np.flatnonzero(units == 0)
    if not np.array_equal(last[zero_units], slots):
        raise _NoFastPath
    if not np.array_equal(np.diff(zero_units, prepend=-1), count + 1):
        raise _NoFastPath
    text = units.astype(">u2").tobytes().decode("utf-16-be", "surrogatepass")
    try:
        utf8 = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    except UnicodeEncodeError:  # a lone surrogate: the generic decoder keeps it
        raise _NoFastPath from None
    zero = utf8 == 0
    seps = np.flatnonzero(zero)
    if seps.size != n:
        raise _NoFastPath  # a NUL inside a string
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = seps - np.arange(n)
    body = utf8[~zero]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(body))


def _read_list(
    d: _Data, element: FlinkSerializer, start: Ints, length: Ints
) -> tuple[pa.Array, None, Ints]:
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
    if (counts == c).all():  # the common case: lists of one length: 2-D views with a row at
        # every byte offset (its elements, its delimiters), one gather of the records' rows each
        # (every row read lies inside its record's value, which framing bounded)
        n = d.n
        if c > 1:
            delimiters = np.ndarray(
                (n - width - (c - 2) * step, c - 1),
                dtype=np.uint8,
                buffer=d.data,
                offset=width,
                strides=(1, step),
            )
            if (delimiters[start] != LIST_DELIMITER).any():
                raise _NoFastPath
        elements = np.ndarray(
            (n - (c - 1) * step - width + 1, c), dtype=dtype, buffer=d.data, strides=(1, step)
        )
        flat = pa.array(_native(elements[start].ravel()))
        offsets = np.arange(0, (len(start) + 1) * c, c, dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), flat), None, start + length
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    j = np.arange(total, dtype=np.int64) - np.repeat(first, counts)
    elem_start = np.repeat(start, counts) + j * step
    not_last = j < np.repeat(counts, counts) - 1
    if (arr[elem_start[not_last] + width] != LIST_DELIMITER).any():
        raise _NoFastPath
    flat = pa.array(_native(d.fixed(elem_start, dtype, width)))
    values = pa.ListArray.from_arrays(pa.array(_offsets(counts)), flat)
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
    return Columns(state, rows=entries)


def _columns_of_entries(header: ProxyHeader, entries: Iterator[Entry]) -> Iterator[Columns]:
    by_state: dict[str, list[Entry]] = {}
    for e in entries:
        by_state.setdefault(e.state, []).append(e)
    states = header.by_name()
    for name, group in by_state.items():
        yield Columns(states[name], rows=group)
