"""The runner without checkpoints: routing, determinism across parallelism and backends, file
sources into a file sink, kills, and job validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.errors import InvalidJob, JobError
from state_engine.keygroups import assign_to_key_group
from state_engine.runtime import (
    CollectedOutput,
    Context,
    FileSink,
    Job,
    JobRunner,
    JsonlSource,
    KeyedProcessFunction,
    ParquetSource,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.state import ValueStateDescriptor
from tests.runtime.sk_runtime_jobs import (
    expected_output,
    multiset,
    proof_job,
    state_set,
)


def test_output_and_state_do_not_depend_on_parallelism_or_backend(tmp_path: Path) -> None:

    runs = {}
    for p, backend in [
        (1, HeapBackendFactory()),
        (2, RocksDBBackendFactory(tmp_path / "2")),
        (3, HeapBackendFactory()),
        (4, RocksDBBackendFactory(tmp_path / "4")),
    ]:
        out = CollectedOutput()
        with JobRunner(proof_job(p, backend, out)) as runner:
            result = runner.run()
            runs[p] = (multiset(out.records), state_set(runner.state_entries()), result)
    reference_out, reference_state, first = runs[1]
    assert reference_out == expected_output(4, 150)  # the runtime computes what a model does
    assert first.records_in == 600 and first.late_records == 0 and first.finished
    assert first.timers_fired == sum(1 for r in reference_out.elements() if '"bucket"' in r)
    states = {s[2] for s in reference_state}
    assert {"count", "per_category", "recent", "last_seen", "returns"} <= states
    assert "_timers.event" not in states  # the max watermark at end of input fired them all
    for p in (2, 3, 4):
        assert runs[p][0] == reference_out, p
        assert runs[p][1] == reference_state, p


def test_each_record_is_processed_by_the_subtask_owning_its_key_group() -> None:
    class Where(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.ctx = ctx
            self.seen = ctx.get_state(ValueStateDescriptor("seen", int, default=0))

        def process(self, record: Any, ctx: Context) -> None:
            kg = assign_to_key_group(ctx.current_key, self.ctx.max_parallelism)
            self.seen.update(self.seen.value() + 1)
            ctx.output([ctx.current_key, kg, self.ctx.subtask_index, self.ctx.key_group_range.start,
                        self.ctx.key_group_range.end])  # fmt: skip

    out = CollectedOutput()
    job = proof_job(3, None, out).with_(process_function=Where, max_parallelism=32)
    JobRunner(job).run()
    assert len(out.records) == 600
    for _key, kg, subtask, start, end in out.records:
        assert start <= kg <= end and subtask == kg * 3 // 32
    assert {r[2] for r in out.records} == {0, 1, 2}


def test_file_sources_into_a_file_sink(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    rows: list[dict[str, Any]] = [{"k": f"k{i % 5}", "v": i, "ts": 1000 + i} for i in range(60)]
    for part in range(3):
        chunk = rows[part::3]
        if part == 0:
            lines = [json.dumps(r) for r in chunk]
            lines.insert(4, "{broken")
            (src / "p0.jsonl").write_text("\n".join(lines) + "\n")
        else:
            pq.write_table(pa.Table.from_pylist(chunk), src / f"p{part}.parquet", row_group_size=7)

    class Sum(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.total = ctx.get_state(ValueStateDescriptor("total", int, default=0))

        def process(self, record: Any, ctx: Context) -> None:
            self.total.update(self.total.value() + record["v"])
            ctx.output({"k": ctx.current_key, "total": self.total.value()})

    wm = WatermarkStrategy("ts", max_out_of_orderness_ms=5)
    for source in (
        JsonlSource(src, watermarks=wm, on_malformed="skip"),
        ParquetSource(src, watermarks=wm),
    ):
        sink = FileSink(tmp_path / f"out-{type(source).__name__}")
        result = JobRunner(Job("files", source, lambda r: r["k"], Sum(), sink, parallelism=2)).run()
        got = sink.read_committed()
        assert result.records_out == len(got) == result.records_in
        assert not (sink.staging.exists() and list(sink.staging.iterdir()))
        expected_keys = {r["k"] for r in rows[0::3]} if "Jsonl" in type(source).__name__ else None
        if expected_keys is not None:
            assert result.records_skipped == 1 and result.records_in == 20
        final: dict[str, int] = {}
        for r in got:
            final[r["k"]] = max(final.get(r["k"], 0), r["total"])
        kept = rows[0::3] if expected_keys else rows[1::3] + rows[2::3]
        assert final == {k: sum(r["v"] for r in kept if r["k"] == k) for k in final}


def test_a_killed_run_without_checkpoints_commits_nothing() -> None:
    out = CollectedOutput()
    runner = JobRunner(proof_job(2, None, out))
    result = runner.run_until(records=300)
    assert result.killed and not result.finished and result.records_in == 300
    assert result.records_out > 0 and out.records == []
    with pytest.raises(JobError, match="killed"):
        runner.run()
    with pytest.raises(JobError, match="no live state"):
        runner.state_entries()


def test_pausing_and_continuing_equals_one_run() -> None:
    out, again = CollectedOutput(), CollectedOutput()
    with JobRunner(proof_job(2, None, out)) as runner:
        assert runner.run_until(records=250, kill=False).records_in == 250
        runner.run_until(records=400, kill=False)
        runner.run()
    JobRunner(proof_job(2, None, again)).run()
    assert multiset(out.records) == multiset(again.records)


def test_job_definitions_are_checked(tmp_path: Path) -> None:
    out = CollectedOutput()
    job = proof_job(2, None, out)
    with pytest.raises(InvalidJob, match="checkpoint_format"):
        job.with_(checkpoint_format="zip")
    with pytest.raises(InvalidJob, match="distinct"):
        job.with_(sink_uid="source")
    with pytest.raises(InvalidJob, match="needs a catalog"):
        JobRunner(job.with_(checkpoint_interval_records=10))
    with pytest.raises(InvalidJob, match="StateBackendFactory"):
        job.with_(backend=object())
    with pytest.raises(InvalidJob, match="Sink"):
        job.with_(sink=out)
