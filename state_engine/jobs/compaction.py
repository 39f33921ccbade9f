"""Compaction: fold a heap-incremental chain (base + deltas) into a new full canonical checkpoint,
bin-packing the rows into files of about ``target_file_bytes``.

Input: a COMPLETED DELTA snapshot (its chain is folded: per identity the row with the greatest
(chain index, seq) wins, CLEAR removes a whole (state, key, namespace); see
:mod:`state_engine.checkpoint.delta`), or a CANONICAL snapshot with many small files (rewritten
into fewer). One Spark task per write range reads that range's base and delta row groups through
the key-group index, folds them and writes canonical files; the driver copies operator state and
commits (``jobs.commit``). Write ranges are cut from each subtask's key-group range so that each
holds about ``target_file_bytes`` of input (estimated from the files' key-group indexes): small
files are bin-packed together, a range never spans two subtasks.

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

from state_engine.catalog import Catalog
from state_engine.checkpoint.canonical import DEFAULT_TARGET_FILE_BYTES
from state_engine.checkpoint.metadata import SnapshotFormat, SnapshotMetadata, read_metadata
from state_engine.checkpoint.storage import ReadStats
from state_engine.errors import (
    CommitConflict,
    InvalidJobParams,
    InvalidSnapshotTransition,
    SnapshotNotUsable,
)
from state_engine.faults import crash_point
from state_engine.jobs.canonical_write import (
    RangeOutput,
    TargetSpec,
    WriteRange,
    run_range_tasks,
    write_range,
)
from state_engine.jobs.commit import (
    abort_output,
    begin_output,
    build_metadata,
    commit_output,
    previous_output,
    storage_for,
)
from state_engine.jobs.inputs import resolve_input
from state_engine.jobs.run import JobResult, RunContext, maintenance_job
from state_engine.jobs.snapshot_read import (
    estimated_key_group_bytes,
    open_source,
    range_batches,
    snapshot_format,
)
from state_engine.jobs.spark import check_reachable
from state_engine.jobs.ttl_cleanup import copy_operator_state
from state_engine.keygroups import compute_key_group_range_for_operator_index

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "compaction"
MIN_TARGET_FILE_BYTES = 1 << 10


def load_source(catalog: Catalog, snapshot_id: int, *, allow: tuple[SnapshotFormat, ...]):
    """A COMPLETED snapshot of one of the ``allow`` formats (by its files), reachable by Spark."""
    record = catalog.get_snapshot(snapshot_id)
    if record.status != "COMPLETED":
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.status}, not COMPLETED; only "
            f"completed snapshots are read: pick one from `statectl snapshots {record.job}`"
        )
    check_reachable(record.location)
    src = open_source(record.location, record.kind)
    meta = read_metadata(src)
    fmt = snapshot_format(meta)
    if fmt not in allow:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} holds {fmt} files; this job reads "
            f"{' or '.join(str(a) for a in allow)} snapshots"
            + (
                "; take a canonical savepoint of it first (the savepoint job)"
                if fmt is SnapshotFormat.NATIVE
                else ""
            )  # fmt: skip
        )
    return record, src, meta, fmt


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
            or snap.kind != "CHECKPOINT"
            or snap.status != "COMPLETED"
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
    if record.kind != "CHECKPOINT":
        return {"released": False, "reason": "the input is a savepoint: the user owns it"}
    busy = [
        s.checkpoint_id
        for s in catalog.list_snapshots(record.job)
        if s.status == "PENDING" and s.trigger != tag and s.id != output_id
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
    target_file_bytes = int(target_file_bytes)
    record, src, meta, fmt = load_source(
        catalog, snapshot, allow=(SnapshotFormat.DELTA, SnapshotFormat.CANONICAL)
    )
    base_stats: dict[str, Any] = {
        "input_format": str(fmt),
        "input_files": len(meta.files),
        "target_file_bytes": target_file_bytes,
    }
    done = previous_output(catalog, record.job, ctx.tag)
    if done is not None:
        released = release_chain(catalog, record, done.id, ctx.tag) if release else None
        return JobResult(
            output_snapshot_id=done.id,
            rows_out=done.entries,
            bytes_out=done.bytes,
            stats={**base_stats, "recovered": True, "release": released},
        )
    out = begin_output(
        catalog,
        storage_for(catalog, record.job, ctx.settings),
        record.job,
        kind="CHECKPOINT",
        parallelism=meta.parallelism,
        max_parallelism=meta.max_parallelism,
        tag=ctx.tag,
    )
    try:
        sizing = {"target_file_bytes": target_file_bytes}
        if row_group_bytes:
            sizing["row_group_bytes"] = int(row_group_bytes)
        target = out.target(**sizing)
        operators = [op.operator_id for op in meta.operators if op.subtasks]
        ranges = plan_packed_ranges(meta, operators, target_file_bytes)
        url, kind = src.url, record.kind
        outputs = run_range_tasks(
            spark, ranges, lambda wr: compact_range(url, kind, meta, target, wr)
        )
        crash_point("compaction.after_tasks")
        op_files = copy_operator_state(src, meta, out)
        out_record = commit_output(
            catalog, out, build_metadata(out, meta, outputs, op_files), outputs
        )
    except BaseException as exc:
        abort_output(catalog, out, str(exc))
        raise
    crash_point("compaction.after_complete")
    released = release_chain(catalog, record, out_record.id, ctx.tag) if release else None
    files_out = sum(len(o.files) for o in outputs)
    return JobResult(
        output_snapshot_id=out_record.id,
        rows_in=sum(o.rows_in for o in outputs),
        rows_out=sum(o.rows_out for o in outputs),
        bytes_in=sum(o.bytes_in for o in outputs),
        bytes_out=out_record.bytes,
        stats={
            **base_stats,
            "output_files": files_out,
            "tasks": len(ranges),
            "output_checkpoint_id": out_record.checkpoint_id,
            "output_location": out_record.location,
            "release": released,
        },
    )
