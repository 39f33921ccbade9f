"""Operator (non-keyed) state: per-subtask named list states and broadcast maps, as Flink's
``OperatorStateBackend``, with the snapshot rows, restore and redistribution on rescale.

Distribution modes decide what a subtask gets back after a restore at any parallelism:

- ``SPLIT_DISTRIBUTE``: the lists of all old subtasks, concatenated in old subtask order, are split
  into contiguous, even parts (sizes differ by at most one), as Flink's
  ``RoundRobinOperatorStateRepartitioner``. At unchanged parallelism each subtask keeps its list.
- ``UNION``: every subtask gets the concatenation of all old subtasks' lists.
- ``BROADCAST``: a map, identical on every subtask; every subtask gets one copy.

Snapshot rows are ``state, mode, subtask, index, value`` (one per list element or map entry; a map
entry's value is the 4-byte big-endian key length, the key, then the value). A restore always goes
through :func:`redistribute`, even at unchanged parallelism, because UNION lists are merged there.
"""

from __future__ import annotations

import enum
import operator
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from state_engine.errors import (
    CorruptOperatorState,
    IncompatibleSerializer,
    InvalidOffset,
    InvalidParallelism,
    InvalidStateDescriptor,
    SerializationError,
    StateError,
    StateRegistrationConflict,
    UnknownPartition,
)
from state_engine.keygroups import UPPER_BOUND_MAX_PARALLELISM
from state_engine.serde import (
    Compatibility,
    IntSerializer,
    SerializerSnapshot,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    get_serializer,
    serializer_from_snapshot,
)
from state_engine.snapshot.operator_rows import OperatorStateRow

__all__ = [
    "BroadcastState",
    "OperatorListState",
    "OperatorStateBackend",
    "OperatorStateMeta",
    "OperatorStateMode",
    "SourceOffsets",
    "group_by_subtask",
    "merge_state_meta",
    "redistribute",
]


class OperatorStateMode(enum.Enum):
    """How a state's content is handed out when a job restores, at any parallelism."""

    SPLIT_DISTRIBUTE = "SPLIT"
    UNION = "UNION"
    BROADCAST = "BROADCAST"


#: Keyed by ``object``: :func:`_parse_mode` looks up whatever value a snapshot holds.
_MODES_BY_VALUE: dict[object, OperatorStateMode] = {m.value: m for m in OperatorStateMode}


def _parse_mode(value: object, where: str) -> OperatorStateMode:
    if isinstance(value, OperatorStateMode):
        return value
    mode = _MODES_BY_VALUE.get(value)
    if mode is None:
        raise CorruptOperatorState(
            f"{where}: unknown operator-state mode {value!r}; the modes are "
            f"{', '.join(m.value for m in OperatorStateMode)}: the snapshot is corrupt or from "
            "another system"
        )
    return mode


