"""TTL cleanup: a new canonical snapshot without the entries whose TTL expired.

An entry expired once ``expires_at <= now`` (the engine's rule, see ``state/ttl.py``), where
``now`` is the processing time ``at`` (default: the wall clock when the run starts) for states
with a processing-time TTL and the event-time ``watermark`` for states with an event-time TTL.
Without a watermark, event-time states are copied unchanged; states without TTL always are.

No shuffle: one Spark task per write range reads that range's row groups of the input through
the key-group index, drops expired rows and writes the kept ones with ``CanonicalWriter``; the
driver copies operator state and commits (``maintenance.rewrite``). The input is never modified.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from state_engine.catalog import Catalog
from state_engine.jobs.canonical_write import run_range_tasks, write_range
from state_engine.jobs.spark import min_tasks
from state_engine.jobs.spark_job import maintenance_job
from state_engine.maintenance.expiry import Thresholds, expired_mask, thresholds_for
from state_engine.maintenance.inputs import InputSnapshot, resolve_input
from state_engine.maintenance.output import OutputSnapshot
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange, plan_write_ranges
from state_engine.maintenance.rewrite import Rewrite, Written, rewrite_run
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.snapshot.canonical import (
    arrow_array,
    read_key_groups,
)
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.snapshot.storage import ReadStats, SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "ttl_cleanup"


def _count(column: pa.Array, into: Counter[str]) -> None:
    for item in pc.value_counts(column).to_pylist():
        into[item["values"]] += item["counts"]


def clean_range(
    source_url: str,
    meta: SnapshotMetadata,
    target: TargetSpec,
    thresholds: dict[str, Thresholds],
    wr: WriteRange,
) -> RangeOutput:
    """Task side: read one write range of the input, drop expired rows, write the rest."""
    src = SnapshotDir.from_url(source_url)
    stats = ReadStats()
    kept: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    rows = [0]
    limits = thresholds.get(wr.operator, {})

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in read_key_groups(
            src, meta, (wr.first, wr.last), operator=wr.operator, stats=stats
        ):
            rows[0] += batch.num_rows
            drop = expired_mask(batch, limits)
            if drop.any():
                _count(batch.column("state").filter(arrow_array(drop)), dropped)
                batch = batch.filter(arrow_array(~drop))
            if batch.num_rows:
                _count(batch.column("state"), kept)
                yield batch

    return write_range(
        target,
        wr,
        batches(),
        counters=lambda: (rows[0], stats.bytes_read),
        extra=lambda: {"kept": dict(kept), "dropped": dict(dropped)},
    )


def _per_state(outputs: Sequence[RangeOutput]) -> dict[str, Any]:
    """Rows kept and dropped, per ``operator/state`` and in all."""
    kept: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for o in outputs:
        kept.update({f"{o.range.operator}/{s}": n for s, n in o.extra["kept"].items()})
        dropped.update({f"{o.range.operator}/{s}": n for s, n in o.extra["dropped"].items()})
    per_state = {
        s: {"kept": kept.get(s, 0), "dropped": dropped.get(s, 0)}
        for s in sorted(set(kept) | set(dropped))
    }
    return {"states": per_state, "dropped": sum(dropped.values()), "kept": sum(kept.values())}


@maintenance_job(KIND, resolve_input)
def run(
    spark: SparkSession,
    catalog: Catalog,
    ctx: RunContext,
    *,
    snapshot: int,
    job: str | None = None,
    at: int | None = None,
    watermark: int | None = None,
    kind: str = SnapshotKind.CHECKPOINT,
    savepoint_dir: str | None = None,
    tasks: int | None = None,
    row_group_bytes: int | None = None,
) -> JobResult:
    """Drop expired entries of snapshot ``snapshot`` into a new CHECKPOINT or SAVEPOINT."""

    def plan(inp: InputSnapshot) -> Rewrite:
        now = int(time.time() * 1000) if at is None else int(at)
        thresholds, skipped = thresholds_for(inp.meta, now, watermark)

        def write(out: OutputSnapshot) -> Written:
            target = out.target(row_group_bytes=row_group_bytes)
            ranges = plan_write_ranges(
                inp.meta.max_parallelism,
                inp.meta.parallelism,
                inp.keyed_operators,
                min_tasks(spark, tasks),
            )
            source_url, meta = inp.url, inp.meta
            outputs = run_range_tasks(
                spark, ranges, lambda wr: clean_range(source_url, meta, target, thresholds, wr)
            )
            return Written(outputs, tasks=len(ranges), stats=_per_state(outputs))

        return Rewrite(
            kind,
            inp.meta.parallelism,
            inp.meta.max_parallelism,
            write,
            stats={"at": now, "watermark": watermark, "skipped_states": skipped},
            savepoint_dir=savepoint_dir,
        )

    return rewrite_run(catalog, ctx, snapshot, reads=(SnapshotFormat.CANONICAL,), plan=plan)
