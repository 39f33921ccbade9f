"""The heap keyed state backend: its state classes, its view, its restore, its factory and its
delta snapshots.

``snapshot`` (the delta strategy) loads on the first delta snapshot.
"""

from state_engine.backends.heap.backend import HeapKeyedStateBackend
from state_engine.backends.heap.factory import HeapBackendFactory
from state_engine.backends.heap.states import (
    HeapAggregatingState,
    HeapListState,
    HeapMapState,
    HeapReducingState,
    HeapValueState,
)
from state_engine.backends.heap.view import HeapStateView

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
