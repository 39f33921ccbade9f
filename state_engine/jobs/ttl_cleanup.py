"""TTL cleanup: a new canonical snapshot without the entries whose TTL expired.

An entry expired once ``expires_at <= now`` (the engine's rule, see ``state/ttl.py``), where
``now`` is the processing time ``at`` (default: the wall clock when the run starts) for states
with a processing-time TTL and the event-time ``watermark`` for states with an event-time TTL.
Without a watermark, event-time states are copied unchanged; states without TTL always are.

No shuffle: one Spark task per write range reads that range's row groups of the input through
the key-group index, drops expired rows and writes the kept ones with ``CanonicalWriter``; the
driver copies operator state and commits (``jobs.commit``). The input is never modified.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.catalog import Catalog
from state_engine.checkpoint.canonical import (
    arrow_array,
    int_values,
    is_valid,
    read_key_groups,
)
from state_engine.checkpoint.metadata import FileKind, SnapshotFile, SnapshotMetadata
from state_engine.checkpoint.storage import ReadStats, SnapshotDir
from state_engine.errors import InvalidJobParams
from state_engine.jobs.canonical_write import (
    RangeOutput,
    TargetSpec,
    WriteRange,
    plan_write_ranges,
    run_range_tasks,
    write_range,
)
from state_engine.jobs.commit import (
    OutputSnapshot,
    abort_output,
    begin_output,
    build_metadata,
    commit_output,
    previous_output,
    storage_for,
)
from state_engine.jobs.inputs import load_input, resolve_input
from state_engine.jobs.run import JobResult, RunContext, maintenance_job
from state_engine.snapshot_enums import SnapshotKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "ttl_cleanup"
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# state name -> expiry threshold (an entry with expires_at <= threshold is dropped)
Thresholds = dict[str, int]


def thresholds_for(
    meta: SnapshotMetadata, at: int, watermark: int | None
) -> tuple[dict[str, Thresholds], dict[str, str]]:
    """Per operator, the threshold of every state with an active TTL; and why others are kept."""
    out: dict[str, Thresholds] = {}
    skipped: dict[str, str] = {}
    for op in meta.operators:
        per_state: Thresholds = {}
        for name, info in op.states.items():
            ttl = info.get("ttl") if isinstance(info, dict) else None
            if not ttl or ttl.get("update_type") == "DISABLED":
                continue
            if ttl.get("time_domain", "PROCESSING_TIME") == "EVENT_TIME":
                if watermark is None:
                    skipped[f"{op.operator_id}/{name}"] = "event-time TTL and no watermark given"
                    continue
                per_state[name] = watermark
            else:
                per_state[name] = at
        out[op.operator_id] = per_state
    return out, skipped


def expired_mask(batch: pa.RecordBatch, thresholds: Thresholds) -> np.ndarray:
    """True for the rows of ``batch`` whose TTL expired under ``thresholds``."""
    if not thresholds or batch.num_rows == 0:
        return np.zeros(batch.num_rows, dtype=bool)
    names = list(thresholds)
    idx = pc.index_in(batch.column("state"), value_set=arrow_array(names, pa.string()))
    # not pc.fill_null with a Python scalar: that imports pandas in every Spark worker
    idx_np = int_values(idx, null=-1)
    limits = np.array([*thresholds.values(), INT64_MIN], dtype=np.int64)
    expires = batch.column("expires_at")
    has_expiry = is_valid(expires)
    values = int_values(expires)  # nulls read as 0, masked by has_expiry
    return has_expiry & (idx_np >= 0) & (values <= limits[idx_np])


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


def copy_operator_state(
    src: SnapshotDir, meta: SnapshotMetadata, out: OutputSnapshot
) -> dict[str, list[SnapshotFile]]:
    """Copy every operator-state file into the output directory (they are small)."""
    copied: dict[str, list[SnapshotFile]] = {}
    by_path = {f.path: f for f in meta.files}
    for op in meta.operators:
        paths = list(op.operator_state_files) + [
            p for st in op.subtasks for p in st.files if by_path[p].kind is FileKind.OPERATOR
        ]
        for path in dict.fromkeys(paths):
            f = by_path[path]
            with src.open_input(path) as fh:
                data = fh.read()
            name = out.snapshot.new_file_name(f"operator-{op.operator_id}", ".parquet")
            info = out.snapshot.write_file(name, data)
            copied.setdefault(op.operator_id, []).append(
                SnapshotFile(info.path, info.size, info.checksum, FileKind.OPERATOR, f.rows)
            )
    return copied


def _min_tasks(spark: SparkSession, given: int | None) -> int:
    if given is not None:
        if given < 1:
            raise InvalidJobParams(f"tasks must be >= 1, not {given}")
        return given
    return max(1, 2 * spark.sparkContext.defaultParallelism)


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
    inp = load_input(catalog, snapshot)
    now = int(time.time() * 1000) if at is None else int(at)
    thresholds, skipped = thresholds_for(inp.meta, now, watermark)
    base_stats: dict[str, Any] = {"at": now, "watermark": watermark, "skipped_states": skipped}
    job_name = inp.record.job
    done = previous_output(catalog, job_name, ctx.tag)
    if done is not None:
        return JobResult(
            output_snapshot_id=done.id,
            rows_out=done.entries,
            bytes_out=done.bytes,
            stats={**base_stats, "recovered": True},
        )
    out = begin_output(
        catalog,
        storage_for(catalog, job_name, ctx.settings),
        job_name,
        kind=kind,
        parallelism=inp.meta.parallelism,
        max_parallelism=inp.meta.max_parallelism,
        tag=ctx.tag,
        savepoint_dir=savepoint_dir,
    )
    try:
        sizing = {"row_group_bytes": row_group_bytes} if row_group_bytes else {}
        target = out.target(**sizing)
        ranges = plan_write_ranges(
            inp.meta.max_parallelism,
            inp.meta.parallelism,
            inp.keyed_operators,
            _min_tasks(spark, tasks),
        )
        source_url, meta = inp.url, inp.meta
        outputs = run_range_tasks(
            spark, ranges, lambda wr: clean_range(source_url, meta, target, thresholds, wr)
        )
        op_files = copy_operator_state(inp.snapshot, inp.meta, out)
        record = commit_output(
            catalog, out, build_metadata(out, inp.meta, outputs, op_files), outputs
        )
    except BaseException as exc:
        abort_output(catalog, out, str(exc))
        raise
    kept: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for o in outputs:
        kept.update({f"{o.range.operator}/{s}": n for s, n in o.extra["kept"].items()})
        dropped.update({f"{o.range.operator}/{s}": n for s, n in o.extra["dropped"].items()})
    per_state = {
        s: {"kept": kept.get(s, 0), "dropped": dropped.get(s, 0)}
        for s in sorted(set(kept) | set(dropped))
    }
    return JobResult(
        output_snapshot_id=record.id,
        rows_in=sum(o.rows_in for o in outputs),
        rows_out=sum(o.rows_out for o in outputs),
        bytes_in=sum(o.bytes_in for o in outputs),
        bytes_out=record.bytes,
        stats={
            **base_stats,
            "states": per_state,
            "dropped": sum(dropped.values()),
            "kept": sum(kept.values()),
            "tasks": len(ranges),
            "output_checkpoint_id": record.checkpoint_id,
            "output_location": record.location,
        },
    )
