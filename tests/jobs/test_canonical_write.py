"""Spark tasks write canonical files, the driver commits: planning, both feeding paths."""

from __future__ import annotations

import pytest

from state_engine.checkpoint.canonical import read_entries
from state_engine.checkpoint.metadata import read_metadata, verify
from state_engine.errors import InvalidJobParams, SparkTaskFailed
from state_engine.jobs.canonical_write import (
    TargetSpec,
    plan_write_ranges,
    run_range_tasks,
    write_frame,
)
from state_engine.jobs.commit import begin_output, build_metadata, commit_output
from state_engine.jobs.inputs import load_input
from state_engine.jobs.spark import spark_url
from state_engine.keygroups import compute_key_group_range_for_operator_index
from tests.jobs.jobdata import MAX_P, OP


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


@pytest.mark.spark
def test_write_frame_rebuckets_a_dataframe_into_a_committed_snapshot(
    spark, catalog, storage, snapshot
):
    inp = load_input(catalog, snapshot.record.id)
    # rows in no particular order, as any Spark computation would hand them over
    snap = inp.snapshot
    urls = [spark_url(snap.fs.unstrip_protocol(snap.resolve(f.path))) for f in inp.keyed_files(OP)]
    df = spark.read.parquet(*urls).orderBy("value")
    out = begin_output(
        catalog, storage, "orders", kind="SAVEPOINT", parallelism=3, max_parallelism=MAX_P,
        tag="test",
    )  # fmt: skip
    ranges = plan_write_ranges(MAX_P, 3, [OP], 5)
    outputs = write_frame(df, out.target(row_group_bytes=2048), ranges, operator=OP)
    assert [o.range for o in outputs] == ranges
    record = commit_output(catalog, out, build_metadata(out, inp.meta, outputs), outputs)
    assert record.status == "COMPLETED" and record.entries == len(snapshot.rows)
    meta = read_metadata(out.snapshot)
    verify(out.snapshot, meta, deep=True)
    assert meta.parallelism == 3
    got = list(read_entries(out.snapshot, meta, (0, MAX_P - 1), operator=OP))
    assert sorted(got) == sorted(snapshot.rows)
    assert [r.key_group for r in got] == sorted(r.key_group for r in got)
    # a restore at the new parallelism reads each subtask's own key groups
    for st in meta.operator(OP).subtasks:
        first, last = st.key_group_range
        part = list(read_entries(out.snapshot, meta, (first, last), operator=OP))
        assert sorted(part) == sorted(r for r in snapshot.rows if first <= r.key_group <= last)


@pytest.mark.spark
def test_write_frame_refuses_ranges_it_cannot_route(spark, tmp_path):
    ranges = plan_write_ranges(MAX_P, 2, [OP], 1)
    target = TargetSpec((tmp_path / "out").as_uri(), MAX_P)
    df = spark.createDataFrame([], "key_group int")
    with pytest.raises(InvalidJobParams, match="equal pieces"):
        write_frame(df, target, [ranges[1], ranges[0]], operator=OP)
    with pytest.raises(InvalidJobParams, match="equal pieces"):
        write_frame(df, target, ranges, operator="other")
