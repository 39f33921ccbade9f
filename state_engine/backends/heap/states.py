"""The heap backend's state classes: deserialized objects in plain dicts, one dict per key group.

Layout: per state a list of ``2 * n`` dicts (its slots) for the ``n`` owned key groups; slot ``i``
holds the void-namespace values of key group ``start + i`` keyed by key, slot ``n + i`` the values
of other namespaces keyed by ``(key, namespace)``. Cutting out a key-group range touches only its
slots. With TTL a stored value is a ``(value, expires_at)`` tuple (per element for lists, per entry
for maps).

Copy-on-write per slot: a view (``view.py``) keeps references to the slots and marks them frozen;
the first write to a frozen slot copies it (and the lists, maps and accumulators in it, which are
mutated in place), so the view never sees a later write. A value state's values are handed out by
reference, so its first read of a frozen slot copies the slot too, with every mutable value in it
(Flink's copy-on-read of state shared with a running snapshot): a value read, changed in place and
written back while a snapshot is being written from the view does not leak into it.
"""

from __future__ import annotations

import copy
import operator
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from state_engine.backends.base import KeyedStateBackend, list_elements, null_element
from state_engine.errors import StateError
from state_engine.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from state_engine.state.descriptors import StateKind
from state_engine.state.meta import StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE
from state_engine.state.ttl import INT64_MAX, expiry

#: Types whose values no caller can change in place, so a value's identity implies its content:
#: a value state's copy-on-read shares them, a view reuses its cached row of one (no TTL) and a
#: restore decodes a repeated one once. (deepcopy returns other immutables, e.g. complex, as is.)
IMMUTABLE_TYPES = frozenset({int, float, str, bytes, bool, type(None)})
_POSITION = struct.Struct(">I")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
# An expiry below this bound cannot pass INT64_MAX when added to a wall-clock time in ms, so the
# fast TTL write paths skip the clamp.
_NO_CLAMP_TTL = INT64_MAX - (1 << 62)


class StateSlots(NamedTuple):
    """One state's storage in a heap backend: its slots, the slots a live view froze, and (with
    change tracking; None without) per slot the composite keys written since the last view and,
    for map states, the (composite key, user key) entries put or removed on their own (a delta
    then writes just those entries, not the key's whole map)."""

    tables: list[dict[Any, Any]]
    frozen: set[int]
    dirty: list[set[Any]] | None
    dirty_entries: list[set[tuple[Any, Any]]] | None


