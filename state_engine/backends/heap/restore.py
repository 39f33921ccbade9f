"""The heap backend's restore: canonical rows (any backend's export) into its slots.

Each distinct serialized key, user key and value is decoded once when it decodes to an immutable
object (a str, an int...; from Arrow columns, Arrow finds the distinct values), and the rows of
one slot go into its table without a lookup per row. Restored rows count as changes, so a delta
is correct whatever base it is folded onto.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.backends.base import KeyedStateBackend, RestorePlan
from state_engine.backends.heap.states import IMMUTABLE_TYPES, HeapState
from state_engine.snapshot.canonical import int_values
from state_engine.state.descriptors import StateKind
from state_engine.state.meta import StateColumns, StateEntry
from state_engine.state.ttl import INT64_MAX


def restore_entries(
    backend: KeyedStateBackend,
    states: Mapping[str, HeapState],
    plan: RestorePlan,
    entries: Iterable[StateEntry],
) -> None:
    """Add ``entries`` to the slots of ``states`` (one row at a time)."""
    deserialize_key = backend.key_serializer.deserialize
    owned = backend._kg_count
    decoders: dict[str, tuple[Any, Any, Any, HeapState]] = {}
    for name, (written, _current) in plan.items():
        serializers = written.serializers
        decoders[name] = (
            serializers["namespace"].deserialize,
            serializers["value"].deserialize,
            serializers["user_key"].deserialize if "user_key" in serializers else None,
            states[name],
        )
    for row in entries:
        index = backend._check_row_key_group(row.key_group)
        decoder = decoders.get(row.state)
        if decoder is None:
            raise backend._unknown_state_row(row.state)
        deserialize_namespace, deserialize_value, deserialize_user_key, state = decoder
        key = deserialize_key(row.key)
        if row.namespace:
            slot, composite = owned + index, (key, deserialize_namespace(row.namespace))
        else:
            slot, composite = index, key
        table = state._writable(slot)
        user_key = deserialize_user_key(row.user_key) if deserialize_user_key is not None else None
        expires_at = INT64_MAX if row.expires_at is None else row.expires_at
        state._restore(table, composite, user_key, deserialize_value(row.value), expires_at)
        if state._dirty is not None:
            state._dirty[slot].add(composite)


def restore_columns(
    backend: KeyedStateBackend,
    states: Mapping[str, HeapState],
    plan: RestorePlan,
    columns: Iterable[StateColumns],
) -> None:
    """:func:`restore_entries` from columns, one state at a time."""
    owned = backend._kg_count
    for batch in columns:
        if batch.state not in plan:
            raise backend._unknown_state_row(batch.state)
        if not batch.rows:
            continue
        key_groups = _ints(batch.key_group)
        backend._check_row_key_group(int(key_groups.min()))
        backend._check_row_key_group(int(key_groups.max()))
        name = batch.state
        meta = plan[name][0]
        serializers = meta.serializers
        deserialize_namespace = serializers["namespace"].deserialize
        keys = _decoded(backend.key_serializer.deserialize, batch.key)
        user_keys: Iterable[Any] = (
            _decoded(serializers["user_key"].deserialize, batch.user_key)
            if "user_key" in serializers
            else itertools.repeat(None)
        )
        values = _decoded(serializers["value"].deserialize, batch.value)
        state = states[name]
        if meta.ttl is None and meta.kind is not StateKind.LIST and _all_empty(batch.namespace):
            _restore_runs(
                backend, state, meta.kind is StateKind.MAP, key_groups, keys, user_keys, values
            )
            continue
        expiries = [
            INT64_MAX if expiry is None else expiry for expiry in batch.column("expires_at")
        ]
        restore = state._restore
        dirty = state._dirty
        start = backend._kg_start
        last_slot: int = -1
        table: dict[Any, Any] = {}
        changed: set[Any] | None = None
        namespaces = batch.column("namespace")
        for key_group, key, namespace, user_key, value, expires_at in zip(
            key_groups.tolist(), keys, namespaces, user_keys, values, expiries, strict=False
        ):
            if namespace:
                slot = owned + key_group - start
                composite = (key, deserialize_namespace(namespace))
            else:
                slot, composite = key_group - start, key
            if slot != last_slot:
                last_slot, table = slot, state._writable(slot)
                changed = dirty[slot] if dirty is not None else None
            restore(table, composite, user_key, value, expires_at)
            if changed is not None:
                changed.add(composite)


def _restore_runs(
    backend: KeyedStateBackend,
    state: HeapState,
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
    dirty = state._dirty
    start = backend._kg_start
    all_user_keys = list(user_keys) if is_map else []
    for first, end in itertools.pairwise(cuts):
        slot = int(key_groups[first]) - start
        table = state._writable(slot)
        run = keys[first:end]
        if is_map:
            same = np.fromiter(map(operator.eq, run[1:], run[:-1]), np.bool_, len(run) - 1)
            bounds = [0, *(np.flatnonzero(~same) + 1).tolist(), len(run)]
            run_user_keys, run_values = all_user_keys[first:end], values[first:end]
            for low, high in itertools.pairwise(bounds):
                entries = zip(run_user_keys[low:high], run_values[low:high], strict=True)
                user_map = table.get(run[low])
                if user_map is None:
                    table[run[low]] = dict(entries)
                else:
                    user_map.update(entries)
        else:
            table.update(zip(run, values[first:end], strict=True))
        if dirty is not None:
            dirty[slot].update(run)


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
        return [deserialize(raw_value) for raw_value in raw]
    cache = {}
    for raw_value in distinct:
        obj = deserialize(raw_value)
        if type(obj) not in IMMUTABLE_TYPES:
            return [deserialize(raw_value) for raw_value in raw]  # mutable: one object per entry
        cache[raw_value] = obj
    return [cache[raw_value] for raw_value in raw]


def _decoded_arrow(deserialize: Callable[[Any], Any], raw: pa.Array) -> list[Any]:
    """:func:`_decoded` of an Arrow column without nulls: Arrow finds the distinct values and
    each row's index in C, so no bytes object is made per row when values repeat."""
    encoded = pc.dictionary_encode(raw)
    if len(encoded.dictionary) * 2 <= len(raw):
        shared = np.empty(len(encoded.dictionary), dtype=object)
        for index, raw_value in enumerate(encoded.dictionary.to_pylist()):
            obj = deserialize(raw_value)
            if type(obj) not in IMMUTABLE_TYPES:
                break  # mutable: one object per entry
            shared[index] = obj
        else:
            decoded: list[Any] = shared[int_values(encoded.indices)].tolist()
            return decoded
    return [deserialize(raw_value) for raw_value in raw.to_pylist()]


def _ints(values: Sequence[int] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column of ints (key groups) as NumPy."""
    arrow = isinstance(values, (pa.Array, pa.ChunkedArray))
    return int_values(values) if arrow else np.asarray(values)


def _all_empty(values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> bool:
    """Whether every value of a bytes column (namespaces) is empty."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return len(values) == 0 or pc.max(pc.binary_length(values)).as_py() == 0
    return not any(values)
