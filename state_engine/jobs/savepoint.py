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
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from state_engine.catalog import Catalog
from state_engine.checkpoint.canonical import arrow_array
from state_engine.checkpoint.metadata import SnapshotMetadata
from state_engine.checkpoint.storage import ReadStats
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
from state_engine.maintenance.inputs import load_input, resolve_input
from state_engine.maintenance.output import output_snapshot
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange
from state_engine.maintenance.reachable import check_reachable
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.maintenance.source import open_source
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
    inp = load_input(
        catalog,
        snapshot,
        allow=(SnapshotFormat.CANONICAL, SnapshotFormat.DELTA, SnapshotFormat.NATIVE),
    )
    record, src, meta = inp.record, inp.snapshot, inp.meta
    if savepoint_dir is not None and "://" in savepoint_dir:
        check_reachable(savepoint_dir)
    drop = at is not None or watermark is not None
    thresholds, skipped = (
        # without ``at`` nothing of a processing-time state expires (no entry is <= INT64_MIN)
        thresholds_for(meta, int(at) if at is not None else -(1 << 63), watermark)
        if drop
        else ({}, {})
    )
    base_stats: dict[str, Any] = {
        "input_format": str(inp.format),
        "input_kind": record.kind,
        "at": at,
        "watermark": watermark,
        "skipped_states": skipped,
    }
    with output_snapshot(
        catalog,
        record.job,
        tag=ctx.tag,
        settings=ctx.settings,
        kind=SnapshotKind.SAVEPOINT,
        parallelism=meta.parallelism,
        max_parallelism=meta.max_parallelism,
        savepoint_dir=savepoint_dir,
    ) as out:
        if out.recovered:
            return out.recovered_result(base_stats)
        sizing = {"row_group_bytes": int(row_group_bytes)} if row_group_bytes else {}
        target = out.target(**sizing)
        ranges, native = plan_read_ranges(meta, min_tasks(spark, tasks))
        url, kind = src.url, record.kind
        outputs = run_range_tasks(
            spark,
            ranges,
            lambda wr: capture_range(
                url, kind, meta, target, thresholds, wr.operator in native, wr
            ),
        )
        crash_point("savepoint.after_tasks")
        op_files = out.copy_operator_state(src, meta)
        out_record = out.commit(out.metadata(meta, outputs, op_files), outputs)
    dropped: Counter[str] = Counter()
    for o in outputs:
        dropped.update({f"{o.range.operator}/{s}": n for s, n in o.extra["dropped"].items()})
    return JobResult(
        output_snapshot_id=out_record.id,
        rows_in=sum(o.rows_in for o in outputs),
        rows_out=sum(o.rows_out for o in outputs),
        bytes_in=sum(o.bytes_in for o in outputs),
        bytes_out=out_record.bytes,
        stats={
            **base_stats,
            "dropped": dict(dropped),
            "tasks": len(ranges),
            "output_checkpoint_id": out_record.checkpoint_id,
            "output_location": out_record.location,
        },
    )