class HeapState(State):
    """Shared plumbing: slot lookup, copy-on-write, TTL time, change marks, incremental cleanup."""

    kind: StateKind

    def __init__(self, backend: KeyedStateBackend, meta: StateMetaInfo, slots: StateSlots) -> None:
        self.name = meta.name
        self.meta = meta
        self._backend = backend
        self._tables = slots.tables
        self._frozen = slots.frozen
        self._dirty = slots.dirty
        self._dirty_entries = slots.dirty_entries
        self._key_group_count = backend._kg_count
        self._void = True
        self._namespace: Any = VOID_NAMESPACE
        self._offset = 0
        self._namespace_serializer = meta.serializers["namespace"]
        ttl = meta.ttl
        self._ttl = ttl
        self._ttl_ms = ttl.ttl_ms if ttl else 0
        self._update_on_read = bool(ttl and ttl.update_on_read)
        self._return_expired = bool(ttl and ttl.return_expired)
        self._sampled: bool
        self._now: Callable[[], int]
        self._sampled, self._now = backend.state_time(meta)
        self._cleanup_size = ttl.cleanup.incremental_size if ttl else 0
        self._cleanup_slot = -1
        self._cleanup_keys: list[Any] = []
        self._cleanup_position = 0
        # Per slot, the rows of the last full view (value states), see HeapStateView.
        self._row_cache: list[dict[Any, tuple[Any, StateEntry]]] | None = None
        if ttl and ttl.cleanup.incremental_every_record:
            backend._record_cleanups.append(self._cleanup_step)
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
            ok = ok and self._sampled and not self._update_on_read and not self._cleanup_size
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
            self._namespace_serializer.serialize(namespace)  # fail now, not at the next snapshot
        self._namespace = namespace
        # the fast methods depend only on whether it is void: a window job that switches
        # namespaces every record does not rebind them every time
        if void is not self._void:
            self._void, self._offset = void, 0 if void else self._key_group_count
            self._install_fast()

    def _slot(self) -> int:
        index = self._backend._key_group_index
        if index is None:
            raise self._backend.no_current_key(f"state {self.name!r}")
        return index + self._offset

    def _composite_key(self) -> Any:
        return self._backend._key if self._void else (self._backend._key, self._namespace)

    def _writable(self, slot: int) -> dict[Any, Any]:
        table = self._tables[slot]
        if self._frozen and slot in self._frozen:
            table = self._copy_table(table)
            self._tables[slot] = table
            self._frozen.discard(slot)
        return table

    def _copy_table(self, table: dict[Any, Any]) -> dict[Any, Any]:
        return dict(table)

    def _mark(self, slot: int, composite: Any) -> None:
        dirty = self._dirty
        if dirty is not None:
            dirty[slot].add(composite)

    def clear(self) -> None:
        slot = self._slot()
        composite = self._composite_key()
        if composite in self._tables[slot]:
            del self._writable(slot)[composite]
            self._mark(slot, composite)
        if self._cleanup_size:
            self._cleanup_step()

    # --- TTL ---

    def _time(self) -> int:
        return self._backend._pt_now if self._sampled else self._now()

    def _expiry(self) -> int:
        expires_at = (self._backend._pt_now if self._sampled else self._now()) + self._ttl_ms
        return expires_at if expires_at <= INT64_MAX else INT64_MAX

    def _purge(self, slot: int, composite: Any, now: int) -> None:
        """Drop what expired under ``composite`` in ``slot`` (value kinds: the whole entry)."""
        stored = self._tables[slot].get(composite)
        if stored is not None and stored[1] <= now:
            del self._writable(slot)[composite]
            self._mark(slot, composite)

    def _cleanup_step(self) -> None:
        """Check up to ``incremental_size`` entries, continuing where the last step stopped."""
        budget = self._cleanup_size
        now = self._time()
        tables = self._tables
        visited = 0
        while budget > 0:
            if self._cleanup_position >= len(self._cleanup_keys):
                if visited > len(tables):
                    return  # the whole state is empty
                visited += 1
                self._cleanup_slot = (self._cleanup_slot + 1) % len(tables)
                self._cleanup_keys = list(tables[self._cleanup_slot])
                self._cleanup_position = 0
                continue
            composite = self._cleanup_keys[self._cleanup_position]
            self._cleanup_position += 1
            budget -= 1
            self._purge(self._cleanup_slot, composite, now)

    # --- export ---

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        raise NotImplementedError

    def _restore(
        self, table: dict[Any, Any], composite: Any, user_key: Any, value: Any, expires_at: int
    ) -> None:
        """Add one restored row's value (``user_key``: decoded) into ``table``."""
        table[composite] = value if self._ttl is None else (value, expires_at)


# --- value-like kinds ---


