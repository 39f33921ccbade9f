"""The heap keyed state backend: deserialized objects in plain dicts, one dict per key group.

Layout: per state a list of ``2 * n`` dicts for the ``n`` owned key groups; slot ``i`` holds the
void-namespace values of key group ``start + i`` keyed by key, slot ``n + i`` the values of other
namespaces keyed by ``(key, namespace)``. Cutting out a key-group range touches only its slots.

With TTL a stored value is a ``(value, expires_at)`` tuple (per element for lists, per entry for
maps).

Snapshots are copy-on-write per slot: ``snapshot_view`` keeps references to the slots and marks
them frozen; the first write to a frozen slot copies it (and the lists, maps and accumulators in it,
which are mutated in place), so the view never sees a later write. A value state's values are
handed out by reference, so its first read of a frozen slot copies the slot too, with every mutable
value in it (Flink's copy-on-read of state shared with a running snapshot): a value read, changed
in place and written back while a snapshot is being written from the view does not leak into it.
"""

from __future__ import annotations

import copy
import itertools
import operator
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.backends.base import (
    ChangedKey,
    KeyedStateBackend,
    KeyedStateView,
    null_element,
)
from state_engine.errors import InvalidSnapshotRequest, SerializationError, StateError
from state_engine.hashing import key_hash
from state_engine.keygroups import KeyGroupRange
from state_engine.snapshot.canonical import int_values
from state_engine.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from state_engine.state.descriptors import StateDescriptor, StateKind
from state_engine.state.meta import StateColumns, StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE
from state_engine.state.ttl import INT64_MAX, Clock, expiry

if TYPE_CHECKING:
    from state_engine.backends.heap.snapshot import DeltaSnapshotStrategy
    from state_engine.snapshot.strategy import SnapshotStrategy
    from state_engine.snapshot_enums import SnapshotFormat

_POS = struct.Struct(">I")
# Values whose identity implies their content: a cached row of one stays valid (no TTL).
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None)})
_NO_DEFAULT = object()
_MISSING: Any = object()
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
# An expiry below this bound cannot pass INT64_MAX when added to a wall-clock time in ms, so the
# fast TTL write paths skip the clamp.
_NO_CLAMP_TTL = INT64_MAX - (1 << 62)


class _HeapState(State):
    """Shared plumbing: slot lookup, copy-on-write, TTL time, change marks, incremental cleanup."""

    kind: StateKind

    def __init__(self, backend: HeapKeyedStateBackend, meta: StateMetaInfo) -> None:
        self.name = meta.name
        self.meta = meta
        self._b = backend
        self._tables: list[dict[Any, Any]] = backend._tables_of[meta.name]
        self._frozen: set[int] = backend._frozen_of[meta.name]
        # Per slot, the composite keys written since the last view; None: not tracking.
        self._dirty: list[set[Any]] | None = backend._dirty_of.get(meta.name)
        # Map states: per slot, the (composite key, user key) entries put or removed since the
        # last view (a delta then writes just those entries, not the key's whole map).
        self._dirty_uk: list[set[tuple[Any, Any]]] | None = backend._dirty_uk_of.get(meta.name)
        self._n = backend._kg_count
        self._void = True
        self._ns: Any = VOID_NAMESPACE
        self._off = 0
        self._ns_ser = meta.serializers["namespace"]
        ttl = meta.ttl
        self._ttl = ttl
        self._ttl_ms = ttl.ttl_ms if ttl else 0
        self._upd_read = bool(ttl and ttl.update_on_read)
        self._ret_exp = bool(ttl and ttl.return_expired)
        self._sampled: bool
        self._now: Callable[[], int]
        self._sampled, self._now = backend.state_time(meta)
        self._inc = ttl.cleanup.incremental_size if ttl else 0
        self._inc_slot = -1
        self._inc_keys: list[Any] = []
        self._inc_pos = 0
        # Per slot, the rows of the last full view (value states), see HeapStateView.
        self._row_cache: list[dict[Any, tuple[Any, StateEntry]]] | None = None
        if ttl and ttl.cleanup.incremental_every_record:
            backend._record_cleanups.append(self._inc_step)
            backend._specialise_set_current_key()
        self._install_fast()

    #: Per kind: (method name, fast variant without TTL, fast variant with TTL).
    _FAST: tuple[tuple[str, str, str], ...] = ()
    #: The fast variants that write, and their variants that also mark the change (a backend
    #: tracking changes for delta snapshots); the others only read.
    _TRACKED: Mapping[str, str] = {}

    def _install_fast(self) -> None:
        """Bind the hot methods to variants without the checks this state never needs.

        Eligible: void namespace, and without TTL or with TTL read from the per-record time, no
        refresh on read, no incremental cleanup. Each check the generic method does per call
        costs about as much as the dict lookup it guards. With change tracking the writing
        methods get variants that mark what they wrote. The fast variants fall back to the
        generic method for anything unusual (an expired value, no current key).
        """
        ttl = self._ttl
        ok = self._void
        if ttl is not None:
            ok = ok and self._sampled and not self._upd_read and not self._inc
            ok = ok and self._ttl_ms <= _NO_CLAMP_TTL
        tracked = self._dirty is not None
        for name, plain, timed in self._FAST:
            variant = plain if ttl is None else timed
            if tracked:
                variant = self._TRACKED.get(variant, variant)
            if ok:
                setattr(self, name, getattr(self, variant))
            else:
                self.__dict__.pop(name, None)

    # --- slots ---

    def set_current_namespace(self, namespace: Any) -> None:
        void = namespace is VOID_NAMESPACE
        if not void:
            self._ns_ser.serialize(namespace)  # fail now, not at the next snapshot
        self._ns = namespace
        # the fast methods depend only on whether it is void: a window job that switches
        # namespaces every record does not rebind them every time
        if void is not self._void:
            self._void, self._off = void, 0 if void else self._n
            self._install_fast()

    def _slot(self) -> int:
        kgi = self._b._kgi
        if kgi is None:
            raise self._b.no_current_key(f"state {self.name!r}")
        return kgi + self._off

    def _ck(self) -> Any:
        return self._b._key if self._void else (self._b._key, self._ns)

    def _writable(self, i: int) -> dict[Any, Any]:
        t = self._tables[i]
        if self._frozen and i in self._frozen:
            t = self._copy_table(t)
            self._tables[i] = t
            self._frozen.discard(i)
        return t

    def _copy_table(self, t: dict[Any, Any]) -> dict[Any, Any]:
        return dict(t)

    def _mark(self, i: int, ck: Any) -> None:
        d = self._dirty
        if d is not None:
            d[i].add(ck)

    def clear(self) -> None:
        i = self._slot()
        ck = self._ck()
        if ck in self._tables[i]:
            del self._writable(i)[ck]
            self._mark(i, ck)
        if self._inc:
            self._inc_step()

    # --- TTL ---

    def _time(self) -> int:
        return self._b._pt_now if self._sampled else self._now()

    def _expiry(self) -> int:
        t = (self._b._pt_now if self._sampled else self._now()) + self._ttl_ms
        return t if t <= INT64_MAX else INT64_MAX

    def _purge(self, i: int, ck: Any, now: int) -> None:
        """Drop what expired under ``ck`` in slot ``i`` (value kinds: the whole entry)."""
        e = self._tables[i].get(ck)
        if e is not None and e[1] <= now:
            del self._writable(i)[ck]
            self._mark(i, ck)

    def _inc_step(self) -> None:
        """Check up to ``incremental_size`` entries, continuing where the last step stopped."""
        budget = self._inc
        now = self._time()
        tables = self._tables
        visited = 0
        while budget > 0:
            if self._inc_pos >= len(self._inc_keys):
                if visited > len(tables):
                    return  # the whole state is empty
                visited += 1
                self._inc_slot = (self._inc_slot + 1) % len(tables)
                self._inc_keys = list(tables[self._inc_slot])
                self._inc_pos = 0
                continue
            ck = self._inc_keys[self._inc_pos]
            self._inc_pos += 1
            budget -= 1
            self._purge(self._inc_slot, ck, now)

    # --- export ---

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        raise NotImplementedError

    def _restore(self, t: dict[Any, Any], ck: Any, uk: Any, v: Any, expires_at: int) -> None:
        """Add one restored row's value (``uk``: decoded user key) into table ``t``."""
        t[ck] = v if self._ttl is None else (v, expires_at)


