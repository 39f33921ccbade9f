"""The RocksDB keyed state backend, on rocksdict in raw mode (bytes in, bytes out).

Layout: one column family per state (``s:<name>``); the default column family holds the state meta
info (``\\x00meta:<name>`` -> JSON). A row key is

    key-group prefix (1 byte if max_parallelism <= 128, else 2, big-endian)
    varint(len(key)) key  varint(len(namespace)) namespace  [suffix]

with LEB128 varint lengths *before* the variable parts, so the encoding is prefix-free: the
(key group, key, namespace) prefix of one value never prefixes another's, and a key-group range is
one contiguous key range (``delete_range`` cuts it out). The suffix is the serialized map key
(MapState, one row per entry, as Flink); other kinds have none. The void namespace is empty.

ListState: one value per (key group, key, namespace), as Flink. Flink appends with a merge
operator; rocksdict exposes none, so ``add`` is a point read and a point write and ``get`` one point
read. The value is the elements one after another, each ``varint(len) bytes``; with TTL each element
is preceded by its own 8-byte big-endian ``expires_at`` (Flink's TTL list serializer). An earlier
layout kept one row per element: every ``update`` left tombstones that each ``get`` seek skipped.

Values: with TTL the value is an 8-byte big-endian ``expires_at`` followed by the serialized value
(Flink also prefixes an 8-byte timestamp). Prefix scans (map iteration, exports) set the iterator's
upper bound to the prefix successor, so RocksDB stops at the prefix instead of at the next key.
WAL is off: durability comes from checkpoints.

Point writes and deletes do not reach the DB at once: each state keeps a write overlay (see
:mod:`.overlay`), a dict of its unflushed rows that point reads consult first. Whatever reads the
DB otherwise -- a prefix scan (map iteration and clear, ``keys``), a checkpoint or view, a
key-group delete, a TTL sweep, a restore, ``close`` -- first writes the overlays concerned in one
``WriteBatch``, so every read still sees every earlier write.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rocksdict as rd

from state_engine.backends.base import (
    KeyedStateBackend,
    KeyedStateView,
    RestorePlan,
    list_elements,
    null_element,
)
from state_engine.backends.rocksdb.layout import (
    CF_PREFIX,
    EXPIRES_AT,
    META_PREFIX,
    OLD_LIST_SEQ_KEY,
    decode_list,
    encode_list,
    list_values,
    prefix_end,
    read_varint,
    varint,
)
from state_engine.backends.rocksdb.overlay import (
    OVERLAY_LIMIT,
    ClosedOverlay,
    Overlay,
    write_overlays,
)
from state_engine.errors import SerializationError, StateError
from state_engine.hashing import key_hash
from state_engine.keygroups import KeyGroupRange, key_group_prefix, key_group_prefix_length
from state_engine.serde import TypeSerializer
from state_engine.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from state_engine.state.descriptors import StateDescriptor, StateKind
from state_engine.state.meta import StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE
from state_engine.state.ttl import INT64_MAX, Clock, expiry

if TYPE_CHECKING:
    from state_engine.snapshot.strategy import SnapshotStrategy
    from state_engine.snapshot_enums import SnapshotFormat

_Q = EXPIRES_AT
_POS = struct.Struct(">I")


def _options() -> rd.Options:
    o = rd.Options(raw_mode=True)
    o.create_if_missing(True)
    o.create_missing_column_families(True)
    return o


def _cf_options() -> rd.Options:
    """A state column family's options: a whole-key bloom filter (10 bits a key) in each SST.

    Every native checkpoint flushes the memtable into a new L0 file, so a point read that misses
    the overlay probed each of them (and a level below) block by block: 4 us a read on the
    counts bench. The filter skips the files without the key; prefix scans do not use it.
    """
    o = rd.Options(raw_mode=True)
    table = rd.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    o.set_block_based_table_factory(table)
    return o


def _write_options() -> rd.WriteOptions:
    w = rd.WriteOptions()
    # rocksdict's stub declares disable_wal a method; at runtime it is a writable property
    w.disable_wal = True  # type: ignore[method-assign,assignment]  # see above
    return w


def _scan(db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The rows whose key starts with ``prefix`` (the iterator is bounded by its successor)."""
    end = prefix_end(prefix)
    if end is None:
        for k, v in db.items(from_key=prefix):
            if not k.startswith(prefix):
                return
            yield k, v
        return
    ro = rd.ReadOptions()
    ro.set_iterate_upper_bound(end)
    yield from db.items(from_key=prefix, read_opt=ro)


