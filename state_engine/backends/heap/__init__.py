"""The heap keyed state backend: its state classes, its view, its factory and its delta snapshots.

``snapshot`` (the delta strategy, which needs pyarrow) loads on the first delta snapshot.
"""

from state_engine.backends.heap.backend import (
    HeapAggregatingState,
    HeapKeyedStateBackend,
    HeapListState,
    HeapMapState,
    HeapReducingState,
    HeapStateView,
    HeapValueState,
)
from state_engine.backends.heap.factory import HeapBackendFactory

__all__ = [
    "HeapAggregatingState",
    "HeapBackendFactory",
    "HeapKeyedStateBackend",
    "HeapListState",
    "HeapMapState",
    "HeapReducingState",
    "HeapStateView",
    "HeapValueState",
]
