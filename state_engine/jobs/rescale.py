"""Rescale: a snapshot of a job for a new parallelism, and optionally a new max parallelism.

Same max parallelism: a metadata-only CHECKPOINT, whose ``_metadata`` assigns the input's
canonical files (reused where they are, attached as shared) to the new subtasks' ranges; only
operator state is rewritten. New max parallelism: rows re-bucketed by ``key_hash`` alone (no key
is deserialized) into a new SAVEPOINT, in two waves of tasks through an Arrow IPC spill under the
output's ``_spill/``, or, for a small plain input, in one wave that reads the input once per task
(cheaper than writing, reading and deleting the spill; shuffling through Spark ran at about half
the speed). Afterwards the job's max parallelism is the new one. UNION operator state is kept
once per list, so that the union a restore forms is exactly the old one. The rules in full are in
the docs (rescaling).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from state_engine.backends.operator_state import (
    OperatorStateMode,
    group_by_subtask,
    redistribute,
)
from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint_dirs import is_checkpoint_dir
from state_engine.errors import InvalidJobParams, InvalidParallelism, SnapshotNotUsable
from state_engine.faults import crash_point
from state_engine.jobs.canonical_write import run_range_tasks, write_range
from state_engine.jobs.snapshot_read import (
    native_subtask_batches,
    plan_read_ranges,
    range_batches,
)
from state_engine.jobs.spark import min_tasks
from state_engine.jobs.spark_job import maintenance_job
from state_engine.keygroups import (
    UPPER_BOUND_MAX_PARALLELISM,
    compute_key_group_range_for_operator_index,
    key_groups_for_hashes,
)
from state_engine.maintenance.deletion import FileLease
from state_engine.maintenance.inputs import InputSnapshot, resolve_input
from state_engine.maintenance.output import OutputSnapshot
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange, plan_write_ranges
from state_engine.maintenance.rewrite import Rewrite, Written, rewrite_run
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.maintenance.source import open_source
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    KeyGroupStats,
    arrow_array,
    int_values,
    read_operator_state,
    write_operator_state,
)
from state_engine.snapshot.metadata import (
    FileKind,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
)
from state_engine.snapshot.operator_rows import OperatorStateRow
from state_engine.snapshot.storage import SHARED_DIR, ReadStats, SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "rescale"
SPILL_DIR = "_spill"


def check_target(parallelism: Any, max_parallelism: Any, current_max: int) -> tuple[int, int]:
    """The new (parallelism, max parallelism), validated."""
    new_max = current_max if max_parallelism is None else max_parallelism
    if (
        isinstance(new_max, bool)
        or not isinstance(new_max, int)
        or not (1 <= new_max <= UPPER_BOUND_MAX_PARALLELISM)
    ):
        raise InvalidParallelism(
            f"max parallelism {new_max!r} is out of range; use a whole number in "
            f"1..{UPPER_BOUND_MAX_PARALLELISM}"
        )
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise InvalidParallelism(f"parallelism {parallelism!r} must be a whole number >= 1")
    if parallelism > new_max:
        raise InvalidParallelism(
            f"parallelism {parallelism} exceeds max parallelism {new_max}; choose at most "
            f"{new_max}, or rescale to a larger max parallelism (--max-parallelism)"
        )
    return parallelism, new_max


# --- operator state ---


def redistribute_for_snapshot(
    rows_by_old: Sequence[Sequence[OperatorStateRow]], new_p: int
) -> list[list[OperatorStateRow]]:
    """Rows each new subtask stores, so that a restore's redistribution gives each mode's result."""
    old_p = len(rows_by_old)
    union = [[r for r in rows if r.mode == OperatorStateMode.UNION.value] for rows in rows_by_old]
    other = [[r for r in rows if r.mode != OperatorStateMode.UNION.value] for rows in rows_by_old]
    out = redistribute(other, new_p)
    per_state: dict[str, list[list[Any]]] = {}
    for old, rows in enumerate(union):
        for r in sorted(rows, key=lambda r: (r.state, r.index)):
            per_state.setdefault(r.state, [[] for _ in range(new_p)])
            # old subtask i goes whole to new subtask i * new_p // old_p: order is kept
            per_state[r.state][old * new_p // old_p].append(r.value)
    for name, parts in sorted(per_state.items()):
        for new, values in enumerate(parts):
            out[new].extend(
                OperatorStateRow(name, OperatorStateMode.UNION.value, new, i, v)
                for i, v in enumerate(values)
            )
    return out


def write_operator_state_files(
    src: SnapshotDir, meta: SnapshotMetadata, out: OutputSnapshot, new_p: int
) -> dict[str, list[SnapshotFile]]:
    files: dict[str, list[SnapshotFile]] = {}
    for op in meta.operators:
        rows = read_operator_state(src, meta, operator=op.operator_id)
        if not rows:
            continue
        parts = redistribute_for_snapshot(group_by_subtask(rows, meta.parallelism), new_p)
        for index, part in enumerate(parts):
            if part:
                f = write_operator_state(out.snapshot, [tuple(r) for r in part], subtask=index)
                files.setdefault(op.operator_id, []).append(f)
    return files


# --- same max parallelism: metadata only ---


def reuse_path(src: SnapshotDir, out: SnapshotDir, f: SnapshotFile) -> str:
    """``f``'s path as seen from the output directory (a sibling in the job's root)."""
    absolute = src.resolve(f.path)
    parent = posixpath.dirname(out.path)
    rel = posixpath.relpath(absolute, parent)
    top = rel.split("/", 1)[0]
    if (
        posixpath.dirname(src.path) != parent
        or rel.startswith("..")
        or not (top == SHARED_DIR or is_checkpoint_dir(top))
    ):
        raise SnapshotNotUsable(
            f"file {f.path!r} of {src.url} is not in the job's checkpoint directories, so a new "
            "checkpoint cannot reuse it; rescale checkpoints of the job's own storage, or restore "
            "a canonical savepoint at the new parallelism directly (it reads any parallelism)"
        )
    return "../" + rel


def metadata_only(
    catalog: Catalog,
    record: Any,
    src: SnapshotDir,
    meta: SnapshotMetadata,
    out: OutputSnapshot,
    new_p: int,
) -> tuple[SnapshotMetadata, list[RangeOutput]]:
    max_p = meta.max_parallelism
    stats = {(s.operator, s.key_group): s for s in catalog.key_group_stats(record.id)}
    files: dict[str, SnapshotFile] = {}
    operators = []
    outputs: list[RangeOutput] = []
    for op in meta.operators:
        keyed = meta.files_of(op.operator_id, kinds=(FileKind.KEYED,))
        subtasks = []
        for index in range(new_p if op.subtasks else 0):
            rng = compute_key_group_range_for_operator_index(max_p, new_p, index)
            mine = []
            for f in keyed:
                if f.row_groups_for(rng.start, rng.end):
                    moved = SnapshotFile(
                        reuse_path(src, out.snapshot, f), f.size, f.checksum, f.kind, f.rows,
                        f.key_groups,
                    )  # fmt: skip
                    files.setdefault(moved.path, moved)
                    mine.append(moved.path)
            subtasks.append(SubtaskSnapshot(index, (rng.start, rng.end), tuple(mine)))
            kg_stats = {
                kg: KeyGroupStats(s.rows, s.bytes)
                for kg in range(rng.start, rng.end + 1)
                if (s := stats.get((op.operator_id, kg))) is not None
            }
            outputs.append(
                RangeOutput(
                    WriteRange(op.operator_id, index, rng.start, rng.end),
                    tuple(files[p] for p in mine),
                    kg_stats,
                )
            )
        operators.append(
            OperatorSnapshot(op.operator_id, op.key_serializer, dict(op.states), tuple(subtasks))
        )
    op_files = write_operator_state_files(src, meta, out, new_p)
    operators = [
        OperatorSnapshot(
            o.operator_id,
            o.key_serializer,
            o.states,
            o.subtasks,
            tuple(f.path for f in op_files.get(o.operator_id, ())),
        )
        for o in operators
    ]
    for fs in op_files.values():
        files.update((f.path, f) for f in fs)
    new_meta = SnapshotMetadata(
        job=out.record.job,
        checkpoint_id=out.record.checkpoint_id,
        kind=SnapshotKind.CHECKPOINT,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=max_p,
        parallelism=new_p,
        operators=tuple(operators),
        files=tuple(files.values()),
    )
    return new_meta, outputs


# --- new max parallelism: re-bucketed by key hash ---


def rebucket_task(
    source_url: str,
    source_kind: str,
    meta: SnapshotMetadata,
    native: bool,
    new_max_p: int,
    wr: WriteRange,
    stats: ReadStats,
) -> Iterator[pa.RecordBatch]:
    """Task side: the live rows of one input range with their key group at ``new_max_p``."""
    src = open_source(source_url, source_kind)
    source = (
        native_subtask_batches(src, meta, wr.operator, wr.subtask, wr.first, wr.last, stats)
        if native
        else range_batches(src, meta, wr.operator, wr.first, wr.last, stats)
    )
    for b in source:
        kg = key_groups_for_hashes(int_values(b.column("key_hash")), new_max_p)
        kg_col = arrow_array(kg.astype(np.int32, copy=False))
        cols = [kg_col] + [b.column(n) for n in KEYED_SCHEMA.names[1:]]
        yield pa.RecordBatch.from_arrays(cols, schema=KEYED_SCHEMA)


#: Rows a first-wave task holds before it sorts them and spills one run per destination.
SPILL_RUN_BYTES = 256 << 20


def _spill_run(
    out: SnapshotDir, batches: list[pa.RecordBatch], pieces: int, new_max: int, name: str
) -> dict[int, str]:
    """Sort ``batches`` by new key group and write one uncompressed Arrow IPC file per destination.

    Destination ``d`` holds key groups ``[ceil(d * new_max / pieces), ...)``, monotonic in the
    key group, so one sort by the int32 key group orders the destinations as well: each file is
    a contiguous slice of the sorted rows, in key-group order.
    """
    table = pa.Table.from_batches(batches, schema=KEYED_SCHEMA)
    kg = int_values(table.column(0))
    order = np.argsort(kg, kind="stable")
    kg_sorted = kg[order]
    table = table.take(arrow_array(order))
    dest = (kg_sorted.astype(np.int64) * pieces) // new_max
    cuts = np.flatnonzero(np.diff(dest)) + 1
    local = out.store.is_local
    written: dict[int, str] = {}
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(dest)].tolist(), strict=True):
        d = int(dest[lo])
        rel = f"{SPILL_DIR}/{name.replace('{d}', str(d))}"
        path = out.resolve(rel)
        part = table.slice(lo, hi - lo)
        if local:
            out.store.makedirs(posixpath.dirname(path))
            sink: Any = pa.OSFile(path, "wb")
        else:
            sink = out.store.open_write(path)
        with sink, pa.ipc.new_file(sink, KEYED_SCHEMA) as w:
            w.write_table(part)
        written[d] = rel
    return written


def spill_range(
    source_url: str,
    source_kind: str,
    meta: SnapshotMetadata,
    native: bool,
    target: TargetSpec,
    pieces: int,
    wr: WriteRange,
    task: int,
) -> tuple[dict[int, list[str]], int, int]:
    """Task side, phase 1: one input range re-bucketed, spilled per destination write range.

    Rows are held up to :data:`SPILL_RUN_BYTES`, then sorted by new key group and spilled as one
    run: an uncompressed Arrow IPC file per destination under the PENDING output's ``_spill/``
    (every executor reaches it, as it reaches the output), removed before the commit.
    """
    out = target.open()
    new_max = target.max_parallelism
    rows = 0
    stats = ReadStats()
    written: dict[int, list[str]] = {}
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    runs = 0

    def flush() -> None:
        nonlocal held, held_bytes, runs
        if held:
            name = f"{wr.operator}-{{d}}-{task}-{runs}.arrow"
            for d, rel in _spill_run(out, held, pieces, new_max, name).items():
                written.setdefault(d, []).append(rel)
            runs += 1
        held, held_bytes = [], 0

    for b in rebucket_task(source_url, source_kind, meta, native, new_max, wr, stats):
        if b.num_rows == 0:
            continue
        rows += b.num_rows
        held.append(b)
        held_bytes += b.nbytes
        if held_bytes >= SPILL_RUN_BYTES:
            flush()
    flush()
    return written, rows, stats.bytes_read


def _open_spill(out: SnapshotDir, rel: str) -> pa.Table:
    if out.store.is_local:
        # memory-mapped: the table's buffers are the page cache's, nothing is copied
        return pa.ipc.open_file(pa.memory_map(out.resolve(rel))).read_all()
    with out.open_input(rel) as f:
        return pa.ipc.open_file(pa.py_buffer(f.read())).read_all()


def _merged(tables: list[pa.Table], first: int, last: int) -> Iterator[pa.RecordBatch]:
    """The rows of key-group-sorted ``tables`` in key-group order, as zero-copy slices."""
    bounds = [
        np.searchsorted(int_values(t.column(0)), np.arange(first, last + 2), side="left").tolist()
        for t in tables
    ]
    for i in range(last - first + 1):
        for t, b in zip(tables, bounds, strict=True):
            if b[i + 1] > b[i]:
                yield from t.slice(b[i], b[i + 1] - b[i]).to_batches()


def write_spilled(target: TargetSpec, wr: WriteRange, spills: list[str]) -> RangeOutput:
    """Task side, phase 2: one new write range from its spill runs (each sorted), merged."""
    out = target.open()
    tables = [_open_spill(out, rel) for rel in spills]
    return write_range(target, wr, _merged(tables, wr.first, wr.last))


#: Largest estimated input (bytes of keyed files) per task for the one-wave path.
DIRECT_GROUP_BYTES = 1 << 30
#: Rows the one-wave path sorts at a time (one run); the runs are merged as they are written.
DIRECT_RUN_BYTES = 64 << 20


def write_direct(
    source_url: str,
    source_kind: str,
    meta: SnapshotMetadata,
    read_ranges: list[WriteRange],
    target: TargetSpec,
    pieces: int,
    mine: list[tuple[int, WriteRange]],
) -> tuple[list[RangeOutput], int, int]:
    """Task side, one wave: every input range read, the rows of ``mine`` (consecutive destination
    write ranges of one operator) kept by a vectorised mask, sorted by new key group once and
    written range by range as zero-copy slices. No spill: the input is read once per task, which
    costs less than writing, reading and deleting the spill when the tasks are few.
    """
    new_max = target.max_parallelism
    lo_d, hi_d = mine[0][0], mine[-1][0]
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    runs: list[pa.Table] = []
    rows = 0
    stats = ReadStats()

    def sort_run() -> None:
        # sorted a run at a time: a gather within a run stays cache-friendly; the runs are then
        # merged by key group as zero-copy slices
        nonlocal held, held_bytes
        if held:
            table = pa.Table.from_batches(held, schema=KEYED_SCHEMA)
            order = np.argsort(int_values(table.column(0)), kind="stable")
            runs.append(table.take(arrow_array(order)))
        held, held_bytes = [], 0

    for wr in read_ranges:
        for b in rebucket_task(source_url, source_kind, meta, False, new_max, wr, stats):
            rows += b.num_rows
            d = (int_values(b.column(0)).astype(np.int64) * pieces) // new_max
            keep = (d >= lo_d) & (d <= hi_d)
            if keep.all():
                held.append(b)
            elif keep.any():
                held.append(b.filter(arrow_array(keep)))
            else:
                continue
            held_bytes += held[-1].nbytes
            if held_bytes >= DIRECT_RUN_BYTES:
                sort_run()
    sort_run()
    outputs: list[RangeOutput] = []
    try:
        for _, wr in mine:
            outputs.append(write_range(target, wr, _merged(runs, wr.first, wr.last)))
    except BaseException:
        # files of ranges this task finished are in no _metadata: remove them too
        snap = target.open()
        for o in outputs:
            for f in o.files:
                snap.remove_file(f.path)
        raise
    return outputs, rows, stats.bytes_read


def direct_groups(
    meta: SnapshotMetadata, operators: list[str], native: set[str], pieces: int, tasks: int
) -> int:
    """Tasks of the one-wave path for one operator (0: spill instead).

    Each task reads the operator's whole input and holds ``1/groups`` of it, so the path is taken
    for plain (not native) inputs small enough per task; ``groups`` is about the cores (``tasks``
    is twice the default parallelism).
    """
    if len(operators) != 1 or operators[0] in native:
        return 0
    groups = max(1, min(pieces, -(-tasks // 2)))
    size = sum(f.size for f in meta.files_of(operators[0], kinds=(FileKind.KEYED,)))
    return groups if size <= DIRECT_GROUP_BYTES * groups else 0


def rebucket(
    spark: SparkSession,
    src: SnapshotDir,
    record: Any,
    meta: SnapshotMetadata,
    out: OutputSnapshot,
    new_p: int,
    tasks: int,
    row_group_bytes: int | None,
) -> tuple[SnapshotMetadata, list[RangeOutput], int, int]:
    """Re-bucket every keyed operator into the output (two task waves, see module docstring)."""
    target = out.target(row_group_bytes=row_group_bytes)
    read_ranges, native = plan_read_ranges(meta, tasks)
    new_max = out.record.max_parallelism
    url, kind = src.url, record.kind
    operators = [op.operator_id for op in meta.operators if op.subtasks]
    write_ranges = plan_write_ranges(new_max, new_p, operators, tasks) if operators else []
    pieces = {op: sum(1 for r in write_ranges if r.operator == op) for op in operators}
    groups = direct_groups(meta, operators, native, len(write_ranges), tasks) if operators else 0
    if groups:
        op = operators[0]
        indexed = list(enumerate(write_ranges))
        n = len(indexed)
        jobs_direct = [indexed[i * n // groups : (i + 1) * n // groups] for i in range(groups)]
        direct = run_range_tasks(
            spark,
            jobs_direct,
            lambda g: write_direct(url, kind, meta, read_ranges, target, pieces[op], g),
        )
        crash_point("rescale.after_write")
        outputs = [o for outs, _, _ in direct for o in outs]
        rows_in = direct[0][1]
        bytes_in = sum(b for _, _, b in direct)
    else:
        try:
            spilled = run_range_tasks(
                spark,
                list(enumerate(read_ranges)),
                lambda t: spill_range(
                    url, kind, meta, t[1].operator in native, target, pieces[t[1].operator], t[1],
                    t[0],
                ),
            )  # fmt: skip
            crash_point("rescale.after_spill")
            by_dest: dict[tuple[str, int], list[str]] = {}
            for (_, wr), (written, _, _) in zip(enumerate(read_ranges), spilled, strict=True):
                for d, rels in written.items():
                    by_dest.setdefault((wr.operator, d), []).extend(rels)
            jobs: list[tuple[WriteRange, list[str]]] = []
            for op in operators:
                mine = [r for r in write_ranges if r.operator == op]
                jobs.extend((wr, by_dest.get((op, d), [])) for d, wr in enumerate(mine))
            outputs = run_range_tasks(spark, jobs, lambda j: write_spilled(target, j[0], j[1]))
            crash_point("rescale.after_write")
            rows_in = sum(r for _, r, _ in spilled)
            bytes_in = sum(b for _, _, b in spilled)
        finally:
            # spill files are never part of the snapshot: gone before _metadata is written
            snap = out.snapshot
            snap.store.delete_tree(snap.resolve(SPILL_DIR))
    op_files = write_operator_state_files(src, meta, out, new_p)
    template = SnapshotMetadata(
        job=meta.job,
        checkpoint_id=out.record.checkpoint_id,
        kind=out.kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=new_max,
        parallelism=new_p,
        operators=meta.operators,
        files=(),
    )
    return out.metadata(template, outputs, op_files), outputs, rows_in, bytes_in


#: How long a metadata-only rescale waits for a deleting job to release the file lease.
LEASE_WAIT_S = 600.0


@maintenance_job(KIND, resolve_input)
def run(
    spark: SparkSession,
    catalog: Catalog,
    ctx: RunContext,
    *,
    snapshot: int,
    parallelism: int | None = None,
    job: str | None = None,
    max_parallelism: int | None = None,
    kind: str | None = None,
    savepoint_dir: str | None = None,
    tasks: int | None = None,
    row_group_bytes: int | None = None,
) -> JobResult:
    """Rescale snapshot ``snapshot`` to ``parallelism`` (and ``max_parallelism``, if new)."""
    record = catalog.get_snapshot(snapshot)
    # The job's recorded max parallelism is the one its next restore checks, and it may differ
    # from an older snapshot's (an earlier rescale changed it): the default target is the job's,
    # and only a rescale that leaves both unchanged may reuse the input's files.
    job_max = catalog.get_job(record.job).max_parallelism
    new_p, new_max = check_target(parallelism, max_parallelism, job_max)
    same = new_max == record.max_parallelism == job_max
    if same and (kind or SnapshotKind.CHECKPOINT).upper() != SnapshotKind.CHECKPOINT:
        raise InvalidJobParams(
            "a rescale at the same max parallelism is a checkpoint over the input's files; a "
            "savepoint must hold its own files: take it with the savepoint job instead"
        )

    def plan(inp: InputSnapshot) -> Rewrite:
        if same and inp.record.kind is not SnapshotKind.CHECKPOINT:
            raise SnapshotNotUsable(
                f"snapshot {inp.record.id} is a savepoint; a checkpoint must not depend on files "
                "the user owns: restore the savepoint at the new parallelism directly (canonical "
                "snapshots read at any parallelism), or rescale a checkpoint"
            )

        def write(out: OutputSnapshot) -> Written:
            if same:
                meta, outputs = metadata_only(
                    catalog, inp.record, inp.snapshot, inp.meta, out, new_p
                )
                rows_in, bytes_in = inp.record.entries, 0
            else:
                meta, outputs, rows_in, bytes_in = rebucket(
                    spark,
                    inp.snapshot,
                    inp.record,
                    inp.meta,
                    out,
                    new_p,
                    min_tasks(spark, tasks),
                    row_group_bytes,
                )
            written = [f for f in meta.files if not f.shared]
            stats = {
                "files_reused": sum(1 for f in meta.files if f.shared),
                "files_written": len(written),
                "output_kind": out.kind,
            }
            return Written(
                outputs,
                meta=meta,
                rows_in=rows_in,
                bytes_in=bytes_in,
                bytes_out=sum(f.size for f in written),
                stats=stats,
            )

        def finish(output: SnapshotRecord, *, recovered: bool) -> dict[str, Any]:
            if not recovered:
                crash_point("rescale.after_complete")
            if not same:
                catalog.set_job_max_parallelism(record.job, new_max)
            return {}

        return Rewrite(
            SnapshotKind.CHECKPOINT if same else (kind or SnapshotKind.SAVEPOINT),
            new_p,
            new_max,
            write,
            stats={
                "input_format": str(inp.format),
                "from_parallelism": inp.meta.parallelism,
                "to_parallelism": new_p,
                "from_max_parallelism": inp.meta.max_parallelism,
                "to_max_parallelism": new_max,
                "metadata_only": same,
            },
            savepoint_dir=None if same else savepoint_dir,
            finish=finish,
        )

    # A metadata-only rescale makes a new checkpoint over the source's files: hold the job's
    # file lease from reading the source until those files are attached to the new snapshot, so
    # neither the running job's release nor expire/orphan cleanup can delete them in between.
    return rewrite_run(
        catalog,
        ctx,
        snapshot,
        reads=(SnapshotFormat.CANONICAL,) if same else tuple(SnapshotFormat),
        plan=plan,
        hold=FileLease(catalog, record.job, KIND, ctx.run_id, wait=LEASE_WAIT_S) if same else None,
    )
