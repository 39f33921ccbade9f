"""The keyed state backend interface, shared by the heap and RocksDB backends.

A backend owns one contiguous key-group range of one operator. ``set_current_key`` computes the
key's hash and key group once per record; every state access then reuses them. The snapshot bridge
(``snapshot_view`` / ``KeyedStateView.iter_entries`` / ``restore_entries``) speaks the canonical row
(:class:`~state_engine.state.meta.StateEntry`), so any backend's export restores into any other.

A backend's snapshots go through one ``SnapshotStrategy`` of the snapshot layer (capture at the
barrier, write the files asynchronously, describe them): every backend is written canonically by
``snapshot.strategy``'s strategy; ``snapshot_strategy`` names a format of the backend's own (heap:
delta on a canonical base; RocksDB: its native files). A new backend is one package: its state
classes, its layout, its strategy and, for a native format, its factory's restore.
"""

from __future__ import annotations

import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from state_engine.errors import (
    IncompatibleSerializer,
    KeyGroupOutOfRange,
    NoCurrentKey,
    StateError,
    StateRegistrationConflict,
)
from state_engine.hashing import key_hash, murmur_hash
from state_engine.keygroups import KeyGroupRange, check_max_parallelism
from state_engine.serde import Compatibility, TypeSerializer, check_compatibility, get_serializer
from state_engine.state.api import State
from state_engine.state.descriptors import StateDescriptor
from state_engine.state.meta import StateColumns, StateEntry, StateMetaInfo
from state_engine.state.namespace import NamespaceSerializer
from state_engine.state.ttl import INT64_MIN, Clock, SystemClock, TtlTimeDomain

if TYPE_CHECKING:
    from state_engine.snapshot.strategy import SnapshotStrategy
    from state_engine.snapshot_enums import SnapshotFormat

_time_ns = time.time_ns
#: per restored state: the meta its rows were written with, and the meta the backend holds
RestorePlan = dict[str, tuple[StateMetaInfo, StateMetaInfo]]

__all__ = [
    "ChangedKey",
    "KeyedStateBackend",
    "KeyedStateView",
    "StateEntry",
    "StateMetaInfo",
]


class ChangedKey(NamedTuple):
    """One (state, key, namespace) written, cleared or removed since the last confirmed view.

    ``rows`` are its complete canonical rows at the view's point in time (empty: it no longer
    exists), so a delta writer emits DELETEs for the rows of the base that are not in ``rows``.
    """

    state: str
    key_group: int
    key_hash: int
    key: bytes
    namespace: bytes
    rows: list[StateEntry]


class KeyedStateView(ABC):
    """A point-in-time view of a backend's keyed state, readable from another thread."""

    #: Increasing per backend; ``backend.confirm_view(view_id)`` once its snapshot completed.
    view_id: int = 0
    #: Plain Python objects only: a forked child may read the view (see checkpoint/forked.py).
    fork_safe: bool = False

    @abstractmethod
    def iter_entries(self, key_groups: KeyGroupRange | None = None) -> Iterator[StateEntry]:
        """Canonical rows in key-group order, only for ``key_groups`` (default: all owned)."""

    def entry_columns(self, batch_rows: int) -> Iterator[dict[str, list[Any]]]:
        """:meth:`iter_entries` column by column: chunks of about ``batch_rows`` rows, each a
        dict of equal-length lists keyed by the :class:`StateEntry` field names. This default
        transposes the rows; a backend may build the columns without a row object."""
        rows = self.iter_entries()
        while chunk := list(itertools.islice(rows, batch_rows)):
            yield dict(zip(StateEntry._fields, map(list, zip(*chunk, strict=True)), strict=True))

    @property
    @abstractmethod
    def states(self) -> Mapping[str, StateMetaInfo]:
        """The meta info of every state in the view."""

    @abstractmethod
    def release(self) -> None:
        """Free what the view pins; the view cannot be read afterwards."""

    def __enter__(self) -> KeyedStateView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def null_element(name: str) -> StateError:
    """The error for a None element added to a list state (every backend refuses it)."""
    return StateError(
        f"list state {name!r} cannot hold None: filter None out before adding (as in Flink)"
    )


