"""One subtask of a keyed process operator: its keyed backend, its function, its timers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from state_engine.backends.base import KeyedStateBackend
from state_engine.errors import InvalidJob
from state_engine.keygroups import KeyGroupRange
from state_engine.runtime.clock import RecordDrivenClock
from state_engine.runtime.functions import (
    Context,
    KeyedProcessFunction,
    RuntimeContext,
    TimeDomain,
    TimerService,
)
from state_engine.runtime.timers import RESERVED_PREFIX, InternalTimerService
from state_engine.runtime.watermarks import MIN_WATERMARK
from state_engine.state.descriptors import StateDescriptor
from state_engine.state.ttl import Clock


class _RuntimeContext(RuntimeContext):
    def __init__(self, op: KeyedProcessOperator, parallelism: int) -> None:
        self._backend = op.backend
        self.operator_uid = op.uid
        self.subtask_index = op.subtask_index
        self.parallelism = parallelism
        self.max_parallelism = op.backend.max_parallelism
        self.key_group_range: KeyGroupRange = op.backend.key_group_range

    def get_state(self, descriptor: StateDescriptor) -> Any:
        name = getattr(descriptor, "name", "")
        if isinstance(name, str) and name.startswith(RESERVED_PREFIX):
            raise InvalidJob(
                f"state name {name!r} starts with {RESERVED_PREFIX!r}, which the runtime keeps for "
                "timers: pick another name"
            )
        return self._backend.get_state(descriptor)


class _Context(Context, TimerService):
    """One mutable object per subtask, re-aimed at each record and timer (no allocation)."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op
        self._timers = op.timers
        self._key: Any = None
        self._ts = 0
        self._domain: TimeDomain | None = None

    # Context
    @property
    def current_key(self) -> Any:
        return self._key

    @property
    def timestamp(self) -> int:
        return self._ts

    @property
    def timer_service(self) -> TimerService:
        return self

    @property
    def time_domain(self) -> TimeDomain | None:
        return self._domain

    def output(self, value: Any) -> None:
        self._op.emit(value)

    # TimerService
    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers.event.register(self._key, _check_ts(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers.processing.register(self._key, _check_ts(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers.event.delete(_check_ts(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._timers.processing.delete(_check_ts(timestamp))

    def current_watermark(self) -> int:
        return self._op.watermark

    def current_processing_time(self) -> int:
        return self._op.clock.now_ms()


def _check_ts(timestamp: object) -> int:
    if type(timestamp) is not int:
        raise InvalidJob(f"a timer timestamp must be an int of epoch ms, got {timestamp!r}")
    return timestamp


class KeyedProcessOperator:
    """Runs ``function`` over the records routed to this subtask's key-group range."""

    def __init__(
        self,
        uid: str,
        subtask_index: int,
        parallelism: int,
        function: KeyedProcessFunction,
        backend: KeyedStateBackend,
        clock: Clock,
        emit: Callable[[Any], None],
    ) -> None:
        self.uid = uid
        self.subtask_index = subtask_index
        self.function = function
        self.backend = backend
        self.clock = clock
        self._observe = clock.observe if isinstance(clock, RecordDrivenClock) else None
        self.emit = emit
        self.watermark = MIN_WATERMARK
        self.timers = InternalTimerService(backend)
        self._ctx = _Context(self)
        self.timers_fired = 0
        function.open(_RuntimeContext(self, parallelism))
        # Bound once, after open() registered the states (the backend may have specialised its
        # set_current_key by then); a later rebinding is equivalent (see the backend).
        self._set_key = backend.set_current_key
        self._process = function.process

    def process(self, key: Any, record: Any, timestamp: int) -> None:
        self._set_key(key)
        if self._observe is not None:
            self._observe(timestamp)
        ctx = self._ctx
        ctx._key = key
        ctx._ts = timestamp
        ctx._domain = None
        self._process(record, ctx)

    def advance_watermark(self, watermark: int) -> None:
        """Fire the event-time timers the watermark passed (Flink fires ``ts <= watermark``)."""
        if watermark <= self.watermark:
            return
        self.watermark = watermark
        # TTL in the event-time domain reads the backend's watermark: move it before any timer.
        self.backend.advance_watermark(watermark)
        queue = self.timers.event
        head = queue.head()
        if head is not None and head <= watermark:
            self.timers_fired += queue.fire_until(watermark, self._fire_event)

    def fire_processing_timers(self) -> None:
        queue = self.timers.processing
        head = queue.head()
        if head is not None:
            now = self.clock.now_ms()
            if head <= now:
                self.timers_fired += queue.fire_until(now, self._fire_processing)

    def _fire_event(self, key: Any, ts: int) -> None:
        if self._observe is not None:
            self._observe(ts)
        ctx = self._ctx
        ctx._key, ctx._ts, ctx._domain = key, ts, TimeDomain.EVENT_TIME
        self.function.on_timer(ts, ctx)

    def _fire_processing(self, key: Any, ts: int) -> None:
        ctx = self._ctx
        ctx._key, ctx._ts, ctx._domain = key, ts, TimeDomain.PROCESSING_TIME
        self.function.on_timer(ts, ctx)

    def close(self) -> None:
        self.function.close()
