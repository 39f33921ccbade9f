"""The heap backend's snapshot view: references to the slots at one point in time.

Later writes copy a slot before changing it (see ``states.py``), so the view reads the state as it
was when it was taken, from any thread or a forked child. An incremental view also holds the
change epochs not confirmed yet, which ``changed()`` and ``delta_columns()`` read.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from itertools import repeat
from typing import Any

from state_engine.backends.base import ChangedKey, KeyedStateView
from state_engine.backends.heap.states import IMMUTABLE_TYPES, HeapState
from state_engine.errors import SerializationError, StateError
from state_engine.hashing import key_hash
from state_engine.keygroups import KeyGroupRange
from state_engine.serde import TypeSerializer
from state_engine.state.descriptors import StateKind
from state_engine.state.meta import StateEntry, StateMetaInfo

_MISSING: Any = object()

#: One state's changes in one epoch: per slot the composite keys changed as a whole, and (map
#: states; None for others) the (composite key, user key) entries put or removed.
Epoch = tuple[list[set[Any]], list[set[tuple[Any, Any]]] | None]


class HeapStateView(KeyedStateView):
    """Slot references taken at ``snapshot_view``; later writes copy the slot before changing it.

    An incremental view also holds the change epochs not yet confirmed when it was taken (frozen
    sets of composite keys per slot); ``changed()`` reads their rows from the view's slots.
    """

    fork_safe = True

    def __init__(
        self,
        exporters: dict[str, HeapState],
        tables: dict[str, list[dict[Any, Any]]],
        now: dict[str, int | None],
        view_id: int,
        epochs: list[tuple[int, dict[str, Epoch]]] | None,
        key_group_range: KeyGroupRange,
        key_serializer: TypeSerializer,
        release: Callable[[], None],
    ) -> None:
        #: tells the backend the view no longer pins its slots; None once released
        self._release: Callable[[], None] | None = release
        self._exporters = exporters
        self._tables = tables
        self._now = now
        self._states = {name: state.meta for name, state in exporters.items()}
        self._range = key_group_range
        self._key_serializer = key_serializer
        self.view_id = view_id
        self._epochs = epochs

    @property
    def states(self) -> Mapping[str, StateMetaInfo]:
        return self._states

    @property
    def incremental(self) -> bool:
        return self._epochs is not None

    def _check_live(self) -> None:
        if self._release is None:
            raise StateError("this snapshot view was released: take a new snapshot_view()")

    def iter_entries(self, key_groups: KeyGroupRange | None = None) -> Iterator[StateEntry]:
        self._check_live()
        wanted = self._range if key_groups is None else self._range.intersection(key_groups)
        if wanted.is_empty:
            return
        start, owned = self._range.start, len(self._range)
        names = sorted(self._exporters)
        serialize_key = self._key_serializer.serialize
        for key_group in wanted:
            index = key_group - start
            key_info_of: dict[Any, tuple[int, bytes]] = {}
            for name in names:
                exporter = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                serialize_namespace = exporter._namespace_serializer.serialize
                if exporter.kind is StateKind.VALUE:
                    yield from self._value_entries(
                        exporter, slots, key_group, index, owned, now, key_info_of
                    )
                    continue
                for slot in (index, owned + index):
                    for composite, obj in slots[slot].items():
                        if slot == index:
                            key, namespace = composite, b""
                        else:
                            key, namespace = composite[0], serialize_namespace(composite[1])
                        key_info = key_info_of.get(key)
                        try:
                            if key_info is None:
                                key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                            for user_key, value, expires_at in exporter._rows(obj, now):
                                yield StateEntry(
                                    key_group,
                                    key_info[0],
                                    key_info[1],
                                    namespace,
                                    name,
                                    user_key,
                                    value,
                                    expires_at,
                                )
                        except SerializationError as exc:
                            raise SerializationError(
                                f"state {name!r}, key {key!r:.60}: {exc}"
                            ) from exc

    def entry_columns(self, batch_rows: int) -> Iterator[dict[str, list[Any]]]:
        """:meth:`iter_entries`' rows (same order) as columns, with no row object per map
        entry: a map without TTL adds all its entries with two serializer maps."""
        self._check_live()
        start, owned = self._range.start, len(self._range)
        names = sorted(self._exporters)
        serialize_key = self._key_serializer.serialize
        columns: dict[str, list[Any]] = {field: [] for field in StateEntry._fields}
        key_groups, key_hashes, key_bytes, namespaces, state_names, user_keys, values, expiries = (
            columns.values()
        )
        for index in range(owned):
            key_group = start + index
            key_info_of: dict[Any, tuple[int, bytes]] = {}
            for name in names:
                exporter = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                if exporter.kind is StateKind.VALUE:
                    for row in self._value_entries(
                        exporter, slots, key_group, index, owned, now, key_info_of
                    ):
                        for column, value in zip(columns.values(), row, strict=True):
                            column.append(value)
                    continue
                serialize_namespace = exporter._namespace_serializer.serialize
                whole_map = exporter.kind is StateKind.MAP and exporter._ttl is None
                if whole_map:
                    serialize_user_key = exporter.meta.serializers["user_key"].serialize
                    serialize_value = exporter.meta.serializers["value"].serialize
                for slot in (index, owned + index):
                    for composite, obj in slots[slot].items():
                        if slot == index:
                            key, namespace = composite, b""
                        else:
                            key, namespace = composite[0], serialize_namespace(composite[1])
                        try:
                            key_info = key_info_of.get(key)
                            if key_info is None:
                                key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                            if whole_map:
                                count = len(obj)
                                user_keys.extend(map(serialize_user_key, obj))
                                values.extend(map(serialize_value, obj.values()))
                                expiries.extend(itertools.repeat(None, count))
                            else:
                                count = 0
                                for user_key, value, expires_at in exporter._rows(obj, now):
                                    user_keys.append(user_key)
                                    values.append(value)
                                    expiries.append(expires_at)
                                    count += 1
                        except SerializationError as exc:
                            raise SerializationError(
                                f"state {name!r}, key {key!r:.60}: {exc}"
                            ) from exc
                        key_groups.extend(itertools.repeat(key_group, count))
                        key_hashes.extend(itertools.repeat(key_info[0], count))
                        key_bytes.extend(itertools.repeat(key_info[1], count))
                        namespaces.extend(itertools.repeat(namespace, count))
                        state_names.extend(itertools.repeat(name, count))
            if len(key_groups) >= batch_rows:
                yield columns
                columns = {field: [] for field in StateEntry._fields}
                (
                    key_groups,
                    key_hashes,
                    key_bytes,
                    namespaces,
                    state_names,
                    user_keys,
                    values,
                    expiries,
                ) = columns.values()
        if key_groups:
            yield columns

    def _value_entries(
        self,
        exporter: HeapState,
        slots: list[dict[Any, Any]],
        key_group: int,
        index: int,
        owned: int,
        now: int | None,
        key_info_of: dict[Any, tuple[int, bytes]],
    ) -> Iterator[StateEntry]:
        """The rows of a value state in ``key_group``, reusing the previous full view's row of
        every entry whose stored object is still the same one.

        Reused only where identity implies an unchanged row: with TTL every write stores a fresh
        ``(value, expires_at)`` tuple; without, only immutable values are reused. The cache holds
        the objects, so their ids are not recycled while cached. The cache of a slot is replaced
        once the slot was read completely (entries deleted since drop out).
        """
        cache = exporter._row_cache
        if cache is None or len(cache) != 2 * owned:
            cache = exporter._row_cache = [{} for _ in range(2 * owned)]
        ttl = exporter._ttl is not None
        name = exporter.name
        serialize_key = self._key_serializer.serialize
        serialize_namespace = exporter._namespace_serializer.serialize
        for slot in (index, owned + index):
            old = cache[slot]
            new: dict[Any, tuple[Any, StateEntry]] = {}
            for composite, obj in slots[slot].items():
                cached = old.get(composite)
                if cached is not None and cached[0] is obj:
                    row = cached[1]
                else:
                    if slot == index:
                        key, namespace = composite, b""
                    else:
                        key, namespace = composite[0], serialize_namespace(composite[1])
                    key_info = key_info_of.get(key)
                    try:
                        if key_info is None:
                            key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                        (user_key, value, expires_at), *_ = exporter._rows(obj, None)
                    except SerializationError as exc:
                        raise SerializationError(f"state {name!r}, key {key!r:.60}: {exc}") from exc
                    row = StateEntry(
                        key_group,
                        key_info[0],
                        key_info[1],
                        namespace,
                        name,
                        user_key,
                        value,
                        expires_at,
                    )
                if ttl:
                    new[composite] = (obj, row)
                    if now is not None and obj[1] <= now:
                        continue
                elif type(obj) in IMMUTABLE_TYPES:
                    new[composite] = (obj, row)
                yield row
            cache[slot] = new

    def _changes_in(self, name: str, slot: int) -> tuple[set[Any], set[tuple[Any, Any]]]:
        """The union over the view's epochs of state ``name``'s changes in ``slot``: the composite
        keys changed as a whole, and the (composite key, user key) map entries changed alone."""
        assert self._epochs is not None
        whole: set[Any] = set()
        entries: set[tuple[Any, Any]] = set()
        for _, epoch in self._epochs:
            changes = epoch.get(name)
            if changes is None:
                continue
            if changes[0][slot]:
                whole |= changes[0][slot]
            if changes[1] is not None and changes[1][slot]:
                entries |= changes[1][slot]
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
        start, owned = self._range.start, len(self._range)
        names = sorted({name for _, epoch in self._epochs for name in epoch})
        serialize_key = self._key_serializer.serialize
        for index in range(owned):
            key_group = start + index
            key_info_of: dict[Any, tuple[int, bytes]] = {}
            out: list[ChangedKey] = []
            for name in names:
                exporter = self._exporters[name]
                slots = self._tables[name]
                now = self._now[name]
                serialize_namespace = exporter._namespace_serializer.serialize
                for slot in (index, owned + index):
                    whole, entries = self._changes_in(name, slot)
                    for composite in whole | {composite for composite, _ in entries}:
                        if slot == index:
                            key, namespace = composite, b""
                        else:
                            key, namespace = composite[0], serialize_namespace(composite[1])
                        key_info = key_info_of.get(key)
                        try:
                            if key_info is None:
                                key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                            obj = slots[slot].get(composite)
                            rows = (
                                []
                                if obj is None
                                else [
                                    StateEntry(
                                        key_group,
                                        key_info[0],
                                        key_info[1],
                                        namespace,
                                        name,
                                        user_key,
                                        value,
                                        expires_at,
                                    )
                                    for user_key, value, expires_at in exporter._rows(obj, now)
                                ]
                            )
                        except SerializationError as exc:
                            raise SerializationError(
                                f"state {name!r}, key {key!r:.60}: {exc}"
                            ) from exc
                        out.append(
                            ChangedKey(name, key_group, key_info[0], key_info[1], namespace, rows)
                        )
            out.sort(key=lambda change: (change.state, change.key, change.namespace))
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
        columns: dict[str, list[Any]] = {column: [] for column in (*names, "expires_at", "op")}
        (
            key_group_column,
            key_hash_column,
            key_column,
            namespace_column,
            state_column,
            user_key_column,
            value_column,
        ) = (columns[column] for column in names)
        expires_at_column, op_column = columns["expires_at"], columns["op"]
        start, owned = self._range.start, len(self._range)
        state_names = sorted({name for _, epoch in self._epochs for name in epoch})
        serialize_key = self._key_serializer.serialize
        for index in range(owned):
            key_group = start + index
            key_info_of: dict[Any, tuple[int, bytes]] = {}
            for name in state_names:
                exporter = self._exporters[name]
                table_of = self._tables[name]
                now = self._now[name]
                serialize_namespace = exporter._namespace_serializer.serialize
                serializers = exporter.meta.serializers
                serialize_value = serializers["value"].serialize
                serialize_user_key = (
                    serializers["user_key"].serialize if "user_key" in serializers else None
                )
                ttl = exporter._ttl is not None
                value_kind = exporter.kind is StateKind.VALUE
                for slot in (index, owned + index):
                    whole, entries = self._changes_in(name, slot)
                    if not whole and not entries:
                        continue
                    table = table_of[slot]
                    void = slot == index
                    try:
                        for composite in whole:
                            key, namespace = (
                                (composite, b"")
                                if void
                                else (composite[0], serialize_namespace(composite[1]))
                            )
                            key_info = key_info_of.get(key)
                            if key_info is None:
                                key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                            obj = table.get(composite)
                            if value_kind and obj is not None:
                                # one row, whose identity has no user key: a PUT replaces it
                                # (no CLEAR needed), unless it expired (then CLEAR it below)
                                if not ttl or now is None or obj[1] > now:
                                    key_group_column.append(key_group)
                                    key_hash_column.append(key_info[0])
                                    key_column.append(key_info[1])
                                    namespace_column.append(namespace)
                                    state_column.append(name)
                                    user_key_column.append(None)
                                    value_column.append(
                                        serialize_value(obj[0]) if ttl else serialize_value(obj)
                                    )
                                    expires_at_column.append(obj[1] if ttl else None)
                                    op_column.append(PUT)
                                    continue
                                obj = None
                            rows = [] if obj is None else list(exporter._rows(obj, now))
                            count = len(rows) + 1
                            key_group_column += repeat(key_group, count)
                            key_hash_column += repeat(key_info[0], count)
                            key_column += repeat(key_info[1], count)
                            namespace_column += repeat(namespace, count)
                            state_column += repeat(name, count)
                            user_key_column.append(None)
                            value_column.append(b"")
                            expires_at_column.append(None)
                            op_column.append(CLEAR)
                            for user_key, value, expires_at in rows:
                                user_key_column.append(user_key)
                                value_column.append(value)
                                expires_at_column.append(expires_at)
                            op_column += repeat(PUT, len(rows))
                        for composite, user_key in entries:
                            if composite in whole:
                                continue  # rewritten as a whole above
                            assert serialize_user_key is not None  # only map states mark entries
                            key, namespace = (
                                (composite, b"")
                                if void
                                else (composite[0], serialize_namespace(composite[1]))
                            )
                            key_info = key_info_of.get(key)
                            if key_info is None:
                                key_info = key_info_of[key] = (key_hash(key), serialize_key(key))
                            obj = table.get(composite)
                            stored = _MISSING if obj is None else obj.get(user_key, _MISSING)
                            key_group_column.append(key_group)
                            key_hash_column.append(key_info[0])
                            key_column.append(key_info[1])
                            namespace_column.append(namespace)
                            state_column.append(name)
                            user_key_column.append(serialize_user_key(user_key))
                            if stored is not _MISSING and (
                                not ttl or now is None or stored[1] > now
                            ):
                                value_column.append(
                                    serialize_value(stored[0]) if ttl else serialize_value(stored)
                                )
                                expires_at_column.append(stored[1] if ttl else None)
                                op_column.append(PUT)
                            else:
                                value_column.append(b"")
                                expires_at_column.append(None)
                                op_column.append(DELETE)
                    except SerializationError as exc:
                        raise SerializationError(
                            f"state {name!r} (key group {key_group}): {exc}"
                        ) from exc
            if len(op_column) >= batch_rows:
                yield columns
                columns = {column: [] for column in columns}
                (
                    key_group_column,
                    key_hash_column,
                    key_column,
                    namespace_column,
                    state_column,
                    user_key_column,
                    value_column,
                ) = (columns[column] for column in names)
                expires_at_column, op_column = columns["expires_at"], columns["op"]
        if op_column:
            yield columns

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None
            self._tables = {}
            self._epochs = None if self._epochs is None else []
