"""Keyed state: descriptors, the state interfaces, TTL, namespaces and the canonical row."""

from state_engine.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    State,
    ValueState,
)
from state_engine.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from state_engine.state.meta import StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE, NamespaceSerializer, VoidNamespace
from state_engine.state.ttl import (
    CleanupStrategies,
    Clock,
    ManualClock,
    StateTtlConfig,
    StateVisibility,
    SystemClock,
    TtlTimeDomain,
    UpdateType,
)

__all__ = [
    "VOID_NAMESPACE",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "CleanupStrategies",
    "Clock",
    "ListState",
    "ListStateDescriptor",
    "ManualClock",
    "MapState",
    "MapStateDescriptor",
    "NamespaceSerializer",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateEntry",
    "StateKind",
    "StateMetaInfo",
    "StateTtlConfig",
    "StateVisibility",
    "SystemClock",
    "TtlTimeDomain",
    "UpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "VoidNamespace",
]