def _scan_keys(db: Any, prefix: bytes) -> list[bytes]:
    """The keys starting with ``prefix`` (materialised: callers delete while they go)."""
    end = prefix_end(prefix)
    if end is None:
        return [k for k, _ in _scan(db, prefix)]
    ro = rd.ReadOptions()
    ro.set_iterate_upper_bound(end)
    return list(db.keys(from_key=prefix, read_opt=ro))


def _bad_value(name: str, exc: SerializationError) -> SerializationError:
    return SerializationError(f"state {name!r}: {exc}")


class _RocksState(State):
    kind: StateKind

    def __init__(self, backend: RocksDBKeyedStateBackend, meta: StateMetaInfo) -> None:
        self.name = meta.name
        self.meta = meta
        self._backend = backend
        cf = backend._cf(meta.name)
        self._column_family = cf
        self._db_get = cf.get
        self._pending: Overlay = backend._overlay(meta.name)
        self._namespace_serializer = meta.serializers["namespace"]
        self._namespace_bytes = b"\x00"
        self._serialize_value = meta.serializers["value"].serialize
        self._deserialize_value = meta.serializers["value"].deserialize
        ttl = meta.ttl
        self._ttl = ttl
        self._ttl_ms = ttl.ttl_ms if ttl else 0
        self._update_on_read = bool(ttl and ttl.update_on_read)
        self._return_expired = bool(ttl and ttl.return_expired)
        self._sampled: bool
        self._sampled, self._now = backend.state_time(meta)

    def _time(self) -> int:
        return self._backend._pt_now if self._sampled else self._now()

    def _detach(self) -> None:
        """Drop the column-family handle (the backend closed); later use raises StateError."""
        closed = ClosedOverlay(self.name)

        def refuse(*_: Any) -> Any:
            raise closed.refusal()

        self._column_family = None
        self._db_get = refuse
        self._pending = closed

    def _getb(self, k: bytes) -> bytes | None:
        """The row ``k``: its unflushed write if the overlay has one (None: deleted), else the
        DB's."""
        w = self._pending
        return w[k] if k in w else self._db_get(k)

    def _put(self, k: bytes, v: bytes | None) -> None:
        """Write (``None``: delete) the row ``k`` into the overlay, flushing it when full."""
        w = self._pending
        w[k] = v
        if len(w) > OVERLAY_LIMIT:
            self._backend._flush(self.name)

    def _del(self, k: bytes) -> None:
        self._put(k, None)

    def _scan_cf(self) -> Any:
        """The column family, with this state's overlay written into it first (for scans)."""
        if self._pending:
            self._backend._flush(self.name)
        return self._column_family

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is VOID_NAMESPACE:
            self._namespace_bytes = b"\x00"
        else:
            nb = self._namespace_serializer.serialize(namespace)
            self._namespace_bytes = varint(len(nb)) + nb

    def _prefix(self) -> bytes:
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        prefix: bytes = kb + self._namespace_bytes
        return prefix

    def _enc(self, value: Any, now: int | None = None) -> bytes:
        try:
            vb = self._serialize_value(value)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        if self._ttl is None:
            return vb
        return _Q.pack(expiry(self._time() if now is None else now, self._ttl_ms)) + vb

    def _ttl_check(self, k: bytes, raw: bytes, now: int) -> bytes | None:
        """TTL read of one stored row: the value bytes or None; cleans up or refreshes."""
        if _Q.unpack_from(raw)[0] <= now:
            self._del(k)
            return raw[8:] if self._return_expired else None
        if self._update_on_read:
            self._put(k, _Q.pack(expiry(now, self._ttl_ms)) + raw[8:])
        return raw[8:]

    def clear(self) -> None:
        self._del(self._prefix())

    def _clear_prefix(self, p: bytes) -> None:
        # Point deletes of the rows the bounded scan finds, never ``delete_range``: every
        # iterator created afterwards (each map ``items()``) re-fragments every range tombstone
        # still in the memtable, so a job clearing one small map per session made each scan cost
        # O(sessions cleared since the last flush) (0.7 ms per scan after 20k clears).
        delete = self._del
        for k in _scan_keys(self._scan_cf(), p):
            delete(k)


