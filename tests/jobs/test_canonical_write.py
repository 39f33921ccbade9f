"""Spark tasks write canonical files, the driver commits: planning the write ranges, running the
tasks."""

from __future__ import annotations

import pytest

from state_engine.errors import InvalidJobParams, SparkTaskFailed
from state_engine.jobs.canonical_write import run_range_tasks
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.maintenance.ranges import plan_write_ranges


@pytest.mark.parametrize("max_p,p,tasks", [(128, 1, 4), (128, 3, 4), (128, 3, 7), (7, 7, 100)])
def test_write_ranges_tile_each_subtask_range(max_p, p, tasks):
    ranges = plan_write_ranges(max_p, p, ["a", "b"], tasks)
    for op in ("a", "b"):
        mine = [r for r in ranges if r.operator == op]
        assert [k for r in mine for k in range(r.first, r.last + 1)] == list(range(max_p))
        for index in range(p):
            rng = compute_key_group_range_for_operator_index(max_p, p, index)
            parts = [r for r in mine if r.subtask == index]
            assert (parts[0].first, parts[-1].last) == (rng.start, rng.end)
    assert len(ranges) >= min(tasks, 2 * max_p)


def test_plan_refuses_bad_parallelism():
    with pytest.raises(InvalidJobParams):
        plan_write_ranges(8, 9, ["a"])
    with pytest.raises(InvalidJobParams):
        plan_write_ranges(8, 2, [])


@pytest.mark.spark
def test_run_range_tasks_returns_results_in_task_order(spark):
    assert run_range_tasks(spark, list(range(5)), lambda x: x * x) == [0, 1, 4, 9, 16]
    assert run_range_tasks(spark, [], lambda x: x) == []


@pytest.mark.spark
def test_a_failing_task_is_raised_only_after_its_siblings_stopped_writing(spark, tmp_path):
    # Task 0 fails at once; task 1 is still writing when it does. The caller cleans up its
    # output as soon as the error reaches it, so the error must not arrive before task 1 ends.
    failed, late = tmp_path / "failed", tmp_path / "late"

    def task(i: int) -> int:
        if i == 0:
            failed.touch()
            raise OSError("disk full")
        for _ in range(600_000):  # until task 0 has failed (bounded: ~a minute)
            if failed.exists():
                break
        late.mkdir()
        for n in range(2000):  # a sibling that keeps writing for a while after the failure
            (late / f"part-{n}").write_bytes(b"x" * 512)
        return i

    with pytest.raises(SparkTaskFailed, match=r"task 0 of 2 \(0\) failed: OSError: disk full"):
        run_range_tasks(spark, [0, 1], task)
    assert len(list(late.iterdir())) == 2000
