"""Watermarks: bounded out-of-orderness per partition, min over partitions, idle and finished."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.checkpoint import HeapBackendFactory
from state_engine.runtime import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    CollectedOutput,
    CollectSink,
    Context,
    GeneratorSource,
    Job,
    JobRunner,
    KeyedProcessFunction,
    WatermarkStrategy,
)
from state_engine.runtime.watermarks import PartitionWatermarks


def test_min_over_partitions_and_finished_partitions_do_not_hold_back() -> None:
    w = PartitionWatermarks(max_out_of_orderness_ms=10)
    w.add_partition("a")
    w.add_partition("b")
    w.on_record("a", 100)
    assert w.current == MIN_WATERMARK  # b has produced nothing yet
    w.on_record("b", 50)
    assert w.current == 39  # 50 - 10 - 1
    w.on_record("b", 40)  # out of order: the watermark never goes back
    assert w.current == 39
    w.on_record("b", 500)
    assert w.current == 89
    w.finish("a")
    assert w.current == 489
    w.finish("b")
    assert w.idle and w.current == MAX_WATERMARK


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 10_000)), max_size=60))
def test_watermark_is_min_of_per_partition_max_minus_bound(events: list[tuple[str, int]]) -> None:
    w = PartitionWatermarks(max_out_of_orderness_ms=3)
    for p in "abc":
        w.add_partition(p)
    highest: dict[str, int] = {}
    last = MIN_WATERMARK
    for p, ts in events:
        w.on_record(p, ts)
        highest[p] = max(highest.get(p, ts), ts)
        expected = min(highest[q] - 4 for q in "abc") if len(highest) == 3 else MIN_WATERMARK
        assert w.current == expected
        assert w.current >= last
        last = w.current


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abc"), st.just(0)),
        st.tuples(st.just("record"), st.sampled_from("abc"), st.integers(0, 1_000)),
        st.tuples(st.just("finish"), st.sampled_from("abc"), st.just(0)),
        st.tuples(st.just("read"), st.just(""), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_watermark_matches_a_model_as_partitions_come_and_go(
    steps: list[tuple[str, str, int]],
) -> None:
    # A model of the rule: minimum over active partitions of (highest timestamp - bound - 1).
    # Reads are interleaved at random, so the cached minimum is read both fresh and stale, with
    # one active partition (its own fast path) and with several.
    w = PartitionWatermarks(max_out_of_orderness_ms=2)
    marks: dict[str, int] = {}
    finished: set[str] = set()

    def model() -> int:
        if not marks:  # before any partition event time has not started; after all, it ended
            return MAX_WATERMARK if finished else MIN_WATERMARK
        return min(marks.values())

    for op, p, ts in steps:
        if op == "add" and p not in finished:
            w.add_partition(p)
            marks.setdefault(p, MIN_WATERMARK)
        elif op == "record" and p in marks:
            w.on_record(p, ts)
            marks[p] = max(marks[p], ts - 3)
        elif op == "finish" and p in marks:
            w.finish(p)
            del marks[p]
            finished.add(p)
        elif op == "read":
            assert w.current == model()
    assert w.current == model()
    assert w.idle == (not marks)


#: (partition, index, timestamp, watermark seen) of every record, in the order processed
_SEEN: list[tuple[int, int, int, int]] = []
#: the timestamps of the example at hand, per partition and index
_TABLE: list[list[int]] = []


class _SeesWatermark(KeyedProcessFunction):
    def process(self, record: Any, ctx: Context) -> None:
        _SEEN.append(
            (record["p"], record["i"], record["ts"], ctx.timer_service.current_watermark())
        )


def _stamped(p: int, i: int, rng: random.Random) -> dict[str, Any]:
    return {"p": p, "i": i, "ts": _TABLE[p][i]}


@st.composite
def _stamp_tables(draw: Any) -> list[list[int]]:
    parts, size = draw(st.integers(1, 5)), draw(st.integers(1, 10))
    row = st.lists(st.integers(0, 300), min_size=size, max_size=size)
    return draw(st.lists(row, min_size=parts, max_size=parts))


@settings(max_examples=80, deadline=None)
@given(table=_stamp_tables(), parallelism=st.integers(1, 3), bound=st.integers(0, 20))
def test_each_record_sees_the_minimum_over_partitions_of_what_was_read_before_it(
    table: list[list[int]], parallelism: int, bound: int
) -> None:
    # The job's watermark is the minimum over source subtasks of each one's minimum over its
    # partitions; the runner re-reads only the subtask whose record moved it. A record sees the
    # watermark of every record read before it (out of order, several partitions per subtask,
    # subtasks without partitions). Partitions are of one length, so none has finished while
    # another still has records: the model needs no end-of-partition timing.
    _TABLE[:] = table
    _SEEN.clear()
    source = GeneratorSource(
        len(table),
        len(table[0]),
        _stamped,
        watermarks=WatermarkStrategy("ts", max_out_of_orderness_ms=bound),
    )
    job = Job(
        "watermarks",
        source,
        lambda r: f"{r['p']}-{r['i']}",
        _SeesWatermark(),
        CollectSink(CollectedOutput()),
        parallelism=parallelism,
        backend=HeapBackendFactory(),
    )
    with JobRunner(job) as runner:
        runner.run()
    assert sorted((p, i) for p, i, _, _ in _SEEN) == [
        (p, i) for p in range(len(table)) for i in range(len(table[0]))
    ]
    highest: dict[int, int] = {}
    left = {p: len(row) for p, row in enumerate(table)}
    for p, _i, ts, seen in _SEEN:
        if all(left.values()):  # no partition can have ended yet
            expected = (
                min(highest.values()) - bound - 1 if len(highest) == len(table) else MIN_WATERMARK
            )
            assert seen == expected
        highest[p] = max(highest.get(p, ts), ts)
        left[p] -= 1