class RocksValueState(_RocksState, ValueState):
    kind = StateKind.VALUE

    def __init__(
        self, backend: RocksDBKeyedStateBackend, meta: StateMetaInfo, default: Any
    ) -> None:
        super().__init__(backend, meta)
        self._default = default

    def value(self) -> Any:
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        k = kb + self._namespace_bytes
        w = self._pending
        raw = w[k] if k in w else self._db_get(k)
        if raw is None:
            return self._default
        if self._ttl is not None:
            if self._update_on_read or _Q.unpack_from(raw)[0] <= (
                self._backend._pt_now if self._sampled else self._now()
            ):
                raw = self._ttl_check(k, raw, self._time())
                if raw is None:
                    return self._default
            else:
                return self._deserialize_value(raw[8:])
        return self._deserialize_value(raw)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        try:
            vb = self._serialize_value(value)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        if self._ttl is not None:
            exp = (self._backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            vb = _Q.pack(exp if exp <= INT64_MAX else INT64_MAX) + vb
        w = self._pending
        w[kb + self._namespace_bytes] = vb
        if len(w) > OVERLAY_LIMIT:
            self._backend._flush(self.name)


class _RocksFolding(_RocksState):
    def _read(self) -> tuple[bytes, Any]:
        k = self._prefix()
        raw = self._getb(k)
        if raw is None:
            return k, None
        if self._ttl is not None:
            raw = self._ttl_check(k, raw, self._time())
            if raw is None:
                return k, None
        return k, self._deserialize_value(raw)

    def _peek_for_add(self, k: bytes) -> Any:
        raw = self._getb(k)
        if raw is None:
            return None
        if self._ttl is not None:
            if _Q.unpack_from(raw)[0] <= self._time() and not self._return_expired:
                return None
            raw = raw[8:]
        return self._deserialize_value(raw)


class RocksReducingState(_RocksFolding, ReducingState):
    kind = StateKind.REDUCING

    def __init__(self, backend: RocksDBKeyedStateBackend, meta: StateMetaInfo, fn: Any) -> None:
        super().__init__(backend, meta)
        self._transform = fn

    def get(self) -> Any:
        return self._read()[1]

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"reducing state {self.name!r} cannot add None: filter it out")
        k = self._prefix()
        cur = self._peek_for_add(k)
        self._put(k, self._enc(value if cur is None else self._transform(cur, value)))


class RocksAggregatingState(_RocksFolding, AggregatingState):
    kind = StateKind.AGGREGATING

    def __init__(self, backend: RocksDBKeyedStateBackend, meta: StateMetaInfo, fn: Any) -> None:
        super().__init__(backend, meta)
        self._transform = fn

    def get(self) -> Any:
        acc = self._read()[1]
        return None if acc is None else self._transform.get_result(acc)

    def add(self, value: Any) -> None:
        k = self._prefix()
        acc = self._peek_for_add(k)
        if acc is None:
            acc = self._transform.create_accumulator()
        self._put(k, self._enc(self._transform.add(value, acc)))


