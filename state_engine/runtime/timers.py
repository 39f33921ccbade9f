"""Timers kept as keyed state, as Flink's ``InternalTimerService`` with state-backed queues.

Each timer is an entry of an internal MapState of its key (timestamp -> True), one state per time
domain, so timers are in every snapshot, are re-split by key group on rescale and come back with a
restore. A heap ordered by (timestamp, serialized key) decides what fires next: deterministic, and
rebuilt from the state when a subtask starts. Deleting a timer only removes its state entry; the
heap entry is skipped when it surfaces.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from state_engine.backends.base import KeyedStateBackend
from state_engine.runtime.functions import TimeDomain
from state_engine.state.api import MapState
from state_engine.state.descriptors import MapStateDescriptor
from state_engine.state.namespace import VOID_NAMESPACE

#: State names starting with this are the runtime's; a function cannot register them.
RESERVED_PREFIX = "_timers."
EVENT_TIMERS = RESERVED_PREFIX + "event"
PROCESSING_TIMERS = RESERVED_PREFIX + "processing"


class _TimerQueue:
    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._backend = backend
        self.state: MapState = backend.get_state(MapStateDescriptor(name, int, bool))
        self._heap: list[tuple[int, bytes, Any]] = []
        self._key_bytes = backend.key_serializer.serialize
        self.name = name
        for key in list(backend.keys(name, VOID_NAMESPACE)):
            backend.set_current_key(key)
            kb = self._key_bytes(key)
            for ts, _ in self.state.items():
                self._heap.append((ts, kb, key))
        heapq.heapify(self._heap)

    def register(self, key: Any, timestamp: int) -> None:
        """Register for the backend's current key (which is ``key``)."""
        if not self.state.contains(timestamp):
            self.state.put(timestamp, True)
            heapq.heappush(self._heap, (timestamp, self._key_bytes(key), key))

    def delete(self, timestamp: int) -> None:
        self.state.remove(timestamp)

    def head(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def fire_until(self, limit: int, fire: Callable[[Any, int], None]) -> int:
        """Fire every timer with timestamp <= ``limit`` in order, timers that firing registers
        included; ``fire(key, ts)`` runs with the key already current. Returns how many fired."""
        heap, backend, state = self._heap, self._backend, self.state
        fired = 0
        while heap and heap[0][0] <= limit:
            ts, _, key = heapq.heappop(heap)
            backend.set_current_key(key)
            if not state.contains(ts):
                continue  # deleted, or a duplicate heap entry of one already fired
            state.remove(ts)
            fired += 1
            fire(key, ts)
        return fired

    def __len__(self) -> int:
        return len(self._heap)


class InternalTimerService:
    """Event- and processing-time timers of one keyed operator subtask."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.event = _TimerQueue(backend, EVENT_TIMERS)
        self.processing = _TimerQueue(backend, PROCESSING_TIMERS)

    def queue(self, domain: TimeDomain) -> _TimerQueue:
        return self.event if domain is TimeDomain.EVENT_TIME else self.processing
