"""A malformed source record (reported with file and offset; skip or fail by the setting) and a
100 MB value through a ValueState, a checkpoint and a restore on both backends."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.errors import MalformedRecord
from state_engine.examples import fraud
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Context,
    FileSink,
    GeneratorSource,
    Job,
    JobRunner,
    KeyedProcessFunction,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.state import ValueStateDescriptor

STREAM = {"partitions": 4, "records_per_partition": 600, "cards_per_partition": 40}
BAD_LINE = b'{"card": "card-00-00001", "amount": 12.5, "ts": \n'


def _with_bad_line(directory: Path) -> tuple[Path, int]:
    """The fraud stream as files, one extra broken line in the middle of the second file;
    returns that file and the line's byte offset."""
    paths = fraud.write_transactions(directory, **STREAM)
    victim = paths[1]
    lines = victim.read_bytes().splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:300])
    victim.write_bytes(b"".join(lines[:300]) + BAD_LINE + b"".join(lines[300:]))
    return victim, offset


def test_a_malformed_record_fails_the_job_with_file_and_offset_and_a_fix_loses_nothing(
    tmp_path: Path, catalog: Catalog, reference: Any
) -> None:
    victim, offset = _with_bad_line(tmp_path / "in")
    storage = (tmp_path / "ck").as_uri()

    def job() -> Job:
        return fraud.build_job(
            2, checkpoint_every=500, format="canonical", sink=FileSink(tmp_path / "alerts"),
            source=fraud.file_source(tmp_path / "in", on_malformed="fail"),
        )  # fmt: skip

    with (
        pytest.raises(MalformedRecord) as exc,
        JobRunner(job(), catalog=catalog, storage=storage) as r,
    ):
        r.run()
    message = str(exc.value)
    assert f"JSONL file {victim} at byte offset {offset}" in message
    assert "on_malformed='skip'" in message  # says what to do
    assert catalog.latest_snapshot(fraud.JOB_NAME) is not None  # checkpoints before it stand
    # the user repairs the line and resumes from the last checkpoint
    victim.write_bytes(victim.read_bytes().replace(BAD_LINE, b""))
    with JobRunner(job(), catalog=catalog, storage=storage, restore_from="latest") as r:
        r.run()
    alerts = FileSink(tmp_path / "alerts").read_committed()
    assert fraud.alert_counts(alerts) == reference


def test_a_malformed_record_is_skipped_and_counted_when_asked(
    tmp_path: Path, reference: Any
) -> None:
    _with_bad_line(tmp_path / "in")
    job = fraud.build_job(
        3, checkpoint_every=None, source=fraud.file_source(tmp_path / "in", on_malformed="skip")
    )
    with JobRunner(job) as runner:
        result = runner.run()
    assert result.records_skipped == 1
    assert result.records_in == STREAM["partitions"] * STREAM["records_per_partition"]
    assert fraud.alert_counts(job.sink.records) == reference  # type: ignore[attr-defined]  # the job was built with a CollectSink


# --- a 100 MB value ---

SIZE = 100 * 1024 * 1024


class Blob(KeyedProcessFunction):
    """Record 0 stores a 100 MB value; record 1 (after a restore) reports its digest."""

    def open(self, ctx: RuntimeContext) -> None:
        self.blob = ctx.get_state(ValueStateDescriptor("blob", bytes))

    def process(self, record: Any, ctx: Context) -> None:
        if record["op"] == "put":
            self.blob.update(random.Random(7).randbytes(SIZE))
        else:
            value = self.blob.value()
            ctx.output({"size": len(value), "sha256": hashlib.sha256(value).hexdigest()})


def _blob_job(backend: Any, fmt: str, target: CollectedOutput) -> Job:
    source = GeneratorSource(
        1, 2, lambda p, i, rng: {"op": ("put", "get")[i], "ts": i},
        watermarks=WatermarkStrategy("ts"),
    )  # fmt: skip
    return Job("blob", source, lambda r: "the-key", Blob(), CollectSink(target),
               backend=backend, checkpoint_format=fmt, incremental=fmt == "native")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("before", "fmt", "after"), [("heap", "canonical", "rocksdb"), ("rocksdb", "native", "heap")]
)
def test_a_100_mb_value_through_a_checkpoint_and_a_restore(
    tmp_path: Path, catalog: Catalog, before: str, fmt: str, after: str
) -> None:
    def backend(kind: str, sub: str) -> Any:
        return HeapBackendFactory() if kind == "heap" else RocksDBBackendFactory(tmp_path / sub)

    expected = hashlib.sha256(random.Random(7).randbytes(SIZE)).hexdigest()
    target = CollectedOutput()
    storage = (tmp_path / "ck").as_uri()
    first = JobRunner(
        _blob_job(backend(before, "a"), fmt, target), catalog=catalog, storage=storage
    )
    first.run_until(1, kill=False)
    snap = first.checkpoint()
    first.kill()
    assert snap.bytes >= SIZE
    if fmt == "native" and after == "heap":
        fmt = "canonical"  # the heap restores native snapshots; it writes canonical ones
    second = JobRunner(_blob_job(backend(after, "b"), fmt, target), catalog=catalog,
                       storage=storage, restore_from=snap.id)  # fmt: skip
    with second:
        second.run()
    assert target.records == [{"size": SIZE, "sha256": expected}]
