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