class HeapValueState(HeapState, ValueState):
    kind = StateKind.VALUE

    _FAST = (("value", "_value_plain", "_value_ttl"), ("update", "_update_plain", "_update_ttl"))
    _TRACKED = {"_update_plain": "_update_plain_tracked", "_update_ttl": "_update_ttl_tracked"}

    def __init__(
        self, backend: KeyedStateBackend, meta: StateMetaInfo, slots: StateSlots, default: Any
    ) -> None:
        super().__init__(backend, meta, slots)
        self._default = default

    def _copy_table(self, table: dict[Any, Any]) -> dict[Any, Any]:
        # values shared with a view: the mutable ones are copied (immutable ones and tuples of
        # them come back as they are from deepcopy's own shortcuts)
        if self._ttl is None:
            return {
                k: value if type(value) in IMMUTABLE_TYPES else copy.deepcopy(value)
                for k, value in table.items()
            }
        return {
            k: stored
            if type(stored[0]) in IMMUTABLE_TYPES
            else (copy.deepcopy(stored[0]), stored[1])
            for k, stored in table.items()
        }

    def _value_plain(self) -> Any:
        backend = self._backend
        slot = backend._key_group_index
        if self._frozen and slot in self._frozen:
            return HeapValueState.value(self)  # copies the slot first (see _copy_table)
        try:
            return self._tables[slot].get(backend._key, self._default)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None

    def _value_ttl(self) -> Any:
        backend = self._backend
        slot = backend._key_group_index
        if self._frozen and slot in self._frozen:
            return HeapValueState.value(self)
        try:
            stored = self._tables[slot].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        if stored is None:
            return self._default
        if stored[1] > backend._pt_now:
            return stored[0]
        return HeapValueState.value(self)

    def _update_plain(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[slot][backend._key] = value

    def _update_ttl(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[slot][backend._key] = (value, backend._pt_now + self._ttl_ms)

    def _update_plain_tracked(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[slot][backend._key] = value
        self._dirty[slot].add(backend._key)  # type: ignore[index]  # bound only when tracking

    def _update_ttl_tracked(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapValueState.update(self, value)
            return
        self._tables[slot][backend._key] = (value, backend._pt_now + self._ttl_ms)
        self._dirty[slot].add(backend._key)  # type: ignore[index]  # bound only when tracking

    def value(self) -> Any:
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        table = self._tables[slot]
        if self._frozen and slot in self._frozen:
            table = self._writable(slot)  # the caller may change what it reads in place
        stored = table.get(backend._key if self._void else (backend._key, self._namespace))
        if self._ttl is None:
            return self._default if stored is None else stored
        if stored is not None:
            if (
                stored[1] <= (backend._pt_now if self._sampled else self._now())
                or self._update_on_read
            ):
                stored = self._ttl_read(stored)
            else:
                stored = stored[0]
        if self._cleanup_size:
            self._cleanup_step()
        return self._default if stored is None else stored

    def _ttl_read(self, stored: tuple[Any, int]) -> Any:
        now = self._time()
        slot, composite = self._slot(), self._composite_key()
        if stored[1] <= now:
            del self._writable(slot)[composite]
            self._mark(slot, composite)
            return stored[0] if self._return_expired else None
        if self._update_on_read:
            self._writable(slot)[composite] = (stored[0], expiry(now, self._ttl_ms))
            self._mark(slot, composite)
        return stored[0]

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        table = self._tables[slot]
        if self._frozen and slot in self._frozen:
            table = self._writable(slot)
        composite = backend._key if self._void else (backend._key, self._namespace)
        if self._ttl is None:
            table[composite] = value
        else:
            expires_at = (backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            table[composite] = (value, expires_at if expires_at <= INT64_MAX else INT64_MAX)
            if self._cleanup_size:
                self._cleanup_step()
        if self._dirty is not None:
            self._dirty[slot].add(composite)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        serialize = self.meta.serializers["value"].serialize
        if self._ttl is None:
            yield None, serialize(obj), None
        elif now is None or obj[1] > now:
            yield None, serialize(obj[0]), obj[1]


class HeapFoldingState(HeapState):
    """Reducing and aggregating state: one folded value per key and namespace."""

    def _copy_table(self, table: dict[Any, Any]) -> dict[Any, Any]:
        # Reduce and aggregate functions may mutate the stored value in place: copy it for real.
        serializer = self.meta.serializers["value"]

        def round_trip(value: Any) -> Any:
            return serializer.deserialize(serializer.serialize(value))

        if self._ttl is None:
            return {k: round_trip(value) for k, value in table.items()}
        return {k: (round_trip(value[0]), value[1]) for k, value in table.items()}

    def _current(self) -> tuple[int, Any, Any]:
        """(slot, composite key, stored value or None after the TTL read check)."""
        slot = self._slot()
        composite = self._composite_key()
        stored = self._tables[slot].get(composite)
        if stored is None or self._ttl is None:
            return slot, composite, stored
        now = self._time()
        if stored[1] <= now:
            del self._writable(slot)[composite]
            self._mark(slot, composite)
            return slot, composite, (stored[0] if self._return_expired else None)
        if self._update_on_read:
            self._writable(slot)[composite] = (stored[0], expiry(now, self._ttl_ms))
            self._mark(slot, composite)
        return slot, composite, stored[0]

    def _store(self, slot: int, composite: Any, value: Any) -> None:
        table = self._writable(slot)
        table[composite] = value if self._ttl is None else (value, self._expiry())
        if self._dirty is not None:
            self._dirty[slot].add(composite)
        if self._cleanup_size:
            self._cleanup_step()

    def _peek_for_add(self, slot: int, composite: Any) -> Any:
        """The value an add folds into: expired values only with RETURN_EXPIRED (as Flink)."""
        stored = self._tables[slot].get(composite)
        if stored is None or self._ttl is None:
            return stored
        if stored[1] <= self._time() and not self._return_expired:
            return None
        return stored[0]

    _rows = HeapValueState._rows


class HeapReducingState(HeapFoldingState, ReducingState):
    kind = StateKind.REDUCING

    def __init__(
        self, backend: KeyedStateBackend, meta: StateMetaInfo, slots: StateSlots, function: Any
    ) -> None:
        super().__init__(backend, meta, slots)
        self._function = function

    def get(self) -> Any:
        value = self._current()[2]
        if self._cleanup_size:
            self._cleanup_step()
        return value

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"reducing state {self.name!r} cannot add None: filter it out")
        slot = self._slot()
        composite = self._composite_key()
        current = self._peek_for_add(slot, composite)
        self._store(slot, composite, value if current is None else self._function(current, value))


class HeapAggregatingState(HeapFoldingState, AggregatingState):
    kind = StateKind.AGGREGATING

    def __init__(
        self, backend: KeyedStateBackend, meta: StateMetaInfo, slots: StateSlots, function: Any
    ) -> None:
        super().__init__(backend, meta, slots)
        self._function = function

    def get(self) -> Any:
        accumulator = self._current()[2]
        if self._cleanup_size:
            self._cleanup_step()
        return None if accumulator is None else self._function.get_result(accumulator)

    def add(self, value: Any) -> None:
        slot = self._slot()
        composite = self._composite_key()
        accumulator = self._peek_for_add(slot, composite)
        if accumulator is None:
            accumulator = self._function.create_accumulator()
        self._store(slot, composite, self._function.add(value, accumulator))


# --- list ---


class HeapListState(HeapState, ListState):
    """A list is a Python list; with TTL a list of ``(value, expires_at)`` tuples.

    (Parallel value/expiry lists made the TTL read C-fast but cost three tracked containers per
    list; the cyclic GC then dominated appends to new keys.)
    """

    kind = StateKind.LIST
    _FAST = (("get", "_get_plain", "_get_ttl"), ("add", "_add_plain", "_add_ttl"))
    _TRACKED = {"_add_plain": "_add_tracked", "_add_ttl": "_add_tracked"}

    def _copy_table(self, table: dict[Any, Any]) -> dict[Any, Any]:
        return {k: list(value) for k, value in table.items()}

    def _get_plain(self) -> list[Any]:
        backend = self._backend
        try:
            stored = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        return [] if stored is None else list(stored)

    def _get_ttl(self) -> list[Any]:
        backend = self._backend
        try:
            stored = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        if stored is None:
            return []
        # All live (the common case): two C-level passes instead of a comprehension's frame.
        if min(map(_SECOND, stored), default=INT64_MAX) > backend._pt_now:
            return list(map(_FIRST, stored))
        return HeapListState.get(self)

    def _add_plain(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapListState.add(self, value)
            return
        table = self._tables[slot]
        stored = table.get(backend._key)
        if stored is None:
            table[backend._key] = [value]
        else:
            stored.append(value)

    def _add_ttl(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapListState.add(self, value)
            return
        table = self._tables[slot]
        stored = table.get(backend._key)
        if stored is None:
            table[backend._key] = [(value, backend._pt_now + self._ttl_ms)]
        else:
            stored.append((value, backend._pt_now + self._ttl_ms))

    def _add_tracked(self, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if value is None or slot is None or (self._frozen and slot in self._frozen):
            HeapListState.add(self, value)
            return
        if self._ttl is None:
            self._add_plain(value)
        else:
            self._add_ttl(value)
        self._dirty[slot].add(backend._key)  # type: ignore[index]  # bound only when tracking

    def get(self) -> list[Any]:
        backend = self._backend
        try:
            table = self._tables[backend._key_group_index + self._offset]  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        stored = table.get(backend._key if self._void else (backend._key, self._namespace))
        if self._ttl is None:
            return [] if stored is None else list(stored)
        if stored is None:
            out = []
        else:
            now = backend._pt_now if self._sampled else self._now()
            out = [x[0] for x in stored if x[1] > now]
            if len(out) != len(stored) or self._update_on_read:
                out = self._ttl_get(stored)
        if self._cleanup_size:
            self._cleanup_step()
        return out

    def _ttl_get(self, stored: list[tuple[Any, int]]) -> list[Any]:
        now = self._time()
        slot, composite = self._slot(), self._composite_key()
        live = [x for x in stored if x[1] > now]
        out = [x[0] for x in (stored if self._return_expired else live)]
        if self._update_on_read and live:
            expires_at = expiry(now, self._ttl_ms)
            live = [(x[0], expires_at) for x in live]
        if len(live) != len(stored) or self._update_on_read:
            table = self._writable(slot)
            if live:
                table[composite] = live
            else:
                del table[composite]
            self._mark(slot, composite)
        return out

    def add(self, value: Any) -> None:
        if value is None:
            raise null_element(self.name)
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        table = self._tables[slot]
        if self._frozen and slot in self._frozen:
            table = self._writable(slot)
        composite = backend._key if self._void else (backend._key, self._namespace)
        if self._ttl is not None:
            expires_at = (backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            value = (value, expires_at if expires_at <= INT64_MAX else INT64_MAX)
            if self._cleanup_size:
                self._cleanup_step()
        stored = table.get(composite)
        if stored is None:
            table[composite] = [value]
        else:
            stored.append(value)
        if self._dirty is not None:
            self._dirty[slot].add(composite)

    def add_all(self, values: Iterable[Any]) -> None:
        elements = self._elements(values)
        if not elements:
            return
        slot, composite = self._slot(), self._composite_key()
        table = self._writable(slot)
        stored = table.get(composite)
        if stored is None:
            table[composite] = elements
        else:
            stored.extend(elements)
        self._mark(slot, composite)
        if self._cleanup_size:
            self._cleanup_step()

    def update(self, values: Iterable[Any] | None) -> None:
        elements = [] if values is None else self._elements(values)
        slot, composite = self._slot(), self._composite_key()
        table = self._tables[slot]
        if elements:
            self._writable(slot)[composite] = elements
            self._mark(slot, composite)
        elif composite in table:
            del self._writable(slot)[composite]
            self._mark(slot, composite)
        if self._cleanup_size:
            self._cleanup_step()

    def _elements(self, values: Iterable[Any]) -> list[Any]:
        elements = list_elements(self.name, values)
        if self._ttl is not None and elements:
            expires_at = self._expiry()
            elements = [(value, expires_at) for value in elements]
        return elements

    def _purge(self, slot: int, composite: Any, now: int) -> None:
        stored = self._tables[slot].get(composite)
        if stored is None:
            return
        live = [x for x in stored if x[1] > now]
        if len(live) != len(stored):
            table = self._writable(slot)
            if live:
                table[composite] = live
            else:
                del table[composite]
            self._mark(slot, composite)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        serialize = self.meta.serializers["value"].serialize
        pack = _POSITION.pack
        if self._ttl is None:
            for position, value in enumerate(obj):
                yield pack(position), serialize(value), None
        else:
            position = 0
            for value, expires_at in obj:
                if now is None or expires_at > now:
                    yield pack(position), serialize(value), expires_at
                    position += 1

    def _restore(
        self, table: dict[Any, Any], composite: Any, user_key: Any, value: Any, expires_at: int
    ) -> None:
        # Rows of one list arrive in position order.
        stored = table.get(composite)
        if self._ttl is not None:
            value = (value, expires_at)
        if stored is None:
            table[composite] = [value]
        else:
            stored.append(value)


# --- map ---


class HeapMapState(HeapState, MapState):
    kind = StateKind.MAP
    _FAST = (
        ("get", "_get_plain", "_get_ttl"),
        ("put", "_put_plain", "_put_ttl"),
        ("items", "_items_plain", "_items_ttl"),
        ("contains", "_contains_plain", "_contains_ttl"),
    )
    _TRACKED = {"_put_plain": "_put_plain_tracked", "_put_ttl": "_put_ttl_tracked"}

    def _copy_table(self, table: dict[Any, Any]) -> dict[Any, Any]:
        return {k: dict(value) for k, value in table.items()}

    def _get_plain(self, key: Any) -> Any:
        backend = self._backend
        try:
            user_map = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        return None if user_map is None else user_map.get(key)

    def _get_ttl(self, key: Any) -> Any:
        backend = self._backend
        try:
            user_map = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        if user_map is None:
            return None
        stored = user_map.get(key)
        if stored is None:
            return None
        if stored[1] > backend._pt_now:
            return stored[0]
        return HeapMapState.get(self, key)

    def _put_plain(self, key: Any, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if slot is None or (self._frozen and slot in self._frozen):
            HeapMapState.put(self, key, value)
            return
        table = self._tables[slot]
        user_map = table.get(backend._key)
        if user_map is None:
            table[backend._key] = {key: value}
        else:
            user_map[key] = value

    def _put_ttl(self, key: Any, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if slot is None or (self._frozen and slot in self._frozen):
            HeapMapState.put(self, key, value)
            return
        table = self._tables[slot]
        user_map = table.get(backend._key)
        if user_map is None:
            table[backend._key] = {key: (value, backend._pt_now + self._ttl_ms)}
        else:
            user_map[key] = (value, backend._pt_now + self._ttl_ms)

    def _contains_plain(self, key: Any) -> bool:
        backend = self._backend
        try:
            user_map = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        return user_map is not None and key in user_map

    def _contains_ttl(self, key: Any) -> bool:
        return self._get_ttl(key) is not None

    def _put_plain_tracked(self, key: Any, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if slot is None or (self._frozen and slot in self._frozen):
            HeapMapState.put(self, key, value)
            return
        table = self._tables[slot]
        user_map = table.get(backend._key)
        if user_map is None:
            table[backend._key] = {key: value}
        else:
            user_map[key] = value
        self._dirty_entries[slot].add((backend._key, key))  # type: ignore[index]  # bound only when tracking

    def _put_ttl_tracked(self, key: Any, value: Any) -> None:
        backend = self._backend
        slot = backend._key_group_index
        if slot is None or (self._frozen and slot in self._frozen):
            HeapMapState.put(self, key, value)
            return
        table = self._tables[slot]
        user_map = table.get(backend._key)
        if user_map is None:
            table[backend._key] = {key: (value, backend._pt_now + self._ttl_ms)}
        else:
            user_map[key] = (value, backend._pt_now + self._ttl_ms)
        self._dirty_entries[slot].add((backend._key, key))  # type: ignore[index]  # bound only when tracking

    def _items_plain(self) -> list[tuple[Any, Any]]:
        backend = self._backend
        try:
            user_map = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        return [] if user_map is None else list(user_map.items())

    def _items_ttl(self) -> list[tuple[Any, Any]]:
        backend = self._backend
        try:
            user_map = self._tables[backend._key_group_index].get(backend._key)  # type: ignore[index]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        if user_map is None:
            return []
        stored = user_map.values()
        # All live (the common case): C-level passes instead of a comprehension's frame.
        if min(map(_SECOND, stored), default=INT64_MAX) > backend._pt_now:
            return list(zip(user_map, map(_FIRST, stored), strict=True))
        return HeapMapState.items(self)

    def _map(self) -> tuple[int, Any, dict[Any, Any] | None]:
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        composite = backend._key if self._void else (backend._key, self._namespace)
        return slot, composite, self._tables[slot].get(composite)

    def _entry(
        self, slot: int, composite: Any, user_map: dict[Any, Any], user_key: Any, now: int
    ) -> Any:
        """TTL read of one entry: its value or None; cleans up or refreshes as configured."""
        stored = user_map.get(user_key)
        if stored is None:
            return None
        if stored[1] <= now:
            self._remove(slot, composite, user_key)
            return stored[0] if self._return_expired else None
        if self._update_on_read:
            self._writable(slot)[composite][user_key] = (stored[0], expiry(now, self._ttl_ms))
            self._mark_entry(slot, composite, user_key)
        return stored[0]

    def _mark_entry(self, slot: int, composite: Any, user_key: Any) -> None:
        dirty = self._dirty_entries
        if dirty is not None:
            dirty[slot].add((composite, user_key))

    def _remove(self, slot: int, composite: Any, user_key: Any) -> None:
        table = self._writable(slot)
        user_map = table[composite]
        del user_map[user_key]
        if not user_map:
            del table[composite]
        self._mark_entry(slot, composite, user_key)

    def get(self, key: Any) -> Any:
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        composite = backend._key if self._void else (backend._key, self._namespace)
        user_map = self._tables[slot].get(composite)
        if user_map is None:
            out = None
        elif self._ttl is None:
            return user_map.get(key)
        else:
            stored = user_map.get(key)
            if stored is None:
                out = None
            elif (
                stored[1] > (backend._pt_now if self._sampled else self._now())
                and not self._update_on_read
            ):
                out = stored[0]
            else:
                out = self._entry(slot, composite, user_map, key, self._time())
        if self._cleanup_size:
            self._cleanup_step()
        return out

    def contains(self, key: Any) -> bool:
        slot, composite, user_map = self._map()
        if user_map is None:
            return False
        if self._ttl is None:
            return key in user_map
        return self.get(key) is not None

    def put(self, key: Any, value: Any) -> None:
        backend = self._backend
        try:
            slot = backend._key_group_index + self._offset  # type: ignore[operator]  # _kgi is None without a current key; the TypeError is the check
        except TypeError:
            raise backend.no_current_key(f"state {self.name!r}") from None
        table = self._tables[slot]
        if self._frozen and slot in self._frozen:
            table = self._writable(slot)
        composite = backend._key if self._void else (backend._key, self._namespace)
        user_map = table.get(composite)
        if self._ttl is not None:
            expires_at = (backend._pt_now if self._sampled else self._now()) + self._ttl_ms
            value = (value, expires_at if expires_at <= INT64_MAX else INT64_MAX)
        if user_map is None:
            table[composite] = {key: value}
        else:
            user_map[key] = value
        if self._dirty_entries is not None:
            self._dirty_entries[slot].add((composite, key))
        if self._cleanup_size:
            self._cleanup_step()

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if not isinstance(entries, Mapping):
            raise StateError(
                f"map state {self.name!r}: put_all takes a mapping, got {type(entries).__name__}"
            )
        if not entries:
            return
        slot, composite, user_map = self._map()
        table = self._writable(slot)
        user_map = table.get(composite)
        if self._ttl is None:
            new = dict(entries)
        else:
            expires_at = self._expiry()
            new = {k: (value, expires_at) for k, value in entries.items()}
        if user_map is None:
            table[composite] = new
        else:
            user_map.update(new)
        if self._dirty_entries is not None:
            self._dirty_entries[slot].update((composite, k) for k in new)
        if self._cleanup_size:
            self._cleanup_step()

    def remove(self, key: Any) -> None:
        slot, composite, user_map = self._map()
        if user_map is not None and key in user_map:
            self._remove(slot, composite, key)
        if self._cleanup_size:
            self._cleanup_step()

    def _live_items(self) -> list[tuple[Any, Any]]:
        slot, composite, user_map = self._map()
        if user_map is None:
            out: list[tuple[Any, Any]] = []
        elif self._ttl is None:
            return list(user_map.items())
        else:
            now = self._time()
            out = [
                (user_key, stored[0]) for user_key, stored in user_map.items() if stored[1] > now
            ]
            if len(out) != len(user_map) or self._update_on_read:
                out = []
                for user_key in list(user_map):
                    current = self._tables[slot].get(composite)
                    if current is None:
                        break
                    value = self._entry(slot, composite, current, user_key, now)
                    if value is not None:
                        out.append((user_key, value))
        if self._cleanup_size:
            self._cleanup_step()
        return out

    def keys(self) -> list[Any]:
        return [k for k, _ in self._live_items()]

    def values(self) -> list[Any]:
        return [value for _, value in self._live_items()]

    def items(self) -> list[tuple[Any, Any]]:
        return self._live_items()

    def is_empty(self) -> bool:
        return not self._live_items()

    def _purge(self, slot: int, composite: Any, now: int) -> None:
        user_map = self._tables[slot].get(composite)
        if user_map is None:
            return
        dead = [user_key for user_key, stored in user_map.items() if stored[1] <= now]
        for user_key in dead:
            self._remove(slot, composite, user_key)

    def _rows(self, obj: Any, now: int | None) -> Iterator[tuple[bytes | None, bytes, int | None]]:
        serialize_key = self.meta.serializers["user_key"].serialize
        serialize_value = self.meta.serializers["value"].serialize
        if self._ttl is None:
            for user_key, value in obj.items():
                yield serialize_key(user_key), serialize_value(value), None
        else:
            for user_key, (value, expires_at) in obj.items():
                if now is None or expires_at > now:
                    yield serialize_key(user_key), serialize_value(value), expires_at

    def _restore(
        self, table: dict[Any, Any], composite: Any, user_key: Any, value: Any, expires_at: int
    ) -> None:
        user_map = table.get(composite)
        if user_map is None:
            user_map = table[composite] = {}
        user_map[user_key] = value if self._ttl is None else (value, expires_at)


STATE_CLASSES: dict[StateKind, type[HeapState]] = {
    StateKind.VALUE: HeapValueState,
    StateKind.LIST: HeapListState,
    StateKind.MAP: HeapMapState,
    StateKind.REDUCING: HeapReducingState,
    StateKind.AGGREGATING: HeapAggregatingState,
}


def exporter(backend: KeyedStateBackend, meta: StateMetaInfo, slots: StateSlots) -> HeapState:
    """Row encoding for a state that was restored but not claimed by a descriptor yet."""
    obj = object.__new__(STATE_CLASSES[meta.kind])
    HeapState.__init__(obj, backend, meta, slots)
    return obj
