"""The heap keyed state backend: deserialized objects in plain dicts, one dict per key group.

Its state classes and their slot layout are in ``states.py``, its snapshot view in ``view.py``,
its restore of canonical rows in ``restore.py`` and its delta snapshots in ``snapshot.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from state_engine.backends.base import KeyedStateBackend, RestorePlan
from state_engine.backends.heap.restore import restore_columns, restore_entries
from state_engine.backends.heap.states import (
    STATE_CLASSES,
    HeapAggregatingState,
    HeapReducingState,
    HeapState,
    HeapValueState,
    StateSlots,
    exporter,
)
from state_engine.backends.heap.view import Epoch, HeapStateView
from state_engine.errors import InvalidSnapshotRequest, StateError
from state_engine.keygroups import KeyGroupRange
from state_engine.state.api import State
from state_engine.state.descriptors import StateDescriptor, StateKind
from state_engine.state.meta import StateColumns, StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE
from state_engine.state.ttl import Clock

if TYPE_CHECKING:
    from state_engine.backends.heap.snapshot import DeltaSnapshotStrategy
    from state_engine.snapshot.strategy import SnapshotStrategy
    from state_engine.snapshot_enums import SnapshotFormat


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
        self._exporters: dict[str, HeapState] = {}
        self._live_views = 0
        self.track_changes = bool(track_changes)
        self._dirty_of: dict[str, list[set[Any]]] = {}
        self._dirty_entries_of: dict[str, list[set[tuple[Any, Any]]]] = {}
        self._epochs: list[tuple[int, dict[str, Epoch]]] = []
        self._last_view_id = 0
        self._confirmed_view_id = 0
        self._delta: DeltaSnapshotStrategy | None = None

    def _new_slots(self, name: str, kind: StateKind) -> StateSlots:
        """The slots of state ``name``, made empty on its first registration."""
        if name not in self._tables_of:
            self._tables_of[name] = [{} for _ in range(2 * self._kg_count)]
            self._frozen_of[name] = set()
            if self.track_changes:
                self._dirty_of[name] = [set() for _ in range(2 * self._kg_count)]
                if kind is StateKind.MAP:
                    self._dirty_entries_of[name] = [set() for _ in range(2 * self._kg_count)]
        return StateSlots(
            self._tables_of[name],
            self._frozen_of[name],
            self._dirty_of.get(name),
            self._dirty_entries_of.get(name),
        )

    def _create_state(
        self, descriptor: StateDescriptor, meta: StateMetaInfo, migrate_from: StateMetaInfo | None
    ) -> State:
        # Objects are stored deserialized: a compatible serializer change needs no rewrite here.
        kind = meta.kind
        slots = self._new_slots(meta.name, kind)
        state: HeapState
        if kind is StateKind.VALUE:
            state = HeapValueState(self, meta, slots, descriptor.default)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        elif kind is StateKind.REDUCING:
            state = HeapReducingState(self, meta, slots, descriptor.reduce_fn)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        elif kind is StateKind.AGGREGATING:
            state = HeapAggregatingState(self, meta, slots, descriptor.aggregate_function)  # type: ignore[attr-defined]  # the descriptor's class matches meta.kind, checked at registration
        else:
            state = STATE_CLASSES[kind](self, meta, slots)
        self._exporters[meta.name] = state
        return state

    def _register_restored(self, meta: StateMetaInfo) -> None:
        slots = self._new_slots(meta.name, meta.kind)
        self._exporters[meta.name] = exporter(self, meta, slots)

    def keys(self, state_name: str, namespace: Any) -> Iterator[Any]:
        slots = self._slots_of(state_name)
        owned = self._kg_count
        if namespace is VOID_NAMESPACE:
            for table in slots[:owned]:
                yield from list(table)
        else:
            for table in slots[owned:]:
                for key, key_namespace in list(table):
                    if key_namespace == namespace:
                        yield key

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
            tables[name] = [table if table else {} for table in slots]
            frozen = self._frozen_of[name]
            frozen.update(slot for slot, table in enumerate(slots) if table)
            meta = self._metas[name]
            cleanup = meta.ttl is not None and meta.ttl.cleanup.full_snapshot
            now[name] = self.time_source(meta)() if cleanup else None
        self._last_view_id += 1
        view_id = self._last_view_id
        epochs = None
        if self.track_changes:
            self._close_epoch(view_id)
            if incremental:  # the changes after view ``since`` not confirmed yet
                epochs = [epoch for epoch in self._epochs if epoch[0] > since]
        self._live_views += 1
        return HeapStateView(
            dict(self._exporters),
            tables,
            now,
            view_id,
            epochs,
            self.key_group_range,
            self.key_serializer,
            self._release_view,
        )

    def _close_epoch(self, view_id: int) -> None:
        """Freeze the changes made since the previous view under ``view_id``; start new sets."""
        epoch: dict[str, Epoch] = {}
        for name, dirty in self._dirty_of.items():
            entries = self._dirty_entries_of.get(name)
            if any(dirty) or (entries is not None and any(entries)):
                epoch[name] = (list(dirty), None if entries is None else list(entries))
                for slot, keys in enumerate(dirty):
                    if keys:
                        dirty[slot] = set()
                for slot, changed in enumerate(entries or ()):
                    if changed:
                        entries[slot] = set()  # type: ignore[index]  # not None: enumerated
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
            self._epochs = [epoch for epoch in self._epochs if epoch[0] > view_id]

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

    def _restore_entries(self, plan: RestorePlan, entries: Iterable[StateEntry]) -> None:
        restore_entries(self, self._exporters, plan, entries)

    def _restore_columns(self, plan: RestorePlan, columns: Iterable[StateColumns]) -> None:
        """Each distinct value decoded once where that is safe (see ``restore.py``)."""
        restore_columns(self, self._exporters, plan, columns)

    def close(self) -> None:
        self._tables_of.clear()
        self._dirty_of.clear()
        self._dirty_entries_of.clear()
        self._epochs.clear()
        super().close()
