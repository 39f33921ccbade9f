"""The user-facing API of a keyed operator, as Flink's ``KeyedProcessFunction``.

A job's function is copied once per subtask; ``open`` registers its state through the
:class:`RuntimeContext`, ``process`` handles one record of the current key, ``on_timer`` one timer
of the current key. Timers are keyed state: they are checkpointed with the key's state, move with
its key group when the job is rescaled, and fire after a restore.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from state_engine.keygroups import KeyGroupRange
from state_engine.state.descriptors import StateDescriptor


class TimeDomain(Enum):
    EVENT_TIME = "EVENT_TIME"
    PROCESSING_TIME = "PROCESSING_TIME"


class TimerService(ABC):
    """Timers of the current key, and the operator's notion of time."""

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer(timestamp)`` once the watermark reaches ``timestamp``; registering the
        same (key, timestamp) twice keeps one timer."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None:
        """Fire ``on_timer(timestamp)`` once processing time reaches ``timestamp``."""

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None: ...

    @abstractmethod
    def current_watermark(self) -> int: ...

    @abstractmethod
    def current_processing_time(self) -> int: ...


class RuntimeContext(ABC):
    """What ``open`` gets: state registration and where this subtask sits in the job."""

    operator_uid: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    key_group_range: KeyGroupRange

    @abstractmethod
    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state for ``descriptor`` (Value/List/Map/Reducing/AggregatingState),
        scoped to the current key of each call."""


class Context(ABC):
    """What ``process`` and ``on_timer`` get for the record or timer at hand."""

    @property
    @abstractmethod
    def current_key(self) -> Any: ...

    @property
    @abstractmethod
    def timestamp(self) -> int:
        """The record's event timestamp (in ``on_timer``: the timer's timestamp)."""

    @property
    @abstractmethod
    def timer_service(self) -> TimerService: ...

    @property
    @abstractmethod
    def time_domain(self) -> TimeDomain | None:
        """In ``on_timer``: which kind of timer fired; None in ``process``."""

    @abstractmethod
    def output(self, value: Any) -> None:
        """Emit ``value`` to the sink; it becomes visible when the next checkpoint completes."""


class KeyedProcessFunction(ABC):
    """Process the records of a keyed stream, one key at a time, with keyed state and timers."""

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 (optional hook)
        """Register state here (``self.count = ctx.get_state(ValueStateDescriptor(...))``)."""

    @abstractmethod
    def process(self, record: Any, ctx: Context) -> None: ...

    def on_timer(self, timestamp: int, ctx: Context) -> None:  # noqa: B027 (optional hook)
        """A timer of ``ctx.current_key`` fired."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what ``open`` acquired outside state (not called when a job is killed)."""
