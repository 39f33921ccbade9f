"""Watermarks: bounded out-of-orderness per partition, min over partitions, idle and finished."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.runtime import MAX_WATERMARK, MIN_WATERMARK
from state_engine.runtime.watermarks import PartitionWatermarks, combined_watermark


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


def test_idle_subtasks_are_ignored_downstream() -> None:
    busy, idle = PartitionWatermarks(0), PartitionWatermarks(0)
    busy.add_partition("p")
    busy.on_record("p", 7)
    assert idle.idle
    assert combined_watermark([busy, idle]) == 6
    busy.finish("p")
    assert combined_watermark([busy, idle]) == MAX_WATERMARK


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
