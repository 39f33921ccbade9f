"""The user-facing state interfaces; each backend in ``state_engine.backends`` implements them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any


class State(ABC):
    """State scoped to the backend's current key and this object's current namespace."""

    name: str

    @abstractmethod
    def clear(self) -> None:
        """Remove the value of the current key and namespace."""

    @abstractmethod
    def set_current_namespace(self, namespace: Any) -> None:
        """Scope later calls to ``namespace`` (a window, say); VOID_NAMESPACE is the default."""


class ValueState(State):
    @abstractmethod
    def value(self) -> Any:
        """The value, or the descriptor's default when there is none (or it expired)."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Set the value; ``update(None)`` clears it (as in Flink)."""


class ListState(State):
    @abstractmethod
    def get(self) -> list[Any]:
        """A copy of the elements in insertion order (an empty list when there are none)."""

    @abstractmethod
    def add(self, value: Any) -> None: ...

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None: ...

    @abstractmethod
    def update(self, values: Iterable[Any] | None) -> None:
        """Replace the elements; an empty iterable or None clears the list."""


class MapState(State):
    @abstractmethod
    def get(self, key: Any) -> Any: ...

    @abstractmethod
    def put(self, key: Any, value: Any) -> None: ...

    @abstractmethod
    def put_all(self, entries: Mapping[Any, Any]) -> None: ...

    @abstractmethod
    def remove(self, key: Any) -> None: ...

    @abstractmethod
    def contains(self, key: Any) -> bool: ...

    @abstractmethod
    def keys(self) -> list[Any]: ...

    @abstractmethod
    def values(self) -> list[Any]: ...

    @abstractmethod
    def items(self) -> list[tuple[Any, Any]]: ...

    @abstractmethod
    def is_empty(self) -> bool: ...


class ReducingState(State):
    @abstractmethod
    def get(self) -> Any:
        """The reduced value, or None."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Fold ``value`` in with the descriptor's reduce function."""


class AggregatingState(State):
    @abstractmethod
    def get(self) -> Any:
        """The aggregate function's result for the accumulator, or None when nothing was added."""

    @abstractmethod
    def add(self, value: Any) -> None: ...