@dataclass(frozen=True)
class OperatorStateMeta:
    """Name, mode and serializer snapshots (roles: ``value``; broadcast adds ``key``)."""

    name: str
    mode: OperatorStateMode
    serializers: Mapping[str, SerializerSnapshot] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode.value,
            "serializers": {r: s.to_dict() for r, s in sorted(self.serializers.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OperatorStateMeta:
        where = f"operator state meta {data.get('name')!r}" if isinstance(data, Mapping) else ""
        if not isinstance(data, Mapping) or not {"name", "mode", "serializers"} <= set(data):
            raise CorruptOperatorState(
                f"operator state meta must be a mapping with name, mode and serializers, got "
                f"{data!r}; the snapshot metadata is corrupt"
            )
        name = data["name"]
        if not isinstance(name, str) or not name:
            raise CorruptOperatorState(f"{where}: the name must be a non-empty str")
        mode = _parse_mode(data["mode"], where)
        sers = data["serializers"]
        expected = _ROLES[mode]
        if not isinstance(sers, Mapping) or set(sers) != expected:
            raise CorruptOperatorState(
                f"{where}: a {mode.value} state needs serializers for {sorted(expected)}, got "
                f"{sers!r}; the snapshot metadata is corrupt"
            )
        try:
            snaps = {r: SerializerSnapshot.from_dict(s) for r, s in sers.items()}
        except SerializationError as exc:
            raise CorruptOperatorState(f"{where}: {exc}") from None
        return cls(name, mode, snaps)


_ROLES = {
    OperatorStateMode.SPLIT_DISTRIBUTE: frozenset({"value"}),
    OperatorStateMode.UNION: frozenset({"value"}),
    OperatorStateMode.BROADCAST: frozenset({"key", "value"}),
}

_U32 = struct.Struct(">I")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidStateDescriptor(
            f"operator state name {name!r} is not a non-empty str: name each state, e.g. 'offsets'"
        )
    if not name.isprintable():
        raise InvalidStateDescriptor(
            f"operator state name {name!r} holds a NUL or non-printable character: use printable "
            "characters only (the name becomes a column value in snapshots)"
        )
    return name


def _check_serializer(spec: object, what: str, name: str) -> TypeSerializer:
    if spec is None:
        raise InvalidStateDescriptor(
            f"operator state {name!r} has no {what}: pass a serializer, a type such as str, or a "
            "name such as 'json'"
        )
    return get_serializer(spec)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_parallelism(parallelism: object, what: str = "parallelism") -> int:
    if not _is_int(parallelism):
        raise InvalidParallelism(
            f"{what} must be an int, got {type(parallelism).__name__} {parallelism!r}: pass a "
            f"whole number in 1..{UPPER_BOUND_MAX_PARALLELISM}"
        )
    if not 1 <= parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidParallelism(
            f"{what} {parallelism} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}: choose one in range"
        )
    return parallelism


def _check_subtask(subtask_index: object, parallelism: int) -> int:
    if not _is_int(subtask_index) or not 0 <= subtask_index < parallelism:
        raise InvalidParallelism(
            f"subtask index {subtask_index!r} is outside 0..{parallelism - 1} for parallelism "
            f"{parallelism}: pass the subtask's 0-based index"
        )
    return subtask_index


def _encode_entry(key: bytes, value: bytes) -> bytes:
    return _U32.pack(len(key)) + key + value


def _decode_entry(blob: bytes, where: str) -> tuple[bytes, bytes]:
    if len(blob) < 4 or _U32.unpack_from(blob)[0] > len(blob) - 4:
        raise CorruptOperatorState(
            f"{where}: a broadcast entry of {len(blob)} bytes has no valid key length prefix; the "
            "snapshot is corrupt"
        )
    n = _U32.unpack_from(blob)[0]
    return blob[4 : 4 + n], blob[4 + n :]


# --- states ---


class _OperatorState:
    """What list and broadcast states share: name, mode, serializers, registration."""

    mode: OperatorStateMode

    def __init__(self, name: str, serializers: dict[str, TypeSerializer]) -> None:
        self.name = name
        self._serializers = serializers
        # False while the state holds restored bytes nobody has asked for yet in this run.
        self._registered = False

    def meta(self) -> OperatorStateMeta:
        return OperatorStateMeta(
            self.name, self.mode, {r: s.snapshot() for r, s in self._serializers.items()}
        )

    def _describe(self) -> str:
        sers = ", ".join(
            f"{r} {s.snapshot().to_json()}" for r, s in sorted(self._serializers.items())
        )
        return f"mode {self.mode.value} with {sers}"

    def _claim(self, serializers: dict[str, TypeSerializer]) -> None:
        """First registration in this run: adopt ``serializers``, migrating restored bytes."""
        plan: dict[str, TypeSerializer] = {}
        for role, new in serializers.items():
            old = self._serializers[role]
            result = new.resolve_compatibility(old.snapshot())
            if result is Compatibility.INCOMPATIBLE:
                raise IncompatibleSerializer(
                    f"operator state {self.name!r} was written with {role} serializer "
                    f"{old.snapshot().to_json()} which {new.snapshot().to_json()} cannot read; "
                    "register the state with the original serializer (or a compatible evolution)"
                )
            if result is Compatibility.COMPATIBLE_AFTER_MIGRATION:
                plan[role] = old
        self._migrate(plan, serializers)
        self._serializers = serializers
        self._registered = True

    def _migrate(self, old: dict[str, TypeSerializer], new: dict[str, TypeSerializer]) -> None:
        raise NotImplementedError

    def _rows(self, subtask: int) -> list[OperatorStateRow]:
        raise NotImplementedError


class OperatorListState(_OperatorState):
    """A list of elements held by one subtask (SPLIT_DISTRIBUTE or UNION).

    Elements are kept serialized, so a bad element fails where it is added and later changes to a
    Python object cannot change the state behind its back. ``None`` is not an element.
    """

    def __init__(
        self, name: str, mode: OperatorStateMode, serializer: TypeSerializer, items: list[bytes]
    ) -> None:
        super().__init__(name, {"value": serializer})
        self.mode = mode
        self._items = items

    @property
    def serializer(self) -> TypeSerializer:
        return self._serializers["value"]

    def _encode(self, value: Any) -> bytes:
        if value is None:
            raise StateError(
                f"operator list state {self.name!r} cannot hold None: leave the element out, or "
                "wrap optional values (e.g. in a tuple or JSON object)"
            )
        return self.serializer.serialize(value)

    def get(self) -> list[Any]:
        """The elements, in order (a new list)."""
        read = self.serializer.deserialize
        return [read(b) for b in self._items]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self._items)

    def add(self, value: Any) -> None:
        self._items.append(self._encode(value))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value, or none of them if one cannot be serialized."""
        encoded = [self._encode(v) for v in values]
        self._items.extend(encoded)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the whole list (an empty iterable clears it); all or nothing."""
        self._items = [self._encode(v) for v in values]

    def set(self, index: int, value: Any) -> None:
        """Replace the element at ``index`` (for sources that keep one entry per partition)."""
        if not _is_int(index) or not -len(self._items) <= index < len(self._items):
            raise StateError(
                f"operator list state {self.name!r} has {len(self._items)} elements, index "
                f"{index!r} is outside them: add() new elements instead"
            )
        self._items[index] = self._encode(value)

    def clear(self) -> None:
        self._items = []

    def _migrate(self, old: dict[str, TypeSerializer], new: dict[str, TypeSerializer]) -> None:
        if "value" in old:
            read, write = old["value"].deserialize, new["value"].serialize
            self._items = [write(read(b)) for b in self._items]

    def _rows(self, subtask: int) -> list[OperatorStateRow]:
        mode = self.mode.value
        return [OperatorStateRow(self.name, mode, subtask, i, b) for i, b in enumerate(self._items)]


class BroadcastState(_OperatorState):
    """A map that is identical on every subtask (Flink's broadcast state).

    Every subtask must apply the same updates (the broadcast stream's elements) so the copies stay
    identical; a rescale copies subtask 0's map and refuses copies that differ.
    """

    mode = OperatorStateMode.BROADCAST

    def __init__(
        self,
        name: str,
        key_serializer: TypeSerializer,
        value_serializer: TypeSerializer,
        entries: dict[bytes, bytes],
    ) -> None:
        super().__init__(name, {"key": key_serializer, "value": value_serializer})
        self._entries = entries

    @property
    def key_serializer(self) -> TypeSerializer:
        return self._serializers["key"]

    @property
    def value_serializer(self) -> TypeSerializer:
        return self._serializers["value"]

    def get(self, key: Any, default: Any = None) -> Any:
        data = self._entries.get(self.key_serializer.serialize(key))
        return default if data is None else self.value_serializer.deserialize(data)

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            raise StateError(
                f"broadcast state {self.name!r} cannot hold None for key {key!r}: remove() the "
                "key instead"
            )
        k = self.key_serializer.serialize(key)
        self._entries[k] = self.value_serializer.serialize(value)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        """Put every entry, or none of them if one cannot be serialized."""
        encoded = []
        for key, value in entries.items():
            if value is None:
                raise StateError(
                    f"broadcast state {self.name!r} cannot hold None for key {key!r}: leave the "
                    "entry out"
                )
            encoded.append(
                (self.key_serializer.serialize(key), self.value_serializer.serialize(value))
            )
        self._entries.update(encoded)

    def remove(self, key: Any) -> None:
        """Remove ``key`` if present."""
        self._entries.pop(self.key_serializer.serialize(key), None)

    def contains(self, key: Any) -> bool:
        return self.key_serializer.serialize(key) in self._entries

    __contains__ = contains

    def items(self) -> list[tuple[Any, Any]]:
        """Entries in serialized-key order (the same order on every subtask)."""
        rk, rv = self.key_serializer.deserialize, self.value_serializer.deserialize
        return [(rk(k), rv(self._entries[k])) for k in sorted(self._entries)]

    def keys(self) -> list[Any]:
        rk = self.key_serializer.deserialize
        return [rk(k) for k in sorted(self._entries)]

    def values(self) -> list[Any]:
        rv = self.value_serializer.deserialize
        return [rv(self._entries[k]) for k in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)

    def is_empty(self) -> bool:
        return not self._entries

    def clear(self) -> None:
        self._entries = {}

    def _migrate(self, old: dict[str, TypeSerializer], new: dict[str, TypeSerializer]) -> None:
        if not old:
            return
        kr = old["key"].deserialize if "key" in old else None
        vr = old["value"].deserialize if "value" in old else None
        migrated: dict[bytes, bytes] = {}
        for k, v in self._entries.items():
            nk = new["key"].serialize(kr(k)) if kr is not None else k
            migrated[nk] = new["value"].serialize(vr(v)) if vr is not None else v
        if len(migrated) != len(self._entries):
            raise IncompatibleSerializer(
                f"broadcast state {self.name!r}: migrating its keys to "
                f"{new['key'].snapshot().to_json()} maps distinct keys onto one; keep the old key "
                "serializer"
            )
        self._entries = migrated

    def _rows(self, subtask: int) -> list[OperatorStateRow]:
        mode = self.mode.value
        return [
            OperatorStateRow(self.name, mode, subtask, i, _encode_entry(k, self._entries[k]))
            for i, k in enumerate(sorted(self._entries))
        ]


# --- the backend ---


class OperatorStateBackend:
    """The operator state of one subtask (``subtask_index`` of ``parallelism``)."""

    def __init__(self, subtask_index: int, parallelism: int) -> None:
        self.parallelism = _check_parallelism(parallelism)
        self.subtask_index = _check_subtask(subtask_index, self.parallelism)
        self._states: dict[str, _OperatorState] = {}

    # registration

    def get_list_state(
        self,
        name: str,
        serializer: Any,
        mode: OperatorStateMode = OperatorStateMode.SPLIT_DISTRIBUTE,
    ) -> OperatorListState:
        """The list state ``name``, created empty, restored, or the one registered before."""
        name = _check_name(name)
        if not isinstance(mode, OperatorStateMode):
            raise InvalidStateDescriptor(
                f"operator state {name!r}: mode must be an OperatorStateMode, got {mode!r}"
            )
        if mode is OperatorStateMode.BROADCAST:
            raise InvalidStateDescriptor(
                f"operator state {name!r}: broadcast state is a map, not a list; use "
                "get_broadcast_state(name, key_serializer, value_serializer)"
            )
        ser = _check_serializer(serializer, "serializer", name)
        state = self._register(name, mode, {"value": ser})
        assert isinstance(state, OperatorListState)
        return state

    def get_union_list_state(self, name: str, serializer: Any) -> OperatorListState:
        """A list state that every subtask gets whole after a restore."""
        return self.get_list_state(name, serializer, OperatorStateMode.UNION)

    def get_broadcast_state(
        self, name: str, key_serializer: Any, value_serializer: Any
    ) -> BroadcastState:
        name = _check_name(name)
        sers = {
            "key": _check_serializer(key_serializer, "key serializer", name),
            "value": _check_serializer(value_serializer, "value serializer", name),
        }
        state = self._register(name, OperatorStateMode.BROADCAST, sers)
        assert isinstance(state, BroadcastState)
        return state

    def _register(
        self, name: str, mode: OperatorStateMode, serializers: dict[str, TypeSerializer]
    ) -> _OperatorState:
        state = self._states.get(name)
        if state is None:
            if mode is OperatorStateMode.BROADCAST:
                state = BroadcastState(name, serializers["key"], serializers["value"], {})
            else:
                state = OperatorListState(name, mode, serializers["value"], [])
            state._registered = True
            self._states[name] = state
            return state
        if state.mode is not mode:
            raise StateRegistrationConflict(
                f"operator state {name!r} is {state._describe()}; it cannot be used as mode "
                f"{mode.value}: use another name for a state with another mode"
            )
        if not state._registered:
            state._claim(serializers)
            return state
        if state._serializers != serializers:
            wanted = ", ".join(
                f"{r} {s.snapshot().to_json()}" for r, s in sorted(serializers.items())
            )
            raise StateRegistrationConflict(
                f"operator state {name!r} is registered as {state._describe()}; it was asked for "
                f"again with {wanted}: use the same serializers or another name"
            )
        return state

    # introspection

    def state_names(self) -> list[str]:
        return sorted(self._states)

    # snapshot and restore

    def snapshot_rows(self) -> list[OperatorStateRow]:
        """Every element of every state, by state name then index (restored-only states too)."""
        rows: list[OperatorStateRow] = []
        for name in sorted(self._states):
            rows.extend(self._states[name]._rows(self.subtask_index))
        return rows

    def state_meta(self) -> dict[str, OperatorStateMeta]:
        """Name, mode and serializer snapshots of every state, for ``_metadata``."""
        return {name: self._states[name].meta() for name in sorted(self._states)}

    @classmethod
    def restore(
        cls,
        subtask_index: int,
        parallelism: int,
        rows: Iterable[OperatorStateRow],
        meta: Mapping[str, OperatorStateMeta | Mapping[str, Any]],
    ) -> OperatorStateBackend:
        """A backend holding the rows that :func:`redistribute` gave this subtask.

        States come back as bytes; each is deserialized (and migrated if its serializer evolved)
        when it is first registered again. States never registered again still go into snapshots.
        """
        backend = cls(subtask_index, parallelism)
        metas = _parse_meta(meta)
        by_state: dict[str, list[OperatorStateRow]] = {name: [] for name in metas}
        for row in rows:
            row = _check_row(row)
            if row.state not in metas:
                raise CorruptOperatorState(
                    f"operator-state rows name state {row.state!r}, which the metadata does not "
                    f"describe (it has {sorted(metas)}); restore with the metadata of the same "
                    "snapshot"
                )
            if row.subtask != backend.subtask_index:
                raise CorruptOperatorState(
                    f"a row of state {row.state!r} belongs to subtask {row.subtask}, not "
                    f"{backend.subtask_index}: pass each subtask the rows redistribute() gave it"
                )
            by_state[row.state].append(row)
        for name, m in metas.items():
            where = f"operator state {name!r} of subtask {backend.subtask_index}"
            values = _ordered_values(by_state[name], m.mode, where)
            try:
                sers = {r: serializer_from_snapshot(s) for r, s in m.serializers.items()}
            except SerializationError as exc:
                raise CorruptOperatorState(f"{where}: {exc}") from None
            if m.mode is OperatorStateMode.BROADCAST:
                entries = dict(_decode_entry(v, where) for v in values)
                if len(entries) != len(values):
                    raise CorruptOperatorState(f"{where}: the same key appears twice")
                state: _OperatorState = BroadcastState(name, sers["key"], sers["value"], entries)
            else:
                state = OperatorListState(name, m.mode, sers["value"], values)
            backend._states[name] = state
        return backend

    @classmethod
    def restore_rescaled(
        cls,
        rows_by_old_subtask: Sequence[Sequence[OperatorStateRow]],
        meta: Mapping[str, OperatorStateMeta | Mapping[str, Any]],
        new_parallelism: int,
    ) -> list[OperatorStateBackend]:
        """Every new subtask's backend: :func:`redistribute` then :meth:`restore`."""
        parts = redistribute(rows_by_old_subtask, new_parallelism)
        return [cls.restore(i, new_parallelism, part, meta) for i, part in enumerate(parts)]


def _parse_meta(
    meta: Mapping[str, OperatorStateMeta | Mapping[str, Any]],
) -> dict[str, OperatorStateMeta]:
    if not isinstance(meta, Mapping):
        raise CorruptOperatorState(
            f"operator state meta must map state name -> meta, got {type(meta).__name__}; pass "
            "state_meta() of the snapshot (or its to_dict() form)"
        )
    out: dict[str, OperatorStateMeta] = {}
    for name, m in meta.items():
        parsed = m if isinstance(m, OperatorStateMeta) else OperatorStateMeta.from_dict(m)
        if parsed.name != name:
            raise CorruptOperatorState(
                f"operator state meta under {name!r} describes state {parsed.name!r}; the "
                "snapshot metadata is corrupt"
            )
        out[name] = parsed
    return out


def merge_state_meta(
    metas: Iterable[Mapping[str, OperatorStateMeta]],
) -> dict[str, OperatorStateMeta]:
    """One meta per state across subtasks; a state two subtasks describe differently is a bug."""
    out: dict[str, OperatorStateMeta] = {}
    for i, meta in enumerate(metas):
        for name, m in _parse_meta(meta).items():
            seen = out.setdefault(name, m)
            if seen != m:
                raise CorruptOperatorState(
                    f"operator state {name!r} is {m.to_dict()} on subtask {i} but "
                    f"{seen.to_dict()} on an earlier subtask: every subtask must register it the "
                    "same way"
                )
    return dict(sorted(out.items()))


# --- redistribution ---


def _check_row(row: object) -> OperatorStateRow:
    if not isinstance(row, tuple) or len(row) != 5:
        raise CorruptOperatorState(
            f"an operator-state row must be (state, mode, subtask, index, value), got {row!r}"
        )
    state, mode, subtask, index, value = row
    if not isinstance(state, str) or not state:
        raise CorruptOperatorState(f"operator-state row with state name {state!r}: not a str")
    mode = _parse_mode(mode, f"row of operator state {state!r}").value
    if not _is_int(subtask) or subtask < 0 or not _is_int(index) or index < 0:
        raise CorruptOperatorState(
            f"row of operator state {state!r}: subtask {subtask!r} and index {index!r} must be "
            "ints >= 0"
        )
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise CorruptOperatorState(
            f"row of operator state {state!r}: value must be bytes, got {type(value).__name__}"
        )
    if type(value) is not bytes:
        value = bytes(value)
    return OperatorStateRow(state, mode, subtask, index, value)


def _ordered_values(
    rows: list[OperatorStateRow], mode: OperatorStateMode, where: str
) -> list[bytes]:
    """The values of one state of one subtask by index; indices must be exactly 0..n-1."""
    rows = sorted(rows, key=lambda r: r.index)
    for expected, row in enumerate(rows):
        if row.mode != mode.value:
            raise CorruptOperatorState(
                f"{where}: a row says mode {row.mode} but the state is {mode.value}; the snapshot "
                "is corrupt"
            )
        if row.index != expected:
            raise CorruptOperatorState(
                f"{where}: element indices must run 0..{len(rows) - 1}, found {row.index} at "
                f"position {expected} (a gap or a duplicate); the snapshot is corrupt"
            )
    return [r.value for r in rows]


def _split_evenly(values: list[bytes], parts: int) -> list[list[bytes]]:
    base, extra = divmod(len(values), parts)
    out = []
    start = 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append(values[start:end])
        start = end
    return out


def group_by_subtask(
    rows: Iterable[Sequence[Any]], parallelism: int
) -> list[list[OperatorStateRow]]:
    """Split a snapshot's operator-state rows (any 5-tuples, e.g. read from Parquet) by subtask,
    the input :func:`redistribute` takes; ``parallelism`` is the snapshot's."""
    p = _check_parallelism(parallelism, "snapshot parallelism")
    out: list[list[OperatorStateRow]] = [[] for _ in range(p)]
    for raw in rows:
        row = _check_row(raw)
        if row.subtask >= p:
            raise CorruptOperatorState(
                f"a row of operator state {row.state!r} names subtask {row.subtask}, but the "
                f"snapshot has parallelism {p}; pass the parallelism the snapshot was taken at"
            )
        out[row.subtask].append(row)
    return out


def redistribute(
    rows_by_old_subtask: Sequence[Sequence[OperatorStateRow]], new_parallelism: int
) -> list[list[OperatorStateRow]]:
    """The rows each of ``new_parallelism`` subtasks restores from the old subtasks' rows.

    ``rows_by_old_subtask[i]`` holds old subtask i's rows. Output rows carry their new subtask and
    fresh indices 0..n-1 per state, sorted by state then index. Pure: the input is not changed.
    """
    new_p = _check_parallelism(new_parallelism, "new parallelism")
    given: object = rows_by_old_subtask  # callers may pass anything: checked at run time
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise CorruptOperatorState(
            "redistribute takes one sequence of rows per old subtask, got "
            f"{type(rows_by_old_subtask).__name__}"
        )
    old_p = len(rows_by_old_subtask)
    if old_p == 0:
        raise InvalidParallelism(
            "redistribute needs the rows of at least one old subtask (pass [[]] for a job "
            "without operator state)"
        )
    modes: dict[str, OperatorStateMode] = {}
    grouped: dict[str, list[list[OperatorStateRow]]] = {}
    for old, rows in enumerate(rows_by_old_subtask):
        for raw in rows:
            row = _check_row(raw)
            if row.subtask != old:
                raise CorruptOperatorState(
                    f"a row of state {row.state!r} says subtask {row.subtask} but sits in the "
                    f"rows of old subtask {old}; pass rows_by_old_subtask[i] = subtask i's rows"
                )
            mode = _parse_mode(row.mode, f"row of operator state {row.state!r}")
            seen = modes.setdefault(row.state, mode)
            if seen is not mode:
                raise CorruptOperatorState(
                    f"operator state {row.state!r} has rows in mode {seen.value} and "
                    f"{mode.value}; the snapshot is corrupt"
                )
            grouped.setdefault(row.state, [[] for _ in range(old_p)])[old].append(row)

    out: list[list[OperatorStateRow]] = [[] for _ in range(new_p)]
    for name in sorted(grouped):
        mode = modes[name]
        lists = [
            _ordered_values(rows, mode, f"operator state {name!r} of old subtask {i}")
            for i, rows in enumerate(grouped[name])
        ]
        if mode is OperatorStateMode.SPLIT_DISTRIBUTE:
            # Flink keeps the assignment when the parallelism does not change.
            parts = (
                lists if new_p == old_p else _split_evenly([v for lst in lists for v in lst], new_p)
            )
        elif mode is OperatorStateMode.UNION:
            union = [v for lst in lists for v in lst]
            parts = [union] * new_p
        else:
            for i, lst in enumerate(lists[1:], start=1):
                if lst != lists[0]:
                    raise CorruptOperatorState(
                        f"broadcast state {name!r} differs between old subtask 0 "
                        f"({len(lists[0])} entries) and old subtask {i} ({len(lst)} entries): "
                        "every subtask must apply the same updates to broadcast state (a bug in "
                        "the operator)"
                    )
            parts = [lists[0]] * new_p
        value = mode.value
        for new, part in enumerate(parts):
            out[new].extend(OperatorStateRow(name, value, new, i, v) for i, v in enumerate(part))
    return out


# --- the worked example: a partitioned source's offsets ---

_OFFSET_ENTRY = TupleSerializer(StrSerializer(), IntSerializer())


class SourceOffsets:
    """Per-partition read offsets of a partitioned source, in a SPLIT list state.

    Each entry is (partition, offset), offset being the position of the next record to read. After
    a rescale each partition's entry lands on exactly one subtask, as with Flink's Kafka consumer;
    new partitions are added with :meth:`assign`.
    """

    def __init__(self, backend: OperatorStateBackend, name: str = "source-offsets") -> None:
        self._state = backend.get_list_state(name, _OFFSET_ENTRY)
        self._positions: dict[str, int] = {}
        self._offsets: dict[str, int] = {}
        for i, (partition, offset) in enumerate(self._state.get()):
            if partition in self._positions:
                raise CorruptOperatorState(
                    f"source offsets {name!r} hold partition {partition!r} twice on subtask "
                    f"{backend.subtask_index}; the snapshot is corrupt"
                )
            self._positions[partition] = i
            self._offsets[partition] = offset

    def assign(self, partitions: Iterable[str], start_offset: int = 0) -> list[str]:
        """Track the given partitions from ``start_offset``; returns those that were new.

        Partitions already held (e.g. restored) keep their offsets.
        """
        start = _check_offset(start_offset, "start offset")
        wanted = list(partitions)
        for p in wanted:
            if not isinstance(p, str) or not p:
                raise InvalidStateDescriptor(
                    f"a source partition must be a non-empty str, got {p!r}: name partitions "
                    "e.g. 'orders-0'"
                )
        added = [p for p in dict.fromkeys(wanted) if p not in self._offsets]
        self._state.add_all([(p, start) for p in added])
        for p in added:
            self._positions[p] = len(self._positions)
            self._offsets[p] = start
        return added

    def offset(self, partition: str) -> int:
        try:
            return self._offsets[partition]
        except KeyError:
            raise self._unknown(partition) from None

    def advance(self, partition: str, offset: int) -> None:
        """Set the next offset to read; offsets never move backwards."""
        current = self._offsets.get(partition)
        if current is None:
            raise self._unknown(partition)
        offset = _check_offset(offset, f"offset of partition {partition!r}")
        if offset < current:
            raise InvalidOffset(
                f"partition {partition!r} is at offset {current}; advancing to {offset} would "
                "move it backwards and re-read records: offsets only grow"
            )
        self._state.set(self._positions[partition], (partition, offset))
        self._offsets[partition] = offset

    def partitions(self) -> list[str]:
        """The partitions this subtask reads, in assignment order."""
        return list(self._offsets)

    def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    def _unknown(self, partition: object) -> UnknownPartition:
        return UnknownPartition(
            f"partition {partition!r} is not read by this subtask (it reads "
            f"{sorted(self._offsets)}); assign() it first"
        )


def _check_offset(offset: object, what: str) -> int:
    try:
        # operator.index accepts NumPy integers (offsets often come out of Arrow) but no floats.
        value = operator.index(offset)  # type: ignore[arg-type]  # any object: TypeError below
    except TypeError:
        value = -1
    if isinstance(offset, bool) or not 0 <= value <= 2**63 - 1:
        raise InvalidOffset(f"{what} must be an int in 0..2**63-1, got {offset!r}")
    return value
