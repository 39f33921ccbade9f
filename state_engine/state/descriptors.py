"""State descriptors: what a state is called, what it holds, how it is serialized, its TTL."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from typing import Any, Generic, TypeVar

from state_engine.errors import InvalidStateDescriptor
from state_engine.serde import TypeSerializer, get_serializer
from state_engine.state.ttl import StateTtlConfig

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class StateKind(Enum):
    VALUE = "VALUE"
    LIST = "LIST"
    MAP = "MAP"
    REDUCING = "REDUCING"
    AGGREGATING = "AGGREGATING"


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """Flink's AggregateFunction: folds inputs into an accumulator, then reads a result from it.

    ``add`` may mutate and return the accumulator it was given.
    """

    @abstractmethod
    def create_accumulator(self) -> ACC: ...

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC: ...

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT: ...

    @abstractmethod
    def merge(self, a: ACC, b: ACC) -> ACC: ...


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidStateDescriptor(
            f"state name {name!r} is not a non-empty str: name each state, e.g. 'count'"
        )
    if "\x00" in name or not name.isprintable():
        raise InvalidStateDescriptor(
            f"state name {name!r} holds a NUL or non-printable character: "
            "use printable characters only (the name becomes a column family and a column value)"
        )
    return name


def _serializer(spec: object, what: str, name: str) -> TypeSerializer:
    if spec is None:
        raise InvalidStateDescriptor(
            f"state {name!r} has no {what}: pass a serializer, a type such as str, or a name "
            "such as 'json'"
        )
    return get_serializer(spec)


class StateDescriptor:
    """Base of all descriptors; ``serializers`` maps role -> serializer."""

    kind: StateKind

    def __init__(self, name: str) -> None:
        self.name = _check_name(name)
        self.ttl_config: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> StateDescriptor:
        if not isinstance(ttl_config, StateTtlConfig):
            raise InvalidStateDescriptor(
                f"enable_time_to_live on state {self.name!r} needs a StateTtlConfig, got "
                f"{type(ttl_config).__name__}"
            )
        self.ttl_config = ttl_config
        return self

    @property
    def effective_ttl(self) -> StateTtlConfig | None:
        """The TTL config if TTL is on (``UpdateType.DISABLED`` turns it off), else None."""
        ttl = self.ttl_config
        return ttl if ttl is not None and ttl.enabled else None

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueStateDescriptor(StateDescriptor):
    kind = StateKind.VALUE

    def __init__(self, name: str, serializer: Any, default: Any = None) -> None:
        super().__init__(name)
        self.serializer = _serializer(serializer, "serializer", self.name)
        self.default = default

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        return {"value": self.serializer}


class ListStateDescriptor(StateDescriptor):
    kind = StateKind.LIST

    def __init__(self, name: str, element_serializer: Any) -> None:
        super().__init__(name)
        self.element_serializer = _serializer(element_serializer, "element serializer", self.name)

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        return {"value": self.element_serializer}


class MapStateDescriptor(StateDescriptor):
    kind = StateKind.MAP

    def __init__(self, name: str, key_serializer: Any, value_serializer: Any) -> None:
        super().__init__(name)
        self.key_serializer = _serializer(key_serializer, "map key serializer", self.name)
        self.value_serializer = _serializer(value_serializer, "map value serializer", self.name)

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        return {"user_key": self.key_serializer, "value": self.value_serializer}


class ReducingStateDescriptor(StateDescriptor):
    kind = StateKind.REDUCING

    def __init__(self, name: str, reduce_fn: Callable[[Any, Any], Any], serializer: Any) -> None:
        super().__init__(name)
        if not callable(reduce_fn):
            raise InvalidStateDescriptor(
                f"reducing state {self.name!r} needs a callable reduce_fn(a, b) -> value, got "
                f"{type(reduce_fn).__name__}"
            )
        self.reduce_fn = reduce_fn
        self.serializer = _serializer(serializer, "serializer", self.name)

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        return {"value": self.serializer}


class AggregatingStateDescriptor(StateDescriptor):
    kind = StateKind.AGGREGATING

    def __init__(
        self,
        name: str,
        aggregate_function: AggregateFunction[Any, Any, Any],
        accumulator_serializer: Any,
    ) -> None:
        super().__init__(name)
        if not isinstance(aggregate_function, AggregateFunction):
            raise InvalidStateDescriptor(
                f"aggregating state {self.name!r} needs an AggregateFunction instance, got "
                f"{type(aggregate_function).__name__}: subclass "
                "state_engine.state.AggregateFunction"
            )
        self.aggregate_function = aggregate_function
        self.accumulator_serializer = _serializer(
            accumulator_serializer, "accumulator serializer", self.name
        )

    @property
    def serializers(self) -> dict[str, TypeSerializer]:
        return {"value": self.accumulator_serializer}