def list_elements(name: str, values: Iterable[Any]) -> list[Any]:
    """``values`` as the elements of list state ``name``: every backend takes an iterable (not a
    str or bytes) without None."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise StateError(
            f"list state {name!r} takes an iterable of elements, got "
            f"{type(values).__name__}: wrap a single element in a list or use add()"
        )
    elements = list(values)
    if any(value is None for value in elements):
        raise null_element(name)
    return elements


def _describe_meta(meta: StateMetaInfo) -> dict[str, Any]:
    d = meta.to_dict()
    d.pop("name")
    return d


def meta_differences(old: StateMetaInfo, new: StateMetaInfo) -> list[str]:
    """Human-readable differences between two registrations of one state."""
    a, b = _describe_meta(old), _describe_meta(new)
    out = []
    if a["kind"] != b["kind"]:
        out.append(f"kind {a['kind']} vs {b['kind']}")
    for role in sorted(set(a["serializers"]) | set(b["serializers"])):
        sa, sb = a["serializers"].get(role), b["serializers"].get(role)
        if sa != sb:
            out.append(f"{role} serializer {sa} vs {sb}")
    if a["ttl"] != b["ttl"]:
        out.append(f"TTL {a['ttl']} vs {b['ttl']}")
    return out


class KeyedStateBackend(ABC):
    """Keyed state of the key groups in ``key_group_range`` (out of ``max_parallelism``)."""

    #: Entries kept in the per-backend cache of (key -> key group and encoded key).
    key_cache_size: int = 1 << 16

    def __init__(
        self,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
        *,
        ttl_time_per_record: bool | None = None,
    ) -> None:
        self.key_serializer: TypeSerializer = get_serializer(key_serializer)
        self.max_parallelism = check_max_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange):
            raise KeyGroupOutOfRange(
                f"key_group_range must be a KeyGroupRange, got {key_group_range!r}: build it with "
                "compute_key_group_range_for_operator_index(max_p, p, i)"
            )
        if key_group_range.is_empty or key_group_range.end >= self.max_parallelism:
            raise KeyGroupOutOfRange(
                f"key-group range {key_group_range} is empty or not inside "
                f"0..{self.max_parallelism - 1} (max parallelism {self.max_parallelism}): "
                "pass the range of this subtask"
            )
        self.key_group_range = key_group_range
        self._kg_start = key_group_range.start
        self._kg_count = len(key_group_range)
        self.clock: Clock = clock if clock is not None else SystemClock()
        # Processing-time TTL reads the clock once per record (at set_current_key) instead of once
        # per state access: a record's accesses all see one time, and the hot path reads an
        # attribute. Default: on for the wall clock; off for injected clocks, which tests move
        # between two accesses of one record.
        if ttl_time_per_record is None:
            ttl_time_per_record = type(self.clock) is SystemClock
        self._ttl_time_per_record = bool(ttl_time_per_record)
        self._sample_time = False  # set once a processing-time TTL state samples per record
        self._clock_now = self.clock.now_ms
        # The wall clock is read inline: SystemClock.now_ms's Python frame doubles its cost.
        self._wall_clock = type(self.clock) is SystemClock
        self._pt_now = 0
        self._watermark = INT64_MIN
        self._key: Any = None
        self._has_key = False
        self._key_group_index: int | None = None  # key group - range start; None until a key is set
        self._key_group = -1
        self._key_bytes: Any = None
        self._key_cache: dict[Any, tuple[int, int, Any]] = {}
        self._states: dict[str, State] = {}
        self._metas: dict[str, StateMetaInfo] = {}
        self._record_cleanups: list[Any] = []
        self._closed = False
        self._specialise_set_current_key()

    # --- current key ---

    def _key_extra(self, key: Any, key_group: int) -> Any:
        """Per-key data a backend wants cached with the key group (RocksDB: the key prefix)."""
        return None

    def _compute_key_info(self, key: Any) -> tuple[int, int, Any]:
        kg = murmur_hash(key_hash(key)) % self.max_parallelism
        kgi = kg - self._kg_start
        if not 0 <= kgi < self._kg_count:
            raise KeyGroupOutOfRange(
                f"key {key!r:.80} is in key group {kg}, outside the range {self.key_group_range} "
                f"this backend owns (max parallelism {self.max_parallelism}): the record was most "
                "likely routed to the wrong subtask (partition the stream by the same key and max "
                "parallelism)"
            )
        info = (kgi, kg, self._key_extra(key, kg))
        cache = self._key_cache
        if len(cache) >= self.key_cache_size:
            cache.clear()
        cache[key] = info
        return info

    def _set_current_key_plain(self, key: Any) -> None:
        info = self._key_cache.get(key)
        if info is None:
            info = self._compute_key_info(key)
        self._key = key
        self._key_group_index, self._key_group, self._key_bytes = info

    def _set_current_key_wall(self, key: Any) -> None:
        info = self._key_cache.get(key)
        if info is None:
            info = self._compute_key_info(key)
        self._key = key
        self._key_group_index, self._key_group, self._key_bytes = info
        self._pt_now = _time_ns() // 1_000_000

    def _specialise_set_current_key(self) -> None:
        """Bind ``set_current_key`` to a variant without the per-record checks it never needs.

        It runs once per record; each skipped attribute test is a measurable share of a state
        access. Callers that bound the method earlier keep the generic one, which is equivalent.
        """
        if self._record_cleanups:
            self.__dict__.pop("set_current_key", None)
        elif not self._sample_time:
            self.set_current_key = self._set_current_key_plain  # type: ignore[method-assign]  # set_current_key is picked once per backend configuration (hot path)
        elif self._wall_clock:
            self.set_current_key = self._set_current_key_wall  # type: ignore[method-assign]  # set_current_key is picked once per backend configuration (hot path)
        else:
            self.__dict__.pop("set_current_key", None)

    def set_current_key(self, key: Any) -> None:
        info = self._key_cache.get(key)
        if info is None:
            info = self._compute_key_info(key)
        self._key = key
        self._key_group_index, self._key_group, self._key_bytes = info
        if self._sample_time:
            self._pt_now = _time_ns() // 1_000_000 if self._wall_clock else self._clock_now()
        if self._record_cleanups:
            for step in self._record_cleanups:
                step()

    @property
    def current_key(self) -> Any:
        if self._key_group_index is None:
            raise self.no_current_key("current_key")
        return self._key

    @property
    def current_key_group(self) -> int:
        if self._key_group_index is None:
            raise self.no_current_key("current_key_group")
        return self._key_group

    @staticmethod
    def no_current_key(what: str) -> NoCurrentKey:
        return NoCurrentKey(
            f"{what} was accessed with no current key: call backend.set_current_key(key) for "
            "each record before using keyed state"
        )

    # --- time ---

    def advance_watermark(self, timestamp: int) -> None:
        """Advance event time (TTL in the EVENT_TIME domain); watermarks never go back."""
        if timestamp > self._watermark:
            self._watermark = int(timestamp)

    @property
    def current_watermark(self) -> int:
        return self._watermark

    def _event_time(self) -> int:
        return self._watermark

    def time_source(self, meta: StateMetaInfo) -> Any:
        """The zero-argument callable giving TTL's ``now`` for ``meta`` (read fresh)."""
        if meta.ttl is not None and meta.ttl.time_domain is TtlTimeDomain.EVENT_TIME:
            return self._event_time
        return self.clock.now_ms

    def _sampled_time(self) -> int:
        return self._pt_now

    def state_time(self, meta: StateMetaInfo) -> tuple[bool, Any]:
        """How a state of ``meta`` reads TTL's ``now`` on the hot path.

        ``(True, fn)``: read ``backend._pt_now``, the processing time sampled when the current key
        was set (``fn`` returns the same); ``(False, fn)``: call ``fn`` per access.
        """
        if (
            meta.ttl is not None
            and meta.ttl.time_domain is TtlTimeDomain.PROCESSING_TIME
            and self._ttl_time_per_record
        ):
            if not self._sample_time:
                self._sample_time = True
                if self._key_group_index is not None:
                    self._pt_now = self._clock_now()
                self._specialise_set_current_key()
            return True, self._sampled_time
        return False, self.time_source(meta)

    # --- registration ---

    def get_state(self, descriptor: StateDescriptor, namespace_serializer: Any = None) -> Any:
        """The state object for ``descriptor`` (registered on first use)."""
        if not isinstance(descriptor, StateDescriptor):
            raise StateError(
                f"get_state needs a StateDescriptor, got {type(descriptor).__name__}: pass e.g. "
                "ValueStateDescriptor('count', int)"
            )
        self._check_open()
        ns_ser = (
            NamespaceSerializer()
            if namespace_serializer is None
            else get_serializer(namespace_serializer)
        )
        meta = StateMetaInfo(
            descriptor.name,
            descriptor.kind,
            {**descriptor.serializers, "namespace": ns_ser},
            descriptor.effective_ttl,
        )
        existing = self._states.get(descriptor.name)
        if existing is not None:
            diffs = meta_differences(self._metas[descriptor.name], meta)
            if diffs:
                raise StateRegistrationConflict(
                    f"state {descriptor.name!r} is already registered differently: "
                    f"{'; '.join(diffs)}. Use the same descriptor for one name, or pick a new name "
                    "for the new state"
                )
            return existing
        restored = self._metas.get(descriptor.name)
        migrate = False
        if restored is not None:
            migrate = self._reconcile(restored, meta)
        self._metas[descriptor.name] = meta
        state = self._create_state(descriptor, meta, restored if migrate else None)
        self._states[descriptor.name] = state
        return state

    def _reconcile(self, restored: StateMetaInfo, meta: StateMetaInfo) -> bool:
        """Check ``meta`` can take over restored data; True when values need migrating."""
        if restored.kind is not meta.kind:
            raise StateRegistrationConflict(
                f"state {meta.name!r} was restored as {restored.kind.value} but is requested as "
                f"{meta.kind.value}: use the kind the state was written with, or a new name"
            )
        if (restored.ttl is None) != (meta.ttl is None):
            raise StateRegistrationConflict(
                f"state {meta.name!r} was restored with TTL "
                f"{'off' if restored.ttl is None else 'on'} but is requested with TTL "
                f"{'off' if meta.ttl is None else 'on'}: TTL cannot be switched on or off across a "
                "restore (as in Flink); keep the setting, or migrate the state offline"
            )
        migrate = False
        for role, ser in meta.serializers.items():
            prev = restored.serializers.get(role)
            if prev is None:
                raise IncompatibleSerializer(
                    f"state {meta.name!r} was restored without a {role} serializer: the snapshot "
                    "metadata does not match this state kind"
                )
            result = check_compatibility(prev.snapshot(), ser, f"state {meta.name!r} ({role})")
            if result is Compatibility.COMPATIBLE_AFTER_MIGRATION:
                if role != "value":
                    raise IncompatibleSerializer(
                        f"state {meta.name!r}: the {role} serializer changed from "
                        f"{prev.snapshot().to_json()} to {ser.snapshot().to_json()} and needs "
                        "migration, which is supported for values only (keys are part of the "
                        "layout); restore with the original serializer"
                    )
                migrate = True
        return migrate

    def registered_states(self) -> Mapping[str, StateMetaInfo]:
        """Every state with data in this backend (registered, or restored and not yet claimed)."""
        return dict(self._metas)

    def _check_row_key_group(self, key_group: int) -> int:
        kgi = key_group - self._kg_start
        if not 0 <= kgi < self._kg_count:
            raise KeyGroupOutOfRange(
                f"restored row of key group {key_group} is outside the range "
                f"{self.key_group_range} this backend owns: pass only the rows of this subtask's "
                "key groups "
                "(view.iter_entries(backend.key_group_range))"
            )
        return kgi

    def _prepare_restore(
        self, state_meta: Mapping[str, StateMetaInfo | Mapping[str, Any]]
    ) -> RestorePlan:
        """Per state name: (meta the rows were written with, meta the backend will hold)."""
        self._check_open()
        plan: dict[str, tuple[StateMetaInfo, StateMetaInfo]] = {}
        for name, raw in state_meta.items():
            written = StateMetaInfo.coerce(raw)
            current = self._metas.get(name)
            if current is None:
                self._metas[name] = written
                self._register_restored(written)
                current = written
            else:
                self._reconcile(written, current)
            plan[name] = (written, current)
        return plan

    @staticmethod
    def _unknown_state_row(name: str) -> StateError:
        return StateError(
            f"restored row names state {name!r}, which is not in the given state meta: pass the "
            "meta info of every state (registered_states() / the snapshot's _metadata)"
        )

    # --- abstract ---

    @abstractmethod
    def _create_state(
        self, descriptor: StateDescriptor, meta: StateMetaInfo, migrate_from: StateMetaInfo | None
    ) -> State: ...

    @abstractmethod
    def _register_restored(self, meta: StateMetaInfo) -> None:
        """Make room for the data of a restored state that no descriptor has claimed yet."""

    @abstractmethod
    def keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        """The keys that have a value in ``state_name`` under ``namespace`` (Flink's getKeys)."""

    @abstractmethod
    def snapshot_view(self, incremental: bool = False) -> KeyedStateView:
        """Fix a consistent point-in-time view (short, synchronous); read it from any thread.

        ``incremental``: the view also lists what changed since the last confirmed view
        (``view.changed()``); only backends that track changes support it.
        """

    def snapshot_strategy(self, format: SnapshotFormat) -> SnapshotStrategy | None:
        """The backend's own strategy for ``format``; None: it is written canonically (every
        backend can be). Raises InvalidSnapshotRequest if the backend cannot take the format."""
        return None

    def confirm_view(self, view_id: int) -> None:
        """The snapshot built from view ``view_id`` completed (no-op unless changes are tracked)."""
        return None

    def restore_entries(
        self,
        entries: Iterable[StateEntry],
        state_meta: Mapping[str, StateMetaInfo | Mapping[str, Any]],
    ) -> None:
        """Load canonical rows (any backend's export) into this backend."""
        self._restore_entries(self._prepare_restore(state_meta), entries)

    def restore_columns(
        self,
        columns: Iterable[StateColumns],
        state_meta: Mapping[str, StateMetaInfo | Mapping[str, Any]],
    ) -> None:
        """Load canonical rows given one state at a time, column by column (a restore's bulk
        path): the same as :meth:`restore_entries` of those rows."""
        self._restore_columns(self._prepare_restore(state_meta), columns)

    @abstractmethod
    def _restore_entries(self, plan: RestorePlan, entries: Iterable[StateEntry]) -> None:
        """Load rows written with the plan's metas (see :meth:`_prepare_restore`)."""

    def _restore_columns(self, plan: RestorePlan, columns: Iterable[StateColumns]) -> None:
        """:meth:`_restore_entries` of the columns' rows, unless a backend fills itself faster
        from columns."""
        self._restore_entries(plan, (entry for c in columns for entry in c.entries()))

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(
                f"{type(self).__name__} is closed: create a new backend (or restore one)"
            )

    def __enter__(self) -> KeyedStateBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
