"""Timers: keyed state, ordered firing, dedup and delete, and re-firing after a state move."""

from __future__ import annotations

from typing import Any

import pytest

from state_engine.backends.base import KeyedStateBackend
from state_engine.errors import InvalidJob
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.runtime import (
    Context,
    KeyedProcessFunction,
    KeyedProcessOperator,
    RecordTimestampClock,
    RuntimeContext,
    TimeDomain,
)
from state_engine.runtime.timers import EVENT_TIMERS, PROCESSING_TIMERS
from state_engine.state import ManualClock, ValueStateDescriptor

MAX_P = 128


class Timed(KeyedProcessFunction):
    """Records are commands: ("event", ts) registers, ("del", ts) deletes, ("proc", ts)."""

    def open(self, ctx: RuntimeContext) -> None:
        self.fired = ctx.get_state(ValueStateDescriptor("fired", int, default=0))

    def process(self, record: Any, ctx: Context) -> None:
        op, ts = record
        ts_ = ctx.timer_service
        {
            "event": ts_.register_event_time_timer,
            "del": ts_.delete_event_time_timer,
            "proc": ts_.register_processing_time_timer,
            "delproc": ts_.delete_processing_time_timer,
        }[op](ts)

    def on_timer(self, timestamp: int, ctx: Context) -> None:
        self.fired.update(self.fired.value() + 1)
        ctx.output((ctx.current_key, timestamp, ctx.time_domain.value))  # type: ignore[union-attr]  # a timer firing has a time domain
        if ctx.time_domain is TimeDomain.EVENT_TIME and timestamp % 10 == 5:
            # a timer registered while firing, already due: it fires in the same advance
            ctx.timer_service.register_event_time_timer(timestamp + 1)


def make_op(backend: KeyedStateBackend, out: list[Any], clock: Any = None) -> KeyedProcessOperator:
    return KeyedProcessOperator(
        "op", 0, 1, Timed(), backend, clock or RecordTimestampClock(), out.append
    )


def new_backend(factory: Any, p: int = 1, i: int = 0) -> KeyedStateBackend:
    kgr = compute_key_group_range_for_operator_index(MAX_P, p, i)
    return factory.create("op", i, str, MAX_P, kgr, None)


def test_event_timers_fire_in_order_once_and_deleted_ones_never(factory: Any) -> None:
    out: list[Any] = []
    op = make_op(new_backend(factory), out)
    for key, cmd in [
        ("b", ("event", 30)),
        ("a", ("event", 30)),
        ("a", ("event", 10)),
        ("a", ("event", 10)),  # same key and time: one timer
        ("c", ("event", 20)),
        ("c", ("del", 20)),
        ("c", ("event", 25)),
        ("d", ("event", 15)),
    ]:
        op.process(key, cmd, 0)
    op.advance_watermark(9)
    assert out == []
    op.advance_watermark(29)
    assert out == [("a", 10, "EVENT_TIME"), ("d", 15, "EVENT_TIME"), ("d", 16, "EVENT_TIME"),
                   ("c", 25, "EVENT_TIME"), ("c", 26, "EVENT_TIME")]  # fmt: skip
    op.advance_watermark(30)
    assert out[5:] == [("a", 30, "EVENT_TIME"), ("b", 30, "EVENT_TIME")]
    op.advance_watermark(1000)
    assert len(out) == 7 and op.timers_fired == 7
    view = op.backend.snapshot_view()
    assert not [e for e in view.iter_entries() if e.state == EVENT_TIMERS]
    view.release()


def test_processing_timers_follow_the_clock(factory: Any) -> None:
    out: list[Any] = []
    clock = ManualClock(0)
    op = make_op(new_backend(factory), out, clock)
    op.process("k", ("proc", 100), 0)
    op.process("k", ("proc", 50), 0)
    op.process("j", ("proc", 70), 0)
    op.process("j", ("delproc", 70), 0)
    clock.set(60)
    op.fire_processing_timers()
    assert out == [("k", 50, "PROCESSING_TIME")]
    clock.set(100)
    op.fire_processing_timers()
    assert out[1:] == [("k", 100, "PROCESSING_TIME")]


def test_timers_move_with_their_key_groups_and_refire_after_restore(factory: Any) -> None:
    """Timers registered at parallelism 1 land, through the canonical rows, on the subtasks of
    parallelism 3 that own their keys, and fire there."""
    out: list[Any] = []
    source = new_backend(factory)
    op = make_op(source, out)
    keys = [f"user-{i}" for i in range(40)]
    for n, key in enumerate(keys):
        op.process(key, ("event", 101 + 10 * n), 0)
        op.process(key, ("proc", 500 + n), 0)
    op.advance_watermark(191)  # ten fire before the "checkpoint"
    assert len(out) == 10
    with source.snapshot_view() as view:
        rows = list(view.iter_entries())
        meta = dict(view.states)
    assert {e.state for e in rows} >= {EVENT_TIMERS, PROCESSING_TIMERS}
    refired: list[Any] = []
    ops = []
    for i in range(3):
        backend = new_backend(factory, 3, i)
        backend.restore_entries((e for e in rows if e.key_group in backend.key_group_range), meta)
        ops.append(make_op(backend, refired))
    for o in ops:
        o.advance_watermark(10_000)
    expected = [(k, 101 + 10 * n, "EVENT_TIME") for n, k in enumerate(keys)][10:]
    assert sorted(refired) == sorted(expected)
    clock = RecordTimestampClock()
    clock.observe(10_000)
    for o in ops:
        o.clock = clock
        o.fire_processing_timers()
    assert len(refired) == 30 + 40


def test_reserved_state_names_and_bad_timestamps(factory: Any) -> None:
    class Sneaky(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            ctx.get_state(ValueStateDescriptor("_timers.event", int))

        def process(self, record: Any, ctx: Context) -> None: ...

    with pytest.raises(InvalidJob, match="keeps for timers"):
        KeyedProcessOperator(
            "op", 0, 1, Sneaky(), new_backend(factory), RecordTimestampClock(), print
        )
    op = make_op(new_backend(factory), [])
    with pytest.raises(InvalidJob, match="int of epoch ms"):
        op.process("k", ("event", 1.5), 0)
