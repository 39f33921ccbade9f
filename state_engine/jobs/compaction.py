"""Compaction: fold a heap-incremental chain (base + deltas) into a new full canonical checkpoint,
bin-packing the rows into files of about ``target_file_bytes``.

Input: a COMPLETED DELTA snapshot (its chain is folded: per identity the row with the greatest
(chain index, seq) wins, CLEAR removes a whole (state, key, namespace); see
:mod:`state_engine.snapshot.delta`), or a CANONICAL snapshot with many small files (rewritten
into fewer). One Spark task per write range reads that range's base and delta row groups through
the key-group index, folds them and writes canonical files; the driver copies operator state and
commits (``maintenance.rewrite``). Write ranges are cut from each subtask's key-group range so
that each holds about ``target_file_bytes`` of input (estimated from the files' key-group
indexes): small files are bin-packed together, a range never spans two subtasks.

The output is a new CHECKPOINT with the next checkpoint id, so ``restore("latest")`` picks it,
and it restores equal to the chain. Then the chain is released through the catalog: the input and
every earlier COMPLETED checkpoint whose files all belong to the input's chain are SUBSUMED (their
files stay referenced only by snapshots that still use them); this job deletes nothing: the
checkpoint manager's garbage collection or the expire job removes releasable files.

A running job keeps writing deltas on its in-memory chain (its own last checkpoint), not on the
compacted snapshot: a delta it writes next re-attaches the chain's files (the catalog counts the
reference again), and if its manager already deleted them as releasable it has forgotten them too,
and writes a new base instead (``DeltaCapture.prepare`` in ``backends/heap/snapshot.py``). To keep
a checkpoint in flight from referencing a file while it is being released, the chain is not
released while the job has a PENDING snapshot of its own (``release_chain`` in the report says
what happened; run again later or release with the expire job).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.errors import (
    CommitConflict,
    InvalidJobParams,
    InvalidSnapshotTransition,
)
from state_engine.faults import crash_point
from state_engine.jobs.canonical_write import run_range_tasks, write_range
from state_engine.jobs.snapshot_read import estimated_key_group_bytes, range_batches
from state_engine.jobs.spark_job import maintenance_job
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.maintenance.inputs import InputSnapshot, resolve_input
from state_engine.maintenance.output import OutputSnapshot
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange
from state_engine.maintenance.rewrite import Rewrite, Written, rewrite_run
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.maintenance.source import open_source
from state_engine.snapshot.canonical import DEFAULT_TARGET_FILE_BYTES
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.snapshot.storage import ReadStats
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "compaction"
MIN_TARGET_FILE_BYTES = 1 << 10


def plan_packed_ranges(
    meta: SnapshotMetadata, operators: list[str], target_file_bytes: int
) -> list[WriteRange]:
    """Each subtask's range cut into contiguous pieces of about ``target_file_bytes`` input."""
    out: list[WriteRange] = []
    for op in operators:
        est = estimated_key_group_bytes(meta, op)
        for index in range(meta.parallelism):
            rng = compute_key_group_range_for_operator_index(
                meta.max_parallelism, meta.parallelism, index
            )
            total = float(est[rng.start : rng.end + 1].sum())
            pieces = max(1, min(math.ceil(total / target_file_bytes), rng.end - rng.start + 1))
            if pieces == 1:
                out.append(WriteRange(op, index, rng.start, rng.end))
                continue
            # cut where the running total crosses each multiple of total / pieces
            cum = np.cumsum(est[rng.start : rng.end + 1])
            marks = np.searchsorted(cum, [total * k / pieces for k in range(1, pieces)], "left")
            first = rng.start
            for m in sorted(set(int(x) for x in marks)):
                last = rng.start + m
                if first <= last < rng.end:
                    out.append(WriteRange(op, index, first, last))
                    first = last + 1
            out.append(WriteRange(op, index, first, rng.end))
    return out


def compact_range(
    source_url: str, source_kind: str, meta: SnapshotMetadata, target: TargetSpec, wr: WriteRange
) -> RangeOutput:
    """Task side: fold one write range of the chain and write it."""
    src = open_source(source_url, source_kind)
    stats = ReadStats()
    rows = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for b in range_batches(src, meta, wr.operator, wr.first, wr.last, stats):
            rows[0] += b.num_rows
            yield b

    return write_range(target, wr, batches(), counters=lambda: (rows[0], stats.bytes_read))


