"""Savepoint capture: a relocatable canonical savepoint from any COMPLETED checkpoint or savepoint.

Inputs of every format:
- canonical: one Spark task per write range reads that range's row groups (no shuffle);
- delta (heap incremental chain): the same, with the range's deltas folded onto its base;
- native (RocksDB): one Spark task per old subtask copies that subtask's SST and private files
  into a local scratch directory, opens the DB with rocksdict and emits canonical Arrow batches
  of its key-group range (a DB cannot be split before it is opened, so a subtask is one task).

Optionally entries whose TTL expired are dropped on the way (``at``: processing time for
processing-time TTL states, ``watermark``: for event-time ones; the rule of ``ttl_cleanup``).
The savepoint goes to ``savepoint_dir`` (any URL Spark and fsspec both reach, or a path under the
checkpoint root; default: the storage layout's savepoint directory). It holds only relative paths,
so the directory can be copied or moved and still restores (``CheckpointManager.restore(url)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from state_engine.catalog import Catalog
from state_engine.faults import crash_point
from state_engine.jobs.canonical_write import run_range_tasks, write_range
from state_engine.jobs.snapshot_read import (
    native_subtask_batches,
    plan_read_ranges,
    range_batches,
)
from state_engine.jobs.spark import min_tasks
from state_engine.jobs.spark_job import maintenance_job
from state_engine.maintenance.expiry import Thresholds, expired_mask, thresholds_for
from state_engine.maintenance.inputs import InputSnapshot, resolve_input
from state_engine.maintenance.output import OutputSnapshot
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange
from state_engine.maintenance.reachable import check_reachable
from state_engine.maintenance.rewrite import Rewrite, Written, rewrite_run
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.maintenance.source import open_source
from state_engine.snapshot.canonical import arrow_array
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.snapshot.storage import ReadStats
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "savepoint"


def capture_range(
    source_url: str,
    source_kind: str,
    meta: SnapshotMetadata,
    target: TargetSpec,
    thresholds: dict[str, Thresholds],
    native: bool,
    wr: WriteRange,
) -> RangeOutput:
    """Task side: one write range (a whole old subtask when native) as canonical files."""
    src = open_source(source_url, source_kind)
    stats = ReadStats()
    rows = [0]
    dropped: Counter[str] = Counter()
    limits = thresholds.get(wr.operator, {})

    def batches() -> Iterator[pa.RecordBatch]:
        source = (
            native_subtask_batches(src, meta, wr.operator, wr.subtask, wr.first, wr.last, stats)
            if native
            else range_batches(src, meta, wr.operator, wr.first, wr.last, stats)
        )
        for b in source:
            rows[0] += b.num_rows
            drop = expired_mask(b, limits)
            if drop.any():
                for item in b.column("state").filter(arrow_array(drop)).value_counts().to_pylist():
                    dropped[item["values"]] += item["counts"]
                b = b.filter(arrow_array(~drop))
            if b.num_rows:
                yield b

    return write_range(
        target,
        wr,
        batches(),
        counters=lambda: (rows[0], stats.bytes_read),
        extra=lambda: {"dropped": dict(dropped)},
    )


@maintenance_job(KIND, resolve_input)
def run(
    spark: SparkSession,
    catalog: Catalog,
    ctx: RunContext,
    *,
    snapshot: int,
    job: str | None = None,
    savepoint_dir: str | None = None,
    at: int | None = None,
    watermark: int | None = None,
    tasks: int | None = None,
    row_group_bytes: int | None = None,
) -> JobResult:
    """Capture snapshot ``snapshot`` as a canonical SAVEPOINT (expired entries dropped if asked)."""

    def plan(inp: InputSnapshot) -> Rewrite:
        if savepoint_dir is not None and "://" in savepoint_dir:
            check_reachable(savepoint_dir)
        drop = at is not None or watermark is not None
        thresholds, skipped = (
            # without ``at`` nothing of a processing-time state expires (no entry is <= INT64_MIN)
            thresholds_for(inp.meta, int(at) if at is not None else -(1 << 63), watermark)
            if drop
            else ({}, {})
        )

        def write(out: OutputSnapshot) -> Written:
            target = out.target(row_group_bytes=row_group_bytes)
            ranges, native = plan_read_ranges(inp.meta, min_tasks(spark, tasks))
            url, kind, meta = inp.url, inp.record.kind, inp.meta
            outputs = run_range_tasks(
                spark,
                ranges,
                lambda wr: capture_range(
                    url, kind, meta, target, thresholds, wr.operator in native, wr
                ),
            )
            crash_point("savepoint.after_tasks")
            dropped: Counter[str] = Counter()
            for o in outputs:
                dropped.update(
                    {f"{o.range.operator}/{s}": n for s, n in o.extra["dropped"].items()}
                )
            return Written(outputs, tasks=len(ranges), stats={"dropped": dict(dropped)})

        return Rewrite(
            SnapshotKind.SAVEPOINT,
            inp.meta.parallelism,
            inp.meta.max_parallelism,
            write,
            stats={
                "input_format": str(inp.format),
                "input_kind": inp.record.kind,
                "at": at,
                "watermark": watermark,
                "skipped_states": skipped,
            },
            savepoint_dir=savepoint_dir,
        )

    return rewrite_run(catalog, ctx, snapshot, reads=tuple(SnapshotFormat), plan=plan)