# --- value-like kinds ---

#: Values no caller can change in place: a value state's copy-on-read shares them.
_ATOMIC = frozenset({int, float, str, bytes, bool, type(None), complex})


class HeapValueState(_HeapState, ValueState):
    kind = StateKind.VALUE

    _FAST = (("value", "_value_plain", "_value_ttl"), ("update", "_update_plain", "_update_ttl"))
    _TRACKED = {"_update_plain": "_update_plain_tracked", "_update_ttl": "_update_ttl_tracked"}

    def __init__(self, backend: HeapKeyedStateBackend, meta: StateMetaInfo, default: Any) -> None:
        super().__init__(backend, meta)
        self._default = default

    def _copy_table(self, t: dict[Any, Any]) -> dict[Any, Any]:
        # values shared with a view: the mutable ones are copied (atomic ones and tuples of
        # them come back as they are from deepcopy's own shortcuts)
        if self._ttl is None:
            return {k: v if type(v) in _ATOMIC else copy.deepcopy(v) for k, v in t.items()}
        return {
            k: e if type(e[0]) in _ATOMIC else (copy.deepcopy(e[0]), e[1]) for k, e in t.items()
        }

    def _value_plain(self) -> Any:
        b = self._b
        i = b._kgi
        if self._frozen and i in self._frozen:
            return HeapValueState.value(self)  # copies the slot first (see _copy_table)
        try:
            return self._tables[i].get(b._key, self._default)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None

    def _value_ttl(self) -> Any:
        b = self._b
        i = b._kgi
        if self._frozen and i in self._frozen:
            return HeapValueState.value(self)
        try:
            e = self._tables[i].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        if e is None:
            return self._default
        if e[1] > b._pt_now:
            return e[0]
        return HeapValueState.value(self)

    def _update_plain(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[i][b._key] = value

    def _update_ttl(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[i][b._key] = (value, b._pt_now + self._ttl_ms)

    def _update_plain_tracked(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[i][b._key] = value
        self._dirty[i].add(b._key)  # type: ignore[index]  # bound only when tracking

    def _update_ttl_tracked(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[i][b._key] = (value, b._pt_now + self._ttl_ms)
        self._dirty[i].add(b._key)  # type: ignore[index]  # bound only when tracking

    def value(self) -> Any:
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        t = self._tables[i]
        if self._frozen and i in self._frozen:
            t = self._writable(i)  # the caller may change what it reads in place
        e = t.get(b._key if self._void else (b._key, self._ns))
        if self._ttl is None:
            return self._default if e is None else e
        if e is not None:
            if e[1] <= (b._pt_now if self._sampled else self._now()) or self._upd_read:
                e = self._ttl_read(e)
            else:
                e = e[0]
        if self._inc:
            self._inc_step()
        return self._default if e is None else e

    def _ttl_read(self, e: tuple[Any, int]) -> Any:
        now = self._time()
        i, ck = self._slot(), self._ck()
        if e[1] <= now:
            del self._writable(i)[ck]
            self._mark(i, ck)
            return e[0] if self._ret_exp else None
        if self._upd_read:
            self._writable(i)[ck] = (e[0], expiry(now, self._ttl_ms))
            self._mark(i, ck)
        return e[0]

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        t = self._tables[i]
        if self._frozen and i in self._frozen:
            t = self._writable(i)
        ck = b._key if self._void else (b._key, self._ns)
        if self._ttl is None:
            t[ck] = value
        else:
            exp = (b._pt_now if self._sampled else self._now()) + self._ttl_ms
            t[ck] = (value, exp if exp <= INT64_MAX else INT64_MAX)
            if self._inc:
                self._inc_step()
        if self._dirty is not None:
            self._dirty[i].add(ck)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        ser = self.meta.serializers["value"].serialize
        if self._ttl is None:
            yield None, ser(obj), None
        elif now is None or obj[1] > now:
            yield None, ser(obj[0]), obj[1]


class _HeapFoldingState(_HeapState):
    """Reducing and aggregating state: one folded value per key and namespace."""

    def _copy_table(self, t: dict[Any, Any]) -> dict[Any, Any]:
        # Reduce and aggregate functions may mutate the stored value in place: copy it for real.
        ser = self.meta.serializers["value"]

        def rt(v: Any) -> Any:
            return ser.deserialize(ser.serialize(v))

        if self._ttl is None:
            return {k: rt(v) for k, v in t.items()}
        return {k: (rt(v[0]), v[1]) for k, v in t.items()}

    def _current(self) -> tuple[int, Any, Any]:
        """(slot, composite key, stored value or None after the TTL read check)."""
        i = self._slot()
        ck = self._ck()
        e = self._tables[i].get(ck)
        if e is None or self._ttl is None:
            return i, ck, e
        now = self._time()
        if e[1] <= now:
            del self._writable(i)[ck]
            self._mark(i, ck)
            return i, ck, (e[0] if self._ret_exp else None)
        if self._upd_read:
            self._writable(i)[ck] = (e[0], expiry(now, self._ttl_ms))
            self._mark(i, ck)
        return i, ck, e[0]

    def _store(self, i: int, ck: Any, v: Any) -> None:
        t = self._writable(i)
        t[ck] = v if self._ttl is None else (v, self._expiry())
        if self._dirty is not None:
            self._dirty[i].add(ck)
        if self._inc:
            self._inc_step()

    def _peek_for_add(self, i: int, ck: Any) -> Any:
        """The value an add folds into: expired values only with RETURN_EXPIRED (as Flink)."""
        e = self._tables[i].get(ck)
        if e is None or self._ttl is None:
            return e
        if e[1] <= self._time() and not self._ret_exp:
            return None
        return e[0]

    _rows = HeapValueState._rows


class HeapReducingState(_HeapFoldingState, ReducingState):
    kind = StateKind.REDUCING

    def __init__(self, backend: HeapKeyedStateBackend, meta: StateMetaInfo, fn: Any) -> None:
        super().__init__(backend, meta)
        self._fn = fn

    def get(self) -> Any:
        v = self._current()[2]
        if self._inc:
            self._inc_step()
        return v

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"reducing state {self.name!r} cannot add None: filter it out")
        i = self._slot()
        ck = self._ck()
        cur = self._peek_for_add(i, ck)
        self._store(i, ck, value if cur is None else self._fn(cur, value))


class HeapAggregatingState(_HeapFoldingState, AggregatingState):
    kind = StateKind.AGGREGATING

    def __init__(self, backend: HeapKeyedStateBackend, meta: StateMetaInfo, fn: Any) -> None:
        super().__init__(backend, meta)
        self._fn = fn

    def get(self) -> Any:
        acc = self._current()[2]
        if self._inc:
            self._inc_step()
        return None if acc is None else self._fn.get_result(acc)

    def add(self, value: Any) -> None:
        i = self._slot()
        ck = self._ck()
        acc = self._peek_for_add(i, ck)
        if acc is None:
            acc = self._fn.create_accumulator()
        self._store(i, ck, self._fn.add(value, acc))


# --- list ---


class HeapListState(_HeapState, ListState):
    """A list is a Python list; with TTL a list of ``(value, expires_at)`` tuples.

    (Parallel value/expiry lists made the TTL read C-fast but cost three tracked containers per
    list; the cyclic GC then dominated appends to new keys.)
    """

    kind = StateKind.LIST
    _FAST = (("get", "_get_plain", "_get_ttl"), ("add", "_add_plain", "_add_ttl"))
    _TRACKED = {"_add_plain": "_add_tracked", "_add_ttl": "_add_tracked"}

    def _copy_table(self, t: dict[Any, Any]) -> dict[Any, Any]:
        return {k: list(v) for k, v in t.items()}

    def _get_plain(self) -> list[Any]:
        b = self._b
        try:
            e = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        return [] if e is None else list(e)

    def _get_ttl(self) -> list[Any]:
        b = self._b
        try:
            e = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        if e is None:
            return []
        # All live (the common case): two C-level passes instead of a comprehension's frame.
        if min(map(_SECOND, e), default=INT64_MAX) > b._pt_now:
            return list(map(_FIRST, e))
        return HeapListState.get(self)

    def _add_plain(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapListState.add(self, value)
            return
        t = self._tables[i]
        e = t.get(b._key)
        if e is None:
            t[b._key] = [value]
        else:
            e.append(value)

    def _add_ttl(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapListState.add(self, value)
            return
        t = self._tables[i]
        e = t.get(b._key)
        if e is None:
            t[b._key] = [(value, b._pt_now + self._ttl_ms)]
        else:
            e.append((value, b._pt_now + self._ttl_ms))

    def _add_tracked(self, value: Any) -> None:
        b = self._b
        i = b._kgi
        if value is None or i is None or (self._frozen and i in self._frozen):
            HeapListState.add(self, value)
            return
        if self._ttl is None:
            self._add_plain(value)
        else:
            self._add_ttl(value)
        self._dirty[i].add(b._key)  # type: ignore[index]  # bound only when tracking

    def get(self) -> list[Any]:
        b = self._b
        try:
            t = self._tables[b._kgi + self._off]  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        e = t.get(b._key if self._void else (b._key, self._ns))
        if self._ttl is None:
            return [] if e is None else list(e)
        if e is None:
            out = []
        else:
            now = b._pt_now if self._sampled else self._now()
            out = [x[0] for x in e if x[1] > now]
            if len(out) != len(e) or self._upd_read:
                out = self._ttl_get(e)
        if self._inc:
            self._inc_step()
        return out

    def _ttl_get(self, e: list[tuple[Any, int]]) -> list[Any]:
        now = self._time()
        i, ck = self._slot(), self._ck()
        live = [x for x in e if x[1] > now]
        out = [x[0] for x in (e if self._ret_exp else live)]
        if self._upd_read and live:
            exp = expiry(now, self._ttl_ms)
            live = [(x[0], exp) for x in live]
        if len(live) != len(e) or self._upd_read:
            t = self._writable(i)
            if live:
                t[ck] = live
            else:
                del t[ck]
            self._mark(i, ck)
        return out

    def add(self, value: Any) -> None:
        if value is None:
            raise null_element(self.name)
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        t = self._tables[i]
        if self._frozen and i in self._frozen:
            t = self._writable(i)
        ck = b._key if self._void else (b._key, self._ns)
        if self._ttl is not None:
            exp = (b._pt_now if self._sampled else self._now()) + self._ttl_ms
            value = (value, exp if exp <= INT64_MAX else INT64_MAX)
            if self._inc:
                self._inc_step()
        e = t.get(ck)
        if e is None:
            t[ck] = [value]
        else:
            e.append(value)
        if self._dirty is not None:
            self._dirty[i].add(ck)

    def add_all(self, values: Iterable[Any]) -> None:
        vals = self._elements(values)
        if not vals:
            return
        i, ck = self._slot(), self._ck()
        t = self._writable(i)
        e = t.get(ck)
        if e is None:
            t[ck] = vals
        else:
            e.extend(vals)
        self._mark(i, ck)
        if self._inc:
            self._inc_step()

    def update(self, values: Iterable[Any] | None) -> None:
        vals = [] if values is None else self._elements(values)
        i, ck = self._slot(), self._ck()
        t = self._tables[i]
        if vals:
            self._writable(i)[ck] = vals
            self._mark(i, ck)
        elif ck in t:
            del self._writable(i)[ck]
            self._mark(i, ck)
        if self._inc:
            self._inc_step()

    def _elements(self, values: Iterable[Any]) -> list[Any]:
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise StateError(
                f"list state {self.name!r} takes an iterable of elements, got "
                f"{type(values).__name__}: wrap a single element in a list or use add()"
            )
        vals = list(values)
        if any(v is None for v in vals):
            raise null_element(self.name)
        if self._ttl is not None and vals:
            exp = self._expiry()
            vals = [(v, exp) for v in vals]
        return vals

    def _purge(self, i: int, ck: Any, now: int) -> None:
        e = self._tables[i].get(ck)
        if e is None:
            return
        live = [x for x in e if x[1] > now]
        if len(live) != len(e):
            t = self._writable(i)
            if live:
                t[ck] = live
            else:
                del t[ck]
            self._mark(i, ck)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        ser = self.meta.serializers["value"].serialize
        pack = _POS.pack
        if self._ttl is None:
            for pos, v in enumerate(obj):
                yield pack(pos), ser(v), None
        else:
            pos = 0
            for v, exp in obj:
                if now is None or exp > now:
                    yield pack(pos), ser(v), exp
                    pos += 1

    def _restore(self, t: dict[Any, Any], ck: Any, uk: Any, v: Any, expires_at: int) -> None:
        # Rows of one list arrive in position order.
        e = t.get(ck)
        if self._ttl is not None:
            v = (v, expires_at)
        if e is None:
            t[ck] = [v]
        else:
            e.append(v)


# --- map ---


class HeapMapState(_HeapState, MapState):
    kind = StateKind.MAP
    _FAST = (
        ("get", "_get_plain", "_get_ttl"),
        ("put", "_put_plain", "_put_ttl"),
        ("items", "_items_plain", "_items_ttl"),
        ("contains", "_contains_plain", "_contains_ttl"),
    )
    _TRACKED = {"_put_plain": "_put_plain_tracked", "_put_ttl": "_put_ttl_tracked"}

    def _copy_table(self, t: dict[Any, Any]) -> dict[Any, Any]:
        return {k: dict(v) for k, v in t.items()}

    def _get_plain(self, key: Any) -> Any:
        b = self._b
        try:
            m = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        return None if m is None else m.get(key)

    def _get_ttl(self, key: Any) -> Any:
        b = self._b
        try:
            m = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        if m is None:
            return None
        e = m.get(key)
        if e is None:
            return None
        if e[1] > b._pt_now:
            return e[0]
        return HeapMapState.get(self, key)

    def _put_plain(self, key: Any, value: Any) -> None:
        b = self._b
        i = b._kgi
        if i is None or (self._frozen and i in self._frozen):
            HeapMapState.put(self, key, value)
            return
        t = self._tables[i]
        m = t.get(b._key)
        if m is None:
            t[b._key] = {key: value}
        else:
            m[key] = value

    def _put_ttl(self, key: Any, value: Any) -> None:
        b = self._b
        i = b._kgi
        if i is None or (self._frozen and i in self._frozen):
            HeapMapState.put(self, key, value)
            return
        t = self._tables[i]
        m = t.get(b._key)
        if m is None:
            t[b._key] = {key: (value, b._pt_now + self._ttl_ms)}
        else:
            m[key] = (value, b._pt_now + self._ttl_ms)

    def _contains_plain(self, key: Any) -> bool:
        b = self._b
        try:
            m = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        return m is not None and key in m

    def _contains_ttl(self, key: Any) -> bool:
        return self._get_ttl(key) is not None

    def _put_plain_tracked(self, key: Any, value: Any) -> None:
        b = self._b
        i = b._kgi
        if i is None or (self._frozen and i in self._frozen):
            HeapMapState.put(self, key, value)
            return
        t = self._tables[i]
        m = t.get(b._key)
        if m is None:
            t[b._key] = {key: value}
        else:
            m[key] = value
        self._dirty_uk[i].add((b._key, key))  # type: ignore[index]  # bound only when tracking

    def _put_ttl_tracked(self, key: Any, value: Any) -> None:
        b = self._b
        i = b._kgi
        if i is None or (self._frozen and i in self._frozen):
            HeapMapState.put(self, key, value)
            return
        t = self._tables[i]
        m = t.get(b._key)
        if m is None:
            t[b._key] = {key: (value, b._pt_now + self._ttl_ms)}
        else:
            m[key] = (value, b._pt_now + self._ttl_ms)
        self._dirty_uk[i].add((b._key, key))  # type: ignore[index]  # bound only when tracking

    def _items_plain(self) -> list[tuple[Any, Any]]:
        b = self._b
        try:
            m = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        return [] if m is None else list(m.items())

    def _items_ttl(self) -> list[tuple[Any, Any]]:
        b = self._b
        try:
            m = self._tables[b._kgi].get(b._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        if m is None:
            return []
        vals = m.values()
        # All live (the common case): C-level passes instead of a comprehension's frame.
        if min(map(_SECOND, vals), default=INT64_MAX) > b._pt_now:
            return list(zip(m, map(_FIRST, vals), strict=True))
        return HeapMapState.items(self)

    def _map(self) -> tuple[int, Any, dict[Any, Any] | None]:
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        ck = b._key if self._void else (b._key, self._ns)
        return i, ck, self._tables[i].get(ck)

    def _entry(self, i: int, ck: Any, m: dict[Any, Any], uk: Any, now: int) -> Any:
        """TTL read of one entry: its value or None; cleans up or refreshes as configured."""
        e = m.get(uk)
        if e is None:
            return None
        if e[1] <= now:
            self._remove(i, ck, uk)
            return e[0] if self._ret_exp else None
        if self._upd_read:
            self._writable(i)[ck][uk] = (e[0], expiry(now, self._ttl_ms))
            self._mark_entry(i, ck, uk)
        return e[0]

    def _mark_entry(self, i: int, ck: Any, uk: Any) -> None:
        d = self._dirty_uk
        if d is not None:
            d[i].add((ck, uk))

    def _remove(self, i: int, ck: Any, uk: Any) -> None:
        t = self._writable(i)
        m = t[ck]
        del m[uk]
        if not m:
            del t[ck]
        self._mark_entry(i, ck, uk)

    def get(self, key: Any) -> Any:
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        ck = b._key if self._void else (b._key, self._ns)
        m = self._tables[i].get(ck)
        if m is None:
            out = None
        elif self._ttl is None:
            return m.get(key)
        else:
            e = m.get(key)
            if e is None:
                out = None
            elif e[1] > (b._pt_now if self._sampled else self._now()) and not self._upd_read:
                out = e[0]
            else:
                out = self._entry(i, ck, m, key, self._time())
        if self._inc:
            self._inc_step()
        return out

    def contains(self, key: Any) -> bool:
        i, ck, m = self._map()
        if m is None:
            return False
        if self._ttl is None:
            return key in m
        return self.get(key) is not None

    def put(self, key: Any, value: Any) -> None:
        b = self._b
        try:
            i = b._kgi + self._off  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise b.no_current_key(f"state {self.name!r}") from None
        t = self._tables[i]
        if self._frozen and i in self._frozen:
            t = self._writable(i)
        ck = b._key if self._void else (b._key, self._ns)
        m = t.get(ck)
        if self._ttl is not None:
            exp = (b._pt_now if self._sampled else self._now()) + self._ttl_ms
            value = (value, exp if exp <= INT64_MAX else INT64_MAX)
        if m is None:
            t[ck] = {key: value}
        else:
            m[key] = value
        if self._dirty_uk is not None:
            self._dirty_uk[i].add((ck, key))
        if self._inc:
            self._inc_step()

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if not isinstance(entries, Mapping):
            raise StateError(
                f"map state {self.name!r}: put_all takes a mapping, got {type(entries).__name__}"
            )
        if not entries:
            return
        i, ck, m = self._map()
        t = self._writable(i)
        m = t.get(ck)
        if self._ttl is None:
            new = dict(entries)
        else:
            exp = self._expiry()
            new = {k: (v, exp) for k, v in entries.items()}
        if m is None:
            t[ck] = new
        else:
            m.update(new)
        if self._dirty_uk is not None:
            self._dirty_uk[i].update((ck, k) for k in new)
        if self._inc:
            self._inc_step()

    def remove(self, key: Any) -> None:
        i, ck, m = self._map()
        if m is not None and key in m:
            self._remove(i, ck, key)
        if self._inc:
            self._inc_step()

    def _live_items(self) -> list[tuple[Any, Any]]:
        i, ck, m = self._map()
        if m is None:
            out: list[tuple[Any, Any]] = []
        elif self._ttl is None:
            return list(m.items())
        else:
            now = self._time()
            out = [(uk, e[0]) for uk, e in m.items() if e[1] > now]
            if len(out) != len(m) or self._upd_read:
                out = []
                for uk in list(m):
                    cur = self._tables[i].get(ck)
                    if cur is None:
                        break
                    v = self._entry(i, ck, cur, uk, now)
                    if v is not None:
                        out.append((uk, v))
        if self._inc:
            self._inc_step()
        return out

    def keys(self) -> list[Any]:
        return [k for k, _ in self._live_items()]

    def values(self) -> list[Any]:
        return [v for _, v in self._live_items()]

    def items(self) -> list[tuple[Any, Any]]:
        return self._live_items()

    def is_empty(self) -> bool:
        return not self._live_items()

    def _purge(self, i: int, ck: Any, now: int) -> None:
        m = self._tables[i].get(ck)
        if m is None:
            return
        dead = [uk for uk, e in m.items() if e[1] <= now]
        for uk in dead:
            self._remove(i, ck, uk)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        kser = self.meta.serializers["user_key"].serialize
        vser = self.meta.serializers["value"].serialize
        if self._ttl is None:
            for uk, v in obj.items():
                yield kser(uk), vser(v), None
        else:
            for uk, (v, exp) in obj.items():
                if now is None or exp > now:
                    yield kser(uk), vser(v), exp

    def _restore(self, t: dict[Any, Any], ck: Any, uk: Any, v: Any, expires_at: int) -> None:
        m = t.get(ck)
        if m is None:
            m = t[ck] = {}
        m[uk] = v if self._ttl is None else (v, expires_at)


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def _decoded(
    deserialize: Callable[[Any], Any], raw: Sequence[Any] | pa.Array | pa.ChunkedArray
) -> list[Any]:
    """``raw`` deserialized, each distinct value once when values repeat and decode to immutable
    objects (shared safely between entries); every row on its own otherwise."""
    if isinstance(raw, pa.ChunkedArray):
        raw = raw.combine_chunks()
    if isinstance(raw, pa.Array):
        if raw.null_count:
            raw = raw.to_pylist()  # the rows' own path below names what cannot be decoded
        else:
            return _decoded_arrow(deserialize, raw)
    distinct = set(raw)
    if len(distinct) * 2 > len(raw):
        return [deserialize(b) for b in raw]
    cache = {}
    for b in distinct:
        obj = deserialize(b)
        if type(obj) not in _IMMUTABLE:
            return [deserialize(b) for b in raw]  # mutable: one object per entry
        cache[b] = obj
    return [cache[b] for b in raw]


def _decoded_arrow(deserialize: Callable[[Any], Any], raw: pa.Array) -> list[Any]:
    """:func:`_decoded` of an Arrow column without nulls: Arrow finds the distinct values and
    each row's index in C, so no bytes object is made per row when values repeat."""
    enc = pc.dictionary_encode(raw)
    if len(enc.dictionary) * 2 <= len(raw):
        shared = np.empty(len(enc.dictionary), dtype=object)
        for i, b in enumerate(enc.dictionary.to_pylist()):
            obj = deserialize(b)
            if type(obj) not in _IMMUTABLE:
                break  # mutable: one object per entry
            shared[i] = obj
        else:
            decoded: list[Any] = shared[int_values(enc.indices)].tolist()
            return decoded
    return [deserialize(b) for b in raw.to_pylist()]


def _ints(values: Sequence[int] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column of ints (key groups) as NumPy."""
    arrow = isinstance(values, (pa.Array, pa.ChunkedArray))
    return int_values(values) if arrow else np.asarray(values)


def _all_empty(values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> bool:
    """Whether every value of a bytes column (namespaces) is empty."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return len(values) == 0 or pc.max(pc.binary_length(values)).as_py() == 0
    return not any(values)


#: One state's changes in one epoch: per slot the composite keys changed as a whole, and (map
#: states; None for others) the (composite key, user key) entries put or removed.
_Epoch = tuple[list[set[Any]], list[set[tuple[Any, Any]]] | None]


_KINDS: dict[StateKind, type[_HeapState]] = {
    StateKind.VALUE: HeapValueState,
    StateKind.LIST: HeapListState,
    StateKind.MAP: HeapMapState,
    StateKind.REDUCING: HeapReducingState,
    StateKind.AGGREGATING: HeapAggregatingState,
}


def _exporter(backend: HeapKeyedStateBackend, meta: StateMetaInfo) -> _HeapState:
    """Row encoding for a state that was restored but not claimed by a descriptor yet."""
    obj = object.__new__(_KINDS[meta.kind])
    _HeapState.__init__(obj, backend, meta)
    return obj


# --- view ---


class HeapStateView(KeyedStateView):
    """Slot references taken at ``snapshot_view``; later writes copy the slot before changing it.

    An incremental view also holds the change epochs not yet confirmed when it was taken (frozen
    sets of composite keys per slot); ``changed()`` reads their rows from the view's slots.
    """

    fork_safe = True

    def __init__(
        self,
        backend: HeapKeyedStateBackend,
        exporters: dict[str, _HeapState],
        tables: dict[str, list[dict[Any, Any]]],
        now: dict[str, int | None],
        view_id: int,
        epochs: list[tuple[int, dict[str, _Epoch]]] | None,
    ) -> None:
        self._backend: HeapKeyedStateBackend | None = backend
        self._exporters = exporters
        self._tables = tables
        self._now = now
        self._states = {name: e.meta for name, e in exporters.items()}
        self._range = backend.key_group_range
        self._key_ser = backend.key_serializer
        self.view_id = view_id
        self._epochs = epochs

    @property
    def states(self) -> Mapping[str, StateMetaInfo]:
        return self._states

    @property
    def incremental(self) -> bool:
        return self._epochs is not None

    def _check_live(self) -> None:
        if self._backend is None:
            raise StateError("this snapshot view was released: take a new snapshot_view()")

    def iter_entries(self, key_groups: KeyGroupRange | None = None) -> Iterator[StateEntry]:
        self._check_live()
        kgs = self._range if key_groups is None else self._range.intersection(key_groups)
        if kgs.is_empty:
            return
        start, n = self._range.start, len(self._range)
        names = sorted(self._exporters)
        kser = self._key_ser.serialize
        for kg in kgs:
            kgi = kg - start
            keys: dict[Any, tuple[int, bytes]] = {}
            for name in names:
                exp = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                nser = exp._ns_ser.serialize
                if exp.kind is StateKind.VALUE:
                    yield from self._value_entries(exp, slots, kg, kgi, n, now, keys)
                    continue
                for ns_slot in (kgi, n + kgi):
                    for ck, obj in slots[ns_slot].items():
                        if ns_slot == kgi:
                            key, nsb = ck, b""
                        else:
                            key, nsb = ck[0], nser(ck[1])
                        kinfo = keys.get(key)
                        try:
                            if kinfo is None:
                                kinfo = keys[key] = (key_hash(key), kser(key))
                            for uk, vb, ea in exp._rows(obj, now):
                                yield StateEntry(kg, kinfo[0], kinfo[1], nsb, name, uk, vb, ea)
                        except SerializationError as e:
                            raise SerializationError(f"state {name!r}, key {key!r:.60}: {e}") from e

    def entry_columns(self, batch_rows: int) -> Iterator[dict[str, list[Any]]]:
        """:meth:`iter_entries`' rows (same order) as columns, with no row object per map
        entry: a map without TTL adds all its entries with two serializer maps."""
        self._check_live()
        start, n = self._range.start, len(self._range)
        names = sorted(self._exporters)
        kser = self._key_ser.serialize
        cols: dict[str, list[Any]] = {f: [] for f in StateEntry._fields}
        kgs, khs, kbs, nss, sts, uks, vbs, eas = cols.values()
        for kgi in range(n):
            kg = start + kgi
            keys: dict[Any, tuple[int, bytes]] = {}
            for name in names:
                exp = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                if exp.kind is StateKind.VALUE:
                    for row in self._value_entries(exp, slots, kg, kgi, n, now, keys):
                        for col, v in zip(cols.values(), row, strict=True):
                            col.append(v)
                    continue
                nser = exp._ns_ser.serialize
                whole_map = exp.kind is StateKind.MAP and exp._ttl is None
                if whole_map:
                    ukser = exp.meta.serializers["user_key"].serialize
                    vser = exp.meta.serializers["value"].serialize
                for ns_slot in (kgi, n + kgi):
                    for ck, obj in slots[ns_slot].items():
                        if ns_slot == kgi:
                            key, nsb = ck, b""
                        else:
                            key, nsb = ck[0], nser(ck[1])
                        try:
                            kinfo = keys.get(key)
                            if kinfo is None:
                                kinfo = keys[key] = (key_hash(key), kser(key))
                            if whole_map:
                                count = len(obj)
                                uks.extend(map(ukser, obj))
                                vbs.extend(map(vser, obj.values()))
                                eas.extend(itertools.repeat(None, count))
                            else:
                                count = 0
                                for uk, vb, ea in exp._rows(obj, now):
                                    uks.append(uk)
                                    vbs.append(vb)
                                    eas.append(ea)
                                    count += 1
                        except SerializationError as e:
                            raise SerializationError(f"state {name!r}, key {key!r:.60}: {e}") from e
                        kgs.extend(itertools.repeat(kg, count))
                        khs.extend(itertools.repeat(kinfo[0], count))
                        kbs.extend(itertools.repeat(kinfo[1], count))
                        nss.extend(itertools.repeat(nsb, count))
                        sts.extend(itertools.repeat(name, count))
            if len(kgs) >= batch_rows:
                yield cols
                cols = {f: [] for f in StateEntry._fields}
                kgs, khs, kbs, nss, sts, uks, vbs, eas = cols.values()
        if kgs:
            yield cols

    def _value_entries(
        self,
        exp: _HeapState,
        slots: list[dict[Any, Any]],
        kg: int,
        kgi: int,
        n: int,
        now: int | None,
        keys: dict[Any, tuple[int, bytes]],
    ) -> Iterator[StateEntry]:
        """The rows of a value state in key group ``kg``, reusing the previous full view's row of
        every entry whose stored object is still the same one.

        Reused only where identity implies an unchanged row: with TTL every write stores a fresh
        ``(value, expires_at)`` tuple; without, only immutable values are reused. The cache holds
        the objects, so their ids are not recycled while cached. The cache of a slot is replaced
        once the slot was read completely (entries deleted since drop out).
        """
        cache = exp._row_cache
        if cache is None or len(cache) != 2 * n:
            cache = exp._row_cache = [{} for _ in range(2 * n)]
        ttl = exp._ttl is not None
        name = exp.name
        kser = self._key_ser.serialize
        nser = exp._ns_ser.serialize
        for ns_slot in (kgi, n + kgi):
            old = cache[ns_slot]
            new: dict[Any, tuple[Any, StateEntry]] = {}
            for ck, obj in slots[ns_slot].items():
                c = old.get(ck)
                if c is not None and c[0] is obj:
                    row = c[1]
                else:
                    if ns_slot == kgi:
                        key, nsb = ck, b""
                    else:
                        key, nsb = ck[0], nser(ck[1])
                    kinfo = keys.get(key)
                    try:
                        if kinfo is None:
                            kinfo = keys[key] = (key_hash(key), kser(key))
                        (uk, vb, ea), *_ = exp._rows(obj, None)
                    except SerializationError as e:
                        raise SerializationError(f"state {name!r}, key {key!r:.60}: {e}") from e
                    row = StateEntry(kg, kinfo[0], kinfo[1], nsb, name, uk, vb, ea)
                if ttl:
                    new[ck] = (obj, row)
                    if now is not None and obj[1] <= now:
                        continue
                elif type(obj) in _IMMUTABLE:
                    new[ck] = (obj, row)
                yield row
            cache[ns_slot] = new

    def _changes_in(self, name: str, slot: int) -> tuple[set[Any], set[tuple[Any, Any]]]:
        """The union over the view's epochs of state ``name``'s changes in ``slot``: the composite
        keys changed as a whole, and the (composite key, user key) map entries changed alone."""
        assert self._epochs is not None
        whole: set[Any] = set()
        entries: set[tuple[Any, Any]] = set()
        for _, ep in self._epochs:
            d = ep.get(name)
            if d is None:
                continue
            if d[0][slot]:
                whole |= d[0][slot]
            if d[1] is not None and d[1][slot]:
                entries |= d[1][slot]
        return whole, entries

    def changed(self) -> Iterator[ChangedKey]:
        """Every (state, key, namespace) changed since the last confirmed view, key-group order,
        with its complete rows (a map entry changed on its own counts as its whole key here).

        Within a key group the order is (state, key bytes, namespace bytes).
        """
        self._check_live()
        if self._epochs is None:
            raise StateError(
                "changed() needs an incremental view: take snapshot_view(incremental=True) on a "
                "backend created with track_changes=True"
            )
        start, n = self._range.start, len(self._range)
        names = sorted({name for _, ep in self._epochs for name in ep})
        kser = self._key_ser.serialize
        for kgi in range(n):
            kg = start + kgi
            keys: dict[Any, tuple[int, bytes]] = {}
            out: list[ChangedKey] = []
            for name in names:
                exp = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                nser = exp._ns_ser.serialize
                for slot in (kgi, n + kgi):
                    whole, entries = self._changes_in(name, slot)
                    for ck in whole | {ck for ck, _ in entries}:
                        if slot == kgi:
                            key, nsb = ck, b""
                        else:
                            key, nsb = ck[0], nser(ck[1])
                        kinfo = keys.get(key)
                        try:
                            if kinfo is None:
                                kinfo = keys[key] = (key_hash(key), kser(key))
                            obj = slots[slot].get(ck)
                            rows = (
                                []
                                if obj is None
                                else [
                                    StateEntry(kg, kinfo[0], kinfo[1], nsb, name, uk, vb, ea)
                                    for uk, vb, ea in exp._rows(obj, now)
                                ]
                            )
                        except SerializationError as e:
                            raise SerializationError(f"state {name!r}, key {key!r:.60}: {e}") from e
                        out.append(ChangedKey(name, kg, kinfo[0], kinfo[1], nsb, rows))
            out.sort(key=lambda c: (c.state, c.key, c.namespace))
            yield from out

    def delta_columns(self, batch_rows: int) -> Iterator[dict[str, list[Any]]]:
        """:meth:`changed` as the columns of delta rows (``snapshot.delta``'s schema without
        ``seq``), about ``batch_rows`` rows a chunk, built in one pass with no object per
        change: per whole change a CLEAR then its rows as PUTs (a value state's value: just its
        PUT, which replaces the one row it has); per map entry changed on its own a PUT, or a
        DELETE if it is gone. Key-group order; within a key group, per state, whole
        changes then entries (in no particular order: each identity occurs once).
        """
        from state_engine.snapshot.delta import CLEAR, DELETE, PUT

        self._check_live()
        if self._epochs is None:
            raise StateError(
                "delta_columns() needs an incremental view: take snapshot_view(incremental=True) "
                "on a backend created with track_changes=True"
            )
        names = ("key_group", "key_hash", "key", "namespace", "state", "user_key", "value")
        cols: dict[str, list[Any]] = {n: [] for n in (*names, "expires_at", "op")}
        kg_c, kh_c, key_c, ns_c, st_c, uk_c, v_c = (cols[n] for n in names)
        ea_c, op_c = cols["expires_at"], cols["op"]
        start, n = self._range.start, len(self._range)
        state_names = sorted({name for _, ep in self._epochs for name in ep})
        kser = self._key_ser.serialize
        for kgi in range(n):
            kg = start + kgi
            keys: dict[Any, tuple[int, bytes]] = {}
            for name in state_names:
                exp = self._exporters[name]
                table_of = self._tables[name]
                now = self._now[name]
                nser = exp._ns_ser.serialize
                sers = exp.meta.serializers
                vser = sers["value"].serialize
                user = sers["user_key"].serialize if "user_key" in sers else None
                ttl = exp._ttl is not None
                value_kind = exp.kind is StateKind.VALUE
                for slot in (kgi, n + kgi):
                    whole, entries = self._changes_in(name, slot)
                    if not whole and not entries:
                        continue
                    table = table_of[slot]
                    void = slot == kgi
                    try:
                        for ck in whole:
                            key, nsb = (ck, b"") if void else (ck[0], nser(ck[1]))
                            kinfo = keys.get(key)
                            if kinfo is None:
                                kinfo = keys[key] = (key_hash(key), kser(key))
                            obj = table.get(ck)
                            if value_kind and obj is not None:
                                # one row, whose identity has no user key: a PUT replaces it
                                # (no CLEAR needed), unless it expired (then CLEAR it below)
                                if not ttl or now is None or obj[1] > now:
                                    kg_c.append(kg)
                                    kh_c.append(kinfo[0])
                                    key_c.append(kinfo[1])
                                    ns_c.append(nsb)
                                    st_c.append(name)
                                    uk_c.append(None)
                                    v_c.append(vser(obj[0]) if ttl else vser(obj))
                                    ea_c.append(obj[1] if ttl else None)
                                    op_c.append(PUT)
                                    continue
                                obj = None
                            rows = [] if obj is None else list(exp._rows(obj, now))
                            m = len(rows) + 1
                            kg_c += repeat(kg, m)
                            kh_c += repeat(kinfo[0], m)
                            key_c += repeat(kinfo[1], m)
                            ns_c += repeat(nsb, m)
                            st_c += repeat(name, m)
                            uk_c.append(None)
                            v_c.append(b"")
                            ea_c.append(None)
                            op_c.append(CLEAR)
                            for uk, vb, ea in rows:
                                uk_c.append(uk)
                                v_c.append(vb)
                                ea_c.append(ea)
                            op_c += repeat(PUT, len(rows))
                        for ck, uk in entries:
                            if ck in whole:
                                continue  # rewritten as a whole above
                            assert user is not None  # only map states mark entries
                            key, nsb = (ck, b"") if void else (ck[0], nser(ck[1]))
                            kinfo = keys.get(key)
                            if kinfo is None:
                                kinfo = keys[key] = (key_hash(key), kser(key))
                            obj = table.get(ck)
                            e = _MISSING if obj is None else obj.get(uk, _MISSING)
                            kg_c.append(kg)
                            kh_c.append(kinfo[0])
                            key_c.append(kinfo[1])
                            ns_c.append(nsb)
                            st_c.append(name)
                            uk_c.append(user(uk))
                            if e is not _MISSING and (not ttl or now is None or e[1] > now):
                                v_c.append(vser(e[0]) if ttl else vser(e))
                                ea_c.append(e[1] if ttl else None)
                                op_c.append(PUT)
                            else:
                                v_c.append(b"")
                                ea_c.append(None)
                                op_c.append(DELETE)
                    except SerializationError as e:
                        raise SerializationError(f"state {name!r} (key group {kg}): {e}") from e
            if len(op_c) >= batch_rows:
                yield cols
                cols = {k: [] for k in cols}
                kg_c, kh_c, key_c, ns_c, st_c, uk_c, v_c = (cols[n] for n in names)
                ea_c, op_c = cols["expires_at"], cols["op"]
        if op_c:
            yield cols

    def release(self) -> None:
        if self._backend is not None:
            self._backend._release_view()
            self._backend = None
            self._tables = {}
            self._epochs = None if self._epochs is None else []


# --- backend ---


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state as Python objects in per-key-group dicts (Flink's HashMapStateBackend).

    ``track_changes=True`` records, per slot, which (key, namespace) of which state was written
    since the last view (one set add per write), for incremental (delta) snapshots:

    - every ``snapshot_view`` closes the current change epoch under its ``view_id``;
    - ``snapshot_view(incremental=True).changed()`` lists the union of all epochs not yet dropped
      (so the changes of a view whose snapshot failed or was cancelled are carried forward);
    - ``confirm_view(view_id)`` drops every epoch up to that view (a full view's confirmation
      starts a new base the same way).

    Restored rows count as changes: a delta is then correct whatever base it is folded onto.
    """

    def __init__(
        self,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
        *,
        track_changes: bool = False,
        ttl_time_per_record: bool | None = None,
    ) -> None:
        super().__init__(
            key_serializer,
            max_parallelism,
            key_group_range,
            clock,
            ttl_time_per_record=ttl_time_per_record,
        )
        self._tables_of: dict[str, list[dict[Any, Any]]] = {}
        self._frozen_of: dict[str, set[int]] = {}
        self._exporters: dict[str, _HeapState] = {}
        self._live_views = 0
        self.track_changes = bool(track_changes)
        self._dirty_of: dict[str, list[set[Any]]] = {}
        self._dirty_uk_of: dict[str, list[set[tuple[Any, Any]]]] = {}
        self._epochs: list[tuple[int, dict[str, _Epoch]]] = []
        self._last_view_id = 0
        self._confirmed_view_id = 0
        self._delta: DeltaSnapshotStrategy | None = None

    def _new_slots(self, name: str, kind: StateKind) -> None:
        if name not in self._tables_of:
            self._tables_of[name] = [{} for _ in range(2 * self._kg_count)]
            self._frozen_of[name] = set()
            if self.track_changes:
                self._dirty_of[name] = [set() for _ in range(2 * self._kg_count)]
                if kind is StateKind.MAP:
                    self._dirty_uk_of[name] = [set() for _ in range(2 * self._kg_count)]

    def _create_state(
        self, descriptor: StateDescriptor, meta: StateMetaInfo, migrate_from: StateMetaInfo | None
    ) -> State:
        # Objects are stored deserialized: a compatible serializer change needs no rewrite here.
        kind = meta.kind
        self._new_slots(meta.name, kind)
        st: _HeapState
        if kind is StateKind.VALUE:
            st = HeapValueState(self, meta, descriptor.default)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        elif kind is StateKind.REDUCING:
            st = HeapReducingState(self, meta, descriptor.reduce_fn)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        elif kind is StateKind.AGGREGATING:
            st = HeapAggregatingState(self, meta, descriptor.aggregate_function)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        else:
            st = _KINDS[kind](self, meta)
        self._exporters[meta.name] = st
        return st

    def _register_restored(self, meta: StateMetaInfo) -> None:
        self._new_slots(meta.name, meta.kind)
        self._exporters[meta.name] = _exporter(self, meta)

    def keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        slots = self._slots_of(state_name)
        n = self._kg_count
        if namespace is VOID_NAMESPACE:
            for t in slots[:n]:
                yield from list(t)
        else:
            for t in slots[n:]:
                for k, ns in list(t):
                    if ns == namespace:
                        yield k

    def _slots_of(self, state_name: str) -> list[dict[Any, Any]]:
        slots = self._tables_of.get(state_name)
        if slots is None:
            raise StateError(
                f"no state named {state_name!r} in this backend (known: "
                f"{', '.join(sorted(self._tables_of)) or 'none'}): register it with get_state first"
            )
        return slots

    def snapshot_view(self, incremental: bool = False, since: int = 0) -> HeapStateView:
        self._check_open()
        if incremental and not self.track_changes:
            raise StateError(
                "an incremental snapshot view needs change tracking: create the backend with "
                "HeapKeyedStateBackend(..., track_changes=True), or take a full view"
            )
        tables: dict[str, list[dict[Any, Any]]] = {}
        now: dict[str, int | None] = {}
        for name, slots in self._tables_of.items():
            # An empty slot is not frozen (a first write must not pay for a copy), so the view
            # gets its own empty dict: the backend's may fill up after the view was taken.
            tables[name] = [t if t else {} for t in slots]
            frozen = self._frozen_of[name]
            frozen.update(i for i, t in enumerate(slots) if t)
            meta = self._metas[name]
            cleanup = meta.ttl is not None and meta.ttl.cleanup.full_snapshot
            now[name] = self.time_source(meta)() if cleanup else None
        self._last_view_id += 1
        view_id = self._last_view_id
        epochs = None
        if self.track_changes:
            self._close_epoch(view_id)
            if incremental:  # the changes after view ``since`` not confirmed yet
                epochs = [e for e in self._epochs if e[0] > since]
        self._live_views += 1
        return HeapStateView(self, dict(self._exporters), tables, now, view_id, epochs)

    def _close_epoch(self, view_id: int) -> None:
        """Freeze the changes made since the previous view under ``view_id``; start new sets."""
        epoch: dict[str, _Epoch] = {}
        for name, dirty in self._dirty_of.items():
            entries = self._dirty_uk_of.get(name)
            if any(dirty) or (entries is not None and any(entries)):
                epoch[name] = (list(dirty), None if entries is None else list(entries))
                for i, s in enumerate(dirty):
                    if s:
                        dirty[i] = set()
                for i, e in enumerate(entries or ()):
                    if e:
                        entries[i] = set()  # type: ignore[index]  # not None: enumerated
        self._epochs.append((view_id, epoch))

    def snapshot_strategy(self, format: SnapshotFormat) -> SnapshotStrategy | None:
        """``DELTA``: this backend's delta strategy (it keeps the backend's chain of base and
        deltas; it needs change tracking); any other format is written canonically."""
        from state_engine.backends.heap.snapshot import DeltaSnapshotStrategy

        if format != DeltaSnapshotStrategy.format:
            return None
        if not self.track_changes:
            # Every "delta" would be a full base recorded as DELTA: a silent full checkpoint.
            raise InvalidSnapshotRequest(
                "delta checkpoints need change tracking, but this heap backend has none: create "
                "it with HeapBackendFactory(track_changes=True) (the JobRunner does so for "
                "checkpoint_format='delta'), or use format 'canonical'"
            )
        if self._delta is None:
            self._delta = DeltaSnapshotStrategy(self)
        return self._delta

    def confirm_view(self, view_id: int) -> None:
        """The snapshot built from view ``view_id`` completed: forget the changes up to it."""
        if isinstance(view_id, bool) or not isinstance(view_id, int) or view_id < 1:
            raise StateError(f"confirm_view needs a view_id >= 1 (view.view_id), got {view_id!r}")
        if view_id > self._last_view_id:
            raise StateError(
                f"confirm_view({view_id}): no such view, the last view taken is "
                f"{self._last_view_id}; pass the view_id of a view this backend returned"
            )
        if view_id > self._confirmed_view_id:
            self._confirmed_view_id = view_id
            self._epochs = [e for e in self._epochs if e[0] > view_id]

    def forget_changes(self) -> None:
        """Drop every change recorded so far, as if a snapshot of the state had been confirmed
        (a restore in CLAIM mode continues the restored snapshot's delta chain)."""
        self._close_epoch(self._last_view_id)  # the changes since the last view, as an epoch
        self._epochs.clear()  # dropped with every earlier one

    @property
    def confirmed_view_id(self) -> int:
        """The newest confirmed view (0: none yet)."""
        return self._confirmed_view_id

    def _release_view(self) -> None:
        self._live_views -= 1
        if self._live_views == 0:
            for frozen in self._frozen_of.values():
                frozen.clear()

    def restore_entries(
        self,
        entries: Iterable[StateEntry],
        state_meta: Mapping[str, StateMetaInfo | Mapping[str, Any]],
    ) -> None:
        plan = self._prepare_restore(state_meta)
        kser = self.key_serializer.deserialize
        n = self._kg_count
        decoders: dict[str, tuple[Any, Any, Any, _HeapState, list[set[Any]] | None]] = {}
        for name, (written, _current) in plan.items():
            s = written.serializers
            decoders[name] = (
                s["namespace"].deserialize,
                s["value"].deserialize,
                s["user_key"].deserialize if "user_key" in s else None,
                self._exporters[name],
                self._dirty_of.get(name),
            )
        for row in entries:
            kgi = self._check_row_key_group(row.key_group)
            dec = decoders.get(row.state)
            if dec is None:
                raise self._unknown_state_row(row.state)
            nsd, vd, ukd, exporter, dirty = dec
            key = kser(row.key)
            if row.namespace:
                slot, ck = n + kgi, (key, nsd(row.namespace))
            else:
                slot, ck = kgi, key
            t = self._writable_slot(row.state, slot)
            uk = ukd(row.user_key) if ukd is not None else None
            exp = INT64_MAX if row.expires_at is None else row.expires_at
            exporter._restore(t, ck, uk, vd(row.value), exp)
            if dirty is not None:
                dirty[slot].add(ck)

    def restore_columns(
        self,
        columns: Iterable[StateColumns],
        state_meta: Mapping[str, StateMetaInfo | Mapping[str, Any]],
    ) -> None:
        """:meth:`restore_entries` from columns: each distinct serialized key, user key and
        value is decoded once when it decodes to an immutable object (a str, an int...; from
        Arrow columns, the distinct values are found by Arrow), and the rows of one slot go into
        its table without a lookup per row."""
        plan = self._prepare_restore(state_meta)
        n = self._kg_count
        for c in columns:
            if c.state not in plan:
                raise self._unknown_state_row(c.state)
            if not c.rows:
                continue
            key_groups = _ints(c.key_group)
            self._check_row_key_group(int(key_groups.min()))
            self._check_row_key_group(int(key_groups.max()))
            name = c.state
            ser = plan[name][0].serializers
            nsd = ser["namespace"].deserialize
            keys = _decoded(self.key_serializer.deserialize, c.key)
            user_keys: Iterable[Any] = (
                _decoded(ser["user_key"].deserialize, c.user_key)
                if "user_key" in ser
                else itertools.repeat(None)
            )
            values = _decoded(ser["value"].deserialize, c.value)
            meta = plan[name][0]
            if meta.ttl is None and meta.kind is not StateKind.LIST and _all_empty(c.namespace):
                self._restore_runs(
                    name, meta.kind is StateKind.MAP, key_groups, keys, user_keys, values
                )
                continue
            expiries = [INT64_MAX if e is None else e for e in c.column("expires_at")]
            restore = self._exporters[name]._restore
            dirty = self._dirty_of.get(name)
            start = self._kg_start
            last_slot: int = -1
            t: dict[Any, Any] = {}
            changed: set[Any] | None = None
            namespaces = c.column("namespace")
            for kg, key, ns, uk, v, exp in zip(
                key_groups.tolist(), keys, namespaces, user_keys, values, expiries, strict=False
            ):
                if ns:
                    slot, ck = n + kg - start, (key, nsd(ns))
                else:
                    slot, ck = kg - start, key
                if slot != last_slot:
                    last_slot, t = slot, self._writable_slot(name, slot)
                    changed = dirty[slot] if dirty is not None else None
                restore(t, ck, uk, v, exp)
                if changed is not None:
                    changed.add(ck)

    def _restore_runs(
        self,
        name: str,
        is_map: bool,
        key_groups: np.ndarray,
        keys: list[Any],
        user_keys: Iterable[Any],
        values: list[Any],
    ) -> None:
        """Restored rows of a state without TTL or namespaces, a key-group run at a time: a
        value-like state's run is one dict update; a map's rows go in one dict update per run
        of rows of the same key (runs found by comparing neighbours in C)."""
        cuts = [0, *(np.flatnonzero(np.diff(key_groups)) + 1).tolist(), len(key_groups)]
        dirty = self._dirty_of.get(name)
        start = self._kg_start
        uks = list(user_keys) if is_map else []
        for a, b in itertools.pairwise(cuts):
            slot = int(key_groups[a]) - start
            t = self._writable_slot(name, slot)
            run = keys[a:b]
            if is_map:
                same = np.fromiter(map(operator.eq, run[1:], run[:-1]), np.bool_, len(run) - 1)
                bounds = [0, *(np.flatnonzero(~same) + 1).tolist(), len(run)]
                run_uks, run_values = uks[a:b], values[a:b]
                for x, y in itertools.pairwise(bounds):
                    entries = zip(run_uks[x:y], run_values[x:y], strict=True)
                    m = t.get(run[x])
                    if m is None:
                        t[run[x]] = dict(entries)
                    else:
                        m.update(entries)
            else:
                t.update(zip(run, values[a:b], strict=True))
            if dirty is not None:
                dirty[slot].update(run)

    def _writable_slot(self, name: str, slot: int) -> dict[Any, Any]:
        frozen = self._frozen_of[name]
        if frozen and slot in frozen:
            return self._exporters[name]._writable(slot)
        return self._tables_of[name][slot]

    def close(self) -> None:
        self._tables_of.clear()
        self._dirty_of.clear()
        self._dirty_uk_of.clear()
        self._epochs.clear()
        super().close()