class RocksListState(_RocksState, ListState):
    """One value per (key, namespace): see the module docstring for the element encoding."""

    kind = StateKind.LIST

    def get(self) -> list[Any]:
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        k = kb + self._namespace_bytes
        raw = self._getb(k)
        if raw is None:
            return []
        de = self._deserialize_value
        if self._ttl is None:
            return [de(e) for e in list_values(raw)]
        elements = decode_list(raw, True)
        now = self._backend._pt_now if self._sampled else self._now()
        live = [(e, x) for e, x in elements if x > now]  # type: ignore[operator]  # TTL lists and values always carry an expiry; None only without TTL
        if len(live) != len(elements):
            if live:
                self._put(k, encode_list([e for e, _ in live], [x for _, x in live]))  # type: ignore[misc]  # the expiries of a TTL list are ints, as decode_list gives them
            else:
                self._del(k)
            if self._return_expired:
                return [de(e) for e, _ in elements]
        elif self._update_on_read and live:
            exp = expiry(now, self._ttl_ms)
            self._put(k, encode_list([e for e, _ in live], [exp] * len(live)))
        return [de(e) for e, _ in live]

    def add(self, value: Any) -> None:
        if value is None:
            raise null_element(self.name)
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        k = kb + self._namespace_bytes
        try:
            vb = self._serialize_value(value)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        n = len(vb)
        enc = (bytes((n,)) if n < 0x80 else varint(n)) + vb
        if self._ttl is not None:
            exp = (self._backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            enc = _Q.pack(exp if exp <= INT64_MAX else INT64_MAX) + enc
        raw = self._getb(k)
        self._put(k, enc if raw is None else raw + enc)

    def add_all(self, values: Iterable[Any]) -> None:
        k = self._prefix()
        enc = self._encode_all(values)
        if enc:
            raw = self._getb(k)
            self._put(k, enc if raw is None else raw + enc)

    def update(self, values: Iterable[Any] | None) -> None:
        k = self._prefix()
        enc = b"" if values is None else self._encode_all(values)
        if enc:
            self._put(k, enc)
        else:
            self._del(k)

    def _encode_all(self, values: Iterable[Any]) -> bytes:
        vals = list_elements(self.name, values)
        try:
            elements = [self._serialize_value(v) for v in vals]
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        if self._ttl is None:
            return encode_list(elements)
        return encode_list(elements, [expiry(self._time(), self._ttl_ms)] * len(elements))


class RocksMapState(_RocksState, MapState):
    kind = StateKind.MAP

    def __init__(self, backend: RocksDBKeyedStateBackend, meta: StateMetaInfo) -> None:
        super().__init__(backend, meta)
        self._kser = meta.serializers["user_key"].serialize
        self._deserialize_user_key = meta.serializers["user_key"].deserialize

    def _ukey(self, key: Any) -> bytes:
        try:
            return self._kser(key)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e

    def get(self, key: Any) -> Any:
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        try:
            k = kb + self._namespace_bytes + self._kser(key)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        w = self._pending
        raw = w[k] if k in w else self._db_get(k)
        if raw is None:
            return None
        if self._ttl is not None:
            if self._update_on_read or _Q.unpack_from(raw)[0] <= (
                self._backend._pt_now if self._sampled else self._now()
            ):
                raw = self._ttl_check(k, raw, self._time())
                if raw is None:
                    return None
            else:
                return self._deserialize_value(raw[8:])
        return self._deserialize_value(raw)

    def contains(self, key: Any) -> bool:
        if self._ttl is None:
            return self._getb(self._prefix() + self._ukey(key)) is not None
        return self.get(key) is not None

    def put(self, key: Any, value: Any) -> None:
        kb = self._backend._key_bytes
        if kb is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        try:
            k = kb + self._namespace_bytes + self._kser(key)
            vb = self._serialize_value(value)
        except SerializationError as e:
            raise _bad_value(self.name, e) from e
        if self._ttl is not None:
            exp = (self._backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            vb = _Q.pack(exp if exp <= INT64_MAX else INT64_MAX) + vb
        w = self._pending
        w[k] = vb
        if len(w) > OVERLAY_LIMIT:
            self._backend._flush(self.name)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if not isinstance(entries, Mapping):
            raise StateError(
                f"map state {self.name!r}: put_all takes a mapping, got {type(entries).__name__}"
            )
        p = self._prefix()
        now = self._time() if self._ttl is not None else None
        rows = [(p + self._ukey(k), self._enc(v, now)) for k, v in entries.items()]
        for k, v in rows:
            self._put(k, v)

    def remove(self, key: Any) -> None:
        self._del(self._prefix() + self._ukey(key))

    def clear(self) -> None:
        self._clear_prefix(self._prefix())

    def items(self) -> list[tuple[Any, Any]]:
        p = self._prefix()
        n = len(p)
        kde, vde = self._deserialize_user_key, self._deserialize_value
        if self._ttl is None:
            return [(kde(k[n:]), vde(v)) for k, v in _scan(self._scan_cf(), p)]
        now = self._time()
        out = []
        for k, raw in list(_scan(self._scan_cf(), p)):
            vb = self._ttl_check(k, raw, now)
            if vb is not None:
                out.append((kde(k[n:]), vde(vb)))
        return out

    def keys(self) -> list[Any]:
        if self._ttl is None:
            p = self._prefix()
            n = len(p)
            return [self._deserialize_user_key(k[n:]) for k, _ in _scan(self._scan_cf(), p)]
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        if self._ttl is None:
            return next(_scan(self._scan_cf(), self._prefix()), None) is None
        return not self.items()


# --- views ---


class RocksDBStateView(KeyedStateView):
    """A RocksDB checkpoint (hard links, taken synchronously) opened read-only."""

    def __init__(self, backend: RocksDBKeyedStateBackend, path: Path, now: dict[str, int | None]):
        self._path = path
        self._metas = {n: backend._metas[n] for n in backend._metas}
        self._now = now
        self._range = backend.key_group_range
        self._max_p = backend.max_parallelism
        self._key_de = backend.key_serializer.deserialize
        self._released = False
        opts = _options()
        cfs = {CF_PREFIX + n: rd.Options(raw_mode=True) for n in self._metas}
        self._db = rd.Rdict(str(path), opts, column_families=cfs)
        self._column_families = {n: self._db.get_column_family(CF_PREFIX + n) for n in self._metas}

    @property
    def states(self) -> Mapping[str, StateMetaInfo]:
        return self._metas

    def iter_entries(self, key_groups: KeyGroupRange | None = None) -> Iterator[StateEntry]:
        if self._released:
            raise StateError("this snapshot view was released: take a new snapshot_view()")
        kgs = self._range if key_groups is None else self._range.intersection(key_groups)
        if kgs.is_empty:
            return
        names = sorted(self._metas)
        for kg in kgs:
            kgp = key_group_prefix(kg, self._max_p)
            plen = len(kgp)
            keys: dict[bytes, int] = {}
            for name in names:
                meta = self._metas[name]
                ttl = meta.ttl is not None
                now = self._now[name]
                is_list = meta.kind is StateKind.LIST
                for k, raw in _scan(self._column_families[name], kgp):
                    klen, p = read_varint(k, plen)
                    kb = k[p : p + klen]
                    p += klen
                    nlen, p = read_varint(k, p)
                    nsb = k[p : p + nlen]
                    p += nlen
                    h = keys.get(kb)
                    if h is None:
                        h = keys[kb] = key_hash(self._key_de(kb))
                    if is_list:
                        try:
                            elements = decode_list(raw, ttl)
                        except SerializationError as e:
                            raise _bad_value(name, e) from e
                        pos = 0
                        for eb, ea in elements:
                            if now is None or ea > now:  # type: ignore[operator]  # TTL lists and values always carry an expiry; None only without TTL
                                yield StateEntry(kg, h, kb, nsb, name, _POS.pack(pos), eb, ea)
                                pos += 1
                        continue
                    if ttl:
                        exp: int | None = _Q.unpack_from(raw)[0]
                        if now is not None and exp <= now:  # type: ignore[operator]  # TTL lists and values always carry an expiry; None only without TTL
                            continue
                        raw = raw[8:]
                    else:
                        exp = None
                    yield StateEntry(kg, h, kb, nsb, name, k[p:] or None, raw, exp)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._column_families.clear()
            self._db.close()
            shutil.rmtree(self._path, ignore_errors=True)


# --- backend ---


_KINDS: dict[StateKind, type[_RocksState]] = {
    StateKind.VALUE: RocksValueState,
    StateKind.LIST: RocksListState,
    StateKind.MAP: RocksMapState,
    StateKind.REDUCING: RocksReducingState,
    StateKind.AGGREGATING: RocksAggregatingState,
}


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state in a local RocksDB under ``path`` (``path/db``; views under ``path/views``).

    If ``path/db`` already holds a DB written by this backend (a restored native snapshot), it is
    opened with its states.
    """

    def __init__(
        self,
        path: str | Path,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(key_serializer, max_parallelism, key_group_range, clock)
        self.path = Path(path)
        self.db_path = self.path / "db"
        self._views_dir = self.path / "views"
        self._view_seq = 0
        self._prefix_len = key_group_prefix_length(self.max_parallelism)
        self._kg_prefixes = [
            key_group_prefix(kg, self.max_parallelism) for kg in range(self.max_parallelism)
        ]
        self._write_options = _write_options()
        existing: list[str] = []
        if (self.db_path / "CURRENT").exists():
            existing = [n for n in rd.Rdict.list_cf(str(self.db_path)) if n != "default"]
        self.db_path.mkdir(parents=True, exist_ok=True)
        self._db = rd.Rdict(
            str(self.db_path),
            _options(),
            column_families={n: _cf_options() for n in existing},
        )
        self._db.set_write_options(self._write_options)
        self._column_families: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}  # column-family handles, for write batches
        self._overlays: dict[str, Overlay] = {}
        for _, v in _scan(self._db, META_PREFIX):
            meta = StateMetaInfo.from_dict(json.loads(v))
            self._metas[meta.name] = meta
        old_lists = [n for n, m in self._metas.items() if m.kind is StateKind.LIST]
        if old_lists and self._db.get(OLD_LIST_SEQ_KEY) is not None:
            self._db.close()
            raise StateError(
                f"the RocksDB at {self.db_path} stores list states {old_lists} in the old "
                "one-row-per-element layout, which this version does not read: restore it from a "
                "canonical snapshot (or savepoint) instead of its native files"
            )

    def _key_extra(self, key: Any, key_group: int) -> bytes:
        kb = self.key_serializer.serialize(key)
        return self._kg_prefixes[key_group] + varint(len(kb)) + kb

    def _cf(self, name: str) -> Any:
        cf = self._column_families.get(name)
        if cf is None:
            cf_name = CF_PREFIX + name
            try:
                cf = self._db.get_column_family(cf_name)
            except Exception:
                cf = self._db.create_column_family(cf_name, _cf_options())
            cf.set_write_options(self._write_options)
            self._column_families[name] = cf
            self._handles[name] = self._db.get_column_family_handle(cf_name)
        return cf

    def _overlay(self, name: str) -> Overlay:
        """State ``name``'s write overlay (one dict for the backend's life: states hold it)."""
        return self._overlays.setdefault(name, {})

    def _flush(self, name: str | None = None) -> None:
        """Write the overlay of state ``name`` (None: of every state) into the DB, in one batch."""
        names = list(self._overlays) if name is None else [name]
        write_overlays(
            self._db,
            [(self._handles[n], self._overlays[n]) for n in names if self._overlays.get(n)],
            self._write_options,
        )

    def _save_meta(self, meta: StateMetaInfo) -> None:
        self._db.put(META_PREFIX + meta.name.encode(), json.dumps(meta.to_dict()).encode())

    def _create_state(
        self, descriptor: StateDescriptor, meta: StateMetaInfo, migrate_from: StateMetaInfo | None
    ) -> State:
        self._cf(meta.name)
        if migrate_from is not None:
            self._migrate(meta, migrate_from)
        self._save_meta(meta)
        kind = meta.kind
        if kind is StateKind.VALUE:
            return RocksValueState(self, meta, descriptor.default)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        if kind is StateKind.REDUCING:
            return RocksReducingState(self, meta, descriptor.reduce_fn)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        if kind is StateKind.AGGREGATING:
            fn = descriptor.aggregate_function  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
            return RocksAggregatingState(self, meta, fn)
        return _KINDS[kind](self, meta)

    def _migrate(self, meta: StateMetaInfo, old: StateMetaInfo) -> None:
        """Rewrite every value of a state in the new serializer's format."""
        cf = self._cf(meta.name)  # no overlay yet: the state object is made after this
        prev: TypeSerializer = old.serializers["value"]
        cur: TypeSerializer = meta.serializers["value"]
        ttl = meta.ttl is not None
        is_list = meta.kind is StateKind.LIST
        for k, raw in list(cf.items()):
            if is_list:
                elements = decode_list(raw, ttl)
                conv = [cur.serialize(prev.deserialize(e)) for e, _ in elements]
                cf.put(k, encode_list(conv, [x for _, x in elements] if ttl else None))  # type: ignore[misc]  # the expiries of a TTL list are ints, as decode_list gives them
                continue
            head, body = (raw[:8], raw[8:]) if ttl else (b"", raw)
            cf.put(k, head + cur.serialize(prev.deserialize(body)))

    def _register_restored(self, meta: StateMetaInfo) -> None:
        self._cf(meta.name)
        self._save_meta(meta)

    def keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        if state_name not in self._metas:
            raise StateError(
                f"no state named {state_name!r} in this backend (known: "
                f"{', '.join(sorted(self._metas)) or 'none'}): register it with get_state first"
            )
        meta = self._metas[state_name]
        nb = meta.serializers["namespace"].serialize(namespace)
        want = varint(len(nb)) + nb
        cf = self._cf(state_name)
        self._flush(state_name)
        de = self.key_serializer.deserialize
        start = self._kg_prefixes[self.key_group_range.start]
        end_kg = self.key_group_range.end + 1
        last = None
        for k in list(cf.keys(from_key=start)):
            if k[: self._prefix_len] >= (
                end_kg.to_bytes(self._prefix_len, "big") if end_kg < 1 << 16 else b"\xff\xff\xff"
            ):
                break
            klen, p = read_varint(k, self._prefix_len)
            kb = k[p : p + klen]
            p += klen
            nlen, q = read_varint(k, p)
            if k[p : q + nlen] == want and kb != last:
                last = kb
                yield de(kb)

    def snapshot_view(self, incremental: bool = False) -> RocksDBStateView:
        self._check_open()
        if incremental:
            raise StateError(
                "the RocksDB backend has no incremental snapshot view: its incremental snapshots "
                "are native (create_checkpoint + live_sst_files); take snapshot_view() for rows"
            )
        self._views_dir.mkdir(parents=True, exist_ok=True)
        self._view_seq += 1
        path = self._views_dir / f"view-{self._view_seq}"
        shutil.rmtree(path, ignore_errors=True)
        self.create_checkpoint(path)
        now: dict[str, int | None] = {}
        for name, meta in self._metas.items():
            cleanup = meta.ttl is not None and meta.ttl.cleanup.full_snapshot
            now[name] = self.time_source(meta)() if cleanup else None
        view = RocksDBStateView(self, path, now)
        view.view_id = self._view_seq
        return view

    def snapshot_strategy(self, format: SnapshotFormat) -> SnapshotStrategy | None:
        """``NATIVE``: the DB's own files (SSTs shared between incremental checkpoints); any
        other format is written canonically."""
        from state_engine.backends.rocksdb.snapshot import NativeSnapshotStrategy

        if format != NativeSnapshotStrategy.format:
            return None
        return NativeSnapshotStrategy(self)

    def create_checkpoint(self, path: str | Path) -> None:
        """A RocksDB checkpoint (hard-linked SSTs plus private files) in the new dir ``path``."""
        self._check_open()
        self._flush()
        rd.Checkpoint(self._db).create_checkpoint(str(path))

    def live_sst_files(self) -> list[dict[str, Any]]:
        """The live SST files (name, size, level, key range, entries) of every column family.

        No overlay flush: a flush fills the memtable, which no SST lists until RocksDB flushes it
        (as :meth:`create_checkpoint` does, after writing the overlays)."""
        return list(self._db.live_files())

    def delete_key_group_range(self, key_groups: KeyGroupRange) -> None:
        """Delete every row of ``key_groups`` in every state (after restoring a wider DB)."""
        if key_groups.is_empty:
            return
        start = self._kg_prefixes[key_groups.start]
        end = (key_groups.end + 1).to_bytes(self._prefix_len, "big")
        self._flush()  # an unflushed row of the range written after the delete would outlive it
        for name in self._metas:
            self._cf(name).delete_range(start, end)

    def cleanup_expired(self) -> int:
        """Delete every expired row of every TTL state now; returns how many rows were deleted.

        rocksdict cannot install a compaction filter written in Python, so Flink's RocksDB
        compaction-filter cleanup is replaced by this explicit sweep: it reads each TTL state's
        column family once (a full scan) and deletes the rows whose ``expires_at <= now``. Call it
        from the runtime (e.g. between checkpoints) for states with ``rocksdb_compaction`` cleanup.
        """
        self._check_open()
        self._flush()
        deleted = 0
        for name, meta in self._metas.items():
            if meta.ttl is None:
                continue
            now = self.time_source(meta)()
            cf = self._cf(name)
            if meta.kind is StateKind.LIST:
                deleted += self._cleanup_lists(cf, now)
                continue
            dead = [k for k, v in cf.items() if _Q.unpack_from(v)[0] <= now]
            for k in dead:
                cf.delete(k)
            deleted += len(dead)
        return deleted

    @staticmethod
    def _cleanup_lists(cf: Any, now: int) -> int:
        """Drop expired elements of every list (one row per list); returns elements dropped."""
        dropped = 0
        for k, raw in list(cf.items()):
            elements = decode_list(raw, True)
            live = [(e, x) for e, x in elements if x > now]  # type: ignore[operator]  # TTL lists and values always carry an expiry; None only without TTL
            if len(live) == len(elements):
                continue
            dropped += len(elements) - len(live)
            if live:
                cf.put(k, encode_list([e for e, _ in live], [x for _, x in live]))  # type: ignore[misc]  # the expiries of a TTL list are ints, as decode_list gives them
            else:
                cf.delete(k)
        return dropped

    def _restore_entries(self, plan: RestorePlan, entries: Iterable[StateEntry]) -> None:
        # rows go straight to the DB (list rows are read there): earlier writes must be in it
        self._flush()
        coders: dict[str, tuple[Any, bool, bool, Any]] = {}
        for name, (written, current) in plan.items():
            prev, cur = written.serializers["value"], current.serializers["value"]
            needs = prev.snapshot() != cur.snapshot()
            conv = (lambda b, p=prev, c=cur: c.serialize(p.deserialize(b))) if needs else None
            coders[name] = (
                self._cf(name),
                current.ttl is not None,
                current.kind is StateKind.LIST,
                conv,
            )
        # Rows of one list arrive in position order, usually one after another: they are gathered
        # and appended to the list's value in one read and one write.
        list_cf: Any = None
        list_key = b""
        list_parts: list[bytes] = []

        def flush_list() -> None:
            if list_parts:
                raw = list_cf.get(list_key)
                list_cf.put(list_key, b"".join([raw or b"", *list_parts]))
                list_parts.clear()

        for row in entries:
            kgi = self._check_row_key_group(row.key_group)
            c = coders.get(row.state)
            if c is None:
                raise self._unknown_state_row(row.state)
            cf, ttl, is_list, conv = c
            k = (
                self._kg_prefixes[kgi + self._kg_start]
                + varint(len(row.key))
                + row.key
                + varint(len(row.namespace))
                + row.namespace
            )
            v = row.value if conv is None else conv(row.value)
            exp = _Q.pack(INT64_MAX if row.expires_at is None else row.expires_at) if ttl else b""
            if is_list:
                if cf is not list_cf or k != list_key:
                    flush_list()
                    list_cf, list_key = cf, k
                list_parts.append(exp + varint(len(v)) + v)
                continue
            if row.user_key is not None:
                k += row.user_key
            cf.put(k, exp + v)
        flush_list()

    def close(self) -> None:
        if not self._closed:
            # A column-family handle keeps the DB (and its LOCK) open: state objects the job still
            # holds must drop theirs, or the directory cannot be reopened in this process.
            try:
                self._flush()
            finally:
                for st in self._states.values():
                    st._detach()  # type: ignore[attr-defined]  # every state class of this backend has _detach
                self._states.clear()
                self._column_families.clear()
                self._handles.clear()
                self._db.close()
        super().close()