def chain_snapshots(catalog: Catalog, record: Any) -> list[Any]:
    """The input and the earlier COMPLETED checkpoints whose files all lie in its chain."""
    own = {f.path for f in catalog.snapshot_files(record.id)}
    out = [record]
    for snap in catalog.list_snapshots(record.job):
        if (
            snap.id == record.id
            or snap.kind is not SnapshotKind.CHECKPOINT
            or snap.status is not SnapshotStatus.COMPLETED
            or snap.checkpoint_id >= record.checkpoint_id
        ):
            continue
        files = {f.path for f in catalog.snapshot_files(snap.id)}
        data = {p for p in files if not p.endswith("/_metadata")}
        if data and all(p in own for p in data):
            out.append(snap)
    return out


def release_chain(catalog: Catalog, record: Any, output_id: int, tag: str) -> dict[str, Any]:
    """Subsume the chain's checkpoints, unless the job has a snapshot in flight."""
    if record.kind is not SnapshotKind.CHECKPOINT:
        return {"released": False, "reason": "the input is a savepoint: the user owns it"}
    busy = [
        s.checkpoint_id
        for s in catalog.list_snapshots(record.job)
        if s.status is SnapshotStatus.PENDING and s.trigger != tag and s.id != output_id
    ]
    if busy:
        return {
            "released": False,
            "reason": f"checkpoints {busy} of the job are in flight; run again to release",
        }
    subsumed = []
    for snap in chain_snapshots(catalog, record):
        try:
            catalog.subsume_snapshot(snap.id)
            subsumed.append(snap.checkpoint_id)
        except (InvalidSnapshotTransition, CommitConflict):
            continue  # another writer subsumed or discarded it first: released either way
    return {"released": True, "subsumed_checkpoints": sorted(subsumed)}


@maintenance_job(KIND, resolve_input)
def run(
    spark: SparkSession,
    catalog: Catalog,
    ctx: RunContext,
    *,
    snapshot: int,
    job: str | None = None,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    row_group_bytes: int | None = None,
    release: bool = True,
) -> JobResult:
    """Fold snapshot ``snapshot`` (a delta chain, or small canonical files) into a checkpoint."""
    if isinstance(target_file_bytes, bool) or int(target_file_bytes) < MIN_TARGET_FILE_BYTES:
        raise InvalidJobParams(
            f"target_file_bytes {target_file_bytes!r} is too small; use at least "
            f"{MIN_TARGET_FILE_BYTES} (the default is {DEFAULT_TARGET_FILE_BYTES})"
        )
    file_bytes = int(target_file_bytes)

    def plan(inp: InputSnapshot) -> Rewrite:
        def write(out: OutputSnapshot) -> Written:
            target = out.target(target_file_bytes=file_bytes, row_group_bytes=row_group_bytes)
            ranges = plan_packed_ranges(inp.meta, inp.keyed_operators, file_bytes)
            url, kind, meta = inp.url, inp.record.kind, inp.meta
            outputs = run_range_tasks(
                spark, ranges, lambda wr: compact_range(url, kind, meta, target, wr)
            )
            crash_point("compaction.after_tasks")
            files_out = sum(len(o.files) for o in outputs)
            return Written(outputs, tasks=len(ranges), stats={"output_files": files_out})

        def finish(record: SnapshotRecord, *, recovered: bool) -> dict[str, Any]:
            if not recovered:
                crash_point("compaction.after_complete")
            released = release_chain(catalog, inp.record, record.id, ctx.tag) if release else None
            return {"release": released}

        return Rewrite(
            SnapshotKind.CHECKPOINT,
            inp.meta.parallelism,
            inp.meta.max_parallelism,
            write,
            stats={
                "input_format": str(inp.format),
                "input_files": len(inp.meta.files),
                "target_file_bytes": file_bytes,
            },
            finish=finish,
        )

    return rewrite_run(
        catalog, ctx, snapshot, reads=(SnapshotFormat.DELTA, SnapshotFormat.CANONICAL), plan=plan
    )
