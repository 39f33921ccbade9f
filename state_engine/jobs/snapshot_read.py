"""Task side: the live canonical rows of any COMPLETED snapshot, one key-group range at a time.

Used by compaction, savepoint and rescale, inside Spark tasks:

- canonical: the range's row groups, through the key-group index (:func:`read_key_groups`);
- delta (heap incremental chain): the base and delta row groups of the range, folded with the
  rule of :mod:`state_engine.snapshot.delta`, vectorised (:func:`fold_range`);
- native (RocksDB): one old subtask's SST and private files copied into a local scratch
  directory, opened with rocksdict (through the RocksDB backend, which knows the key layout) and
  exported as canonical rows (:func:`native_subtask_batches`).

Every reader yields canonical batches in key-group order, ready for ``write_range``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.errors import CorruptMetadata
from state_engine.keygroups import KeyGroupRange
from state_engine.maintenance.ranges import WriteRange, plan_write_ranges
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    arrow_array,
    bool_values,
    int_values,
    read_key_groups,
)
from state_engine.snapshot.delta import CLEAR, PUT
from state_engine.snapshot.metadata import (
    NATIVE_KINDS,
    FileKind,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
)
from state_engine.snapshot.storage import ReadStats, SnapshotDir

_GROUP = ("key_group", "key", "namespace", "state")
_BATCH_ROWS = 16384


def split_chain(
    meta: SnapshotMetadata, op: OperatorSnapshot
) -> tuple[list[SnapshotFile], dict[int, list[SnapshotFile]]]:
    """An operator's keyed base files and its delta files by chain index."""
    by_path = {f.path: f for f in meta.files}
    base: list[SnapshotFile] = []
    chain: dict[int, list[SnapshotFile]] = {}
    for p in dict.fromkeys(p for s in op.subtasks for p in s.files):
        f = by_path[p]
        if f.kind is FileKind.KEYED:
            base.append(f)
        elif f.kind is FileKind.DELTA:
            if f.chain_index is None:
                raise CorruptMetadata(
                    f"_metadata of snapshot {meta.job}/{meta.checkpoint_id}: delta file {p!r} has "
                    "no chain_index; compact or restore from another snapshot"
                )
            chain.setdefault(f.chain_index, []).append(f)
    # the base in key-group order: a subtask's files are already in order, subtasks sort by range
    return base, chain


def range_batches(
    src: SnapshotDir,
    meta: SnapshotMetadata,
    operator: str,
    first: int,
    last: int,
    stats: ReadStats,
) -> Iterator[pa.RecordBatch]:
    """The live rows of ``first..last`` of a canonical or delta snapshot, key-group order."""
    op = meta.operator(operator)
    base, chain = split_chain(meta, op)
    base_batches = read_key_groups(src, meta, (first, last), files=base, stats=stats)
    if not chain:
        yield from base_batches
        return
    deltas = [
        list(read_key_groups(src, meta, (first, last), files=chain[i], stats=stats))
        for i in sorted(chain)
    ]
    yield from fold_range(base_batches, deltas)


def _pack(kg: np.ndarray, kh: np.ndarray) -> np.ndarray:
    return (kg.astype(np.int64) << 32) | (kh.astype(np.int64) & 0xFFFFFFFF)


def fold_range(
    base: Iterable[pa.RecordBatch], deltas: list[list[pa.RecordBatch]]
) -> Iterator[pa.RecordBatch]:
    """Fold delta batches (``deltas[i]`` = chain index i + 1) onto base batches.

    Base rows whose (key group, key hash) no delta touches pass through untouched; only the
    touched ones (a superset of the touched identities: hashes can collide) are folded exactly:
    per identity the greatest (chain index, seq, position in the chain index's files) wins, a
    CLEAR removes every row of its (key group, key, namespace, state) stamped before it.
    """
    parts = []
    pos = 0
    for ci, batches in enumerate(deltas, start=1):
        for b in batches:
            if b.num_rows == 0:
                continue
            n = b.num_rows
            parts.append(
                pa.table(
                    {
                        **{name: b.column(name) for name in KEYED_SCHEMA.names},
                        "op": b.column("op").cast(pa.int8()),
                        "ci": arrow_array(np.full(n, ci, dtype=np.int32)),
                        "seq": b.column("seq").cast(pa.int64()),
                        "pos": arrow_array(np.arange(pos, pos + n, dtype=np.int64)),
                    }
                )
            )
            pos += n
    if not parts:
        yield from base
        return
    delta = pa.concat_tables(parts)
    touched = np.unique(
        _pack(
            int_values(delta.column("key_group")),
            int_values(delta.column("key_hash")),
        )
    )
    kept: list[pa.RecordBatch] = []
    candidates: list[pa.Table] = []
    for b in base:
        if b.num_rows == 0:
            continue
        hit = np.isin(
            _pack(
                int_values(b.column("key_group")),
                int_values(b.column("key_hash")),
            ),
            touched,
        )
        if not hit.any():
            kept.append(b)
            continue
        kept.append(b.filter(arrow_array(~hit)))
        c = pa.Table.from_batches([b.filter(arrow_array(hit))])
        n = c.num_rows
        candidates.append(
            c.append_column("op", arrow_array(np.full(n, PUT, dtype=np.int8)))
            .append_column("ci", arrow_array(np.zeros(n, dtype=np.int32)))
            .append_column("seq", arrow_array(np.zeros(n, dtype=np.int64)))
            .append_column("pos", arrow_array(np.full(n, -1, dtype=np.int64)))
        )
    union = pa.concat_tables([*candidates, delta.cast(candidates[0].schema)] if candidates
                             else [delta])  # fmt: skip
    winners = _fold_exact(union)
    merged = pa.concat_tables(
        [
            pa.Table.from_batches(kept, schema=KEYED_SCHEMA)
            if kept
            else KEYED_SCHEMA.empty_table(),
            winners,
        ]  # fmt: skip
    )
    if merged.num_rows == 0:
        return
    # kept rows are in key-group order already; a stable sort places the folded ones among them
    order = np.argsort(int_values(merged.column("key_group")), kind="stable")
    yield from merged.take(arrow_array(order)).combine_chunks().to_batches(_BATCH_ROWS)


def _same_as_previous(table: pa.Table, columns: Iterable[str]) -> np.ndarray:
    """For sorted ``table``: True where a row equals the previous one on ``columns``."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for name in columns:
        col = table.column(name).combine_chunks()
        a, b = col.slice(1), col.slice(0, n - 1)
        eq = bool_values(pc.equal(a, b))
        if col.null_count:
            both = bool_values(pc.and_(pc.is_null(a), pc.is_null(b)))
            eq = eq | both
        same &= eq
    return np.concatenate([[False], same]) if n else np.zeros(0, dtype=bool)


def _fold_exact(union: pa.Table) -> pa.Table:
    stamp = [("ci", "ascending"), ("seq", "ascending"), ("pos", "ascending")]
    # 1. CLEAR: within a group in stamp order, a row survives only after the group's last clear
    t = union.sort_by([(c, "ascending") for c in _GROUP] + stamp)
    n = t.num_rows
    group_id = np.cumsum(~_same_as_previous(t, _GROUP)) - 1
    is_clear = int_values(t.column("op")) == CLEAR
    idx = np.arange(n)
    last_clear = np.full(group_id[-1] + 1 if n else 0, -1, dtype=np.int64)
    np.maximum.at(last_clear, group_id[is_clear], idx[is_clear])
    t = t.filter(arrow_array(idx > last_clear[group_id]))
    # 2. per identity the greatest stamp wins; a winning DELETE removes the entry
    identity = (*_GROUP, "user_key")
    t = t.sort_by([(c, "ascending") for c in identity] + stamp)
    m = t.num_rows
    if m == 0:
        return KEYED_SCHEMA.empty_table()
    same_next = np.concatenate([_same_as_previous(t, identity)[1:], [False]])
    win = ~same_next & (int_values(t.column("op")) == PUT)
    return t.filter(arrow_array(win)).select(KEYED_SCHEMA.names).cast(KEYED_SCHEMA)


# --- native RocksDB ---


def native_subtask_batches(
    src: SnapshotDir,
    meta: SnapshotMetadata,
    operator: str,
    subtask: int,
    first: int,
    last: int,
    stats: ReadStats,
    scratch_root: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of ``first..last`` held by old ``subtask``'s RocksDB files, as canonical batches.

    The DB is copied (every checksum checked) into a scratch directory of this task by the
    RocksDB package's native restore, opened aside and removed afterwards.
    """
    from state_engine.backends.rocksdb.restore import opened_aside
    from state_engine.serde import SerializerSnapshot, serializer_from_snapshot
    from state_engine.snapshot.native import NativeSource

    op = meta.operator(operator)
    st = next(s for s in op.subtasks if s.index == subtask)
    if op.key_serializer is None:
        return
    key_ser = serializer_from_snapshot(SerializerSnapshot.from_dict(op.key_serializer))
    with opened_aside(NativeSource(src, meta, st, stats), key_ser, scratch_root) as view:
        yield from entries_to_batches(view.iter_entries(KeyGroupRange.of(first, last)))


def entries_to_batches(entries: Iterable[tuple[Any, ...]]) -> Iterator[pa.RecordBatch]:
    """StateEntry tuples (key-group order) as canonical batches."""
    it = iter(entries)
    while True:
        chunk = []
        for row in it:
            chunk.append(row)
            if len(chunk) >= _BATCH_ROWS:
                break
        if not chunk:
            return
        cols = list(zip(*chunk, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(cols, KEYED_SCHEMA, strict=True)],
            schema=KEYED_SCHEMA,
        )
        if len(chunk) < _BATCH_ROWS:
            return


def estimated_key_group_bytes(meta: SnapshotMetadata, operator: str) -> np.ndarray:
    """Stored bytes per key group of an operator's keyed and delta files, from their indexes.

    A file's bytes are spread over its row groups, a row group's over its key groups.
    """
    est = np.zeros(meta.max_parallelism, dtype=np.float64)
    for f in meta.files_of(operator, kinds=(FileKind.KEYED, FileKind.DELTA)):
        if not f.key_groups:
            continue
        rgs = max(r.last_row_group for r in f.key_groups) + 1
        per_rg = f.size / rgs
        for r in f.key_groups:
            n_rg = r.last_row_group - r.first_row_group + 1
            n_kg = r.last_key_group - r.first_key_group + 1
            est[r.first_key_group : r.last_key_group + 1] += per_rg * n_rg / n_kg
    return est


def plan_read_ranges(meta: SnapshotMetadata, min_tasks: int) -> tuple[list[WriteRange], set[str]]:
    """Ranges of every keyed operator to read a task each: canonical and delta ones cut for
    ``min_tasks`` tasks; native operators one per old subtask (a DB is read whole); and which
    operators are native."""
    native: set[str] = set()
    ranges: list[WriteRange] = []
    plain = []
    by_path = {f.path: f for f in meta.files}
    for op in meta.operators:
        if not op.subtasks:
            continue
        if any(by_path[p].kind in NATIVE_KINDS for s in op.subtasks for p in s.files):
            native.add(op.operator_id)
            ranges.extend(
                WriteRange(op.operator_id, s.index, *s.key_group_range)
                for s in sorted(op.subtasks, key=lambda s: s.index)
            )
        else:
            plain.append(op.operator_id)
    if plain:
        ranges.extend(plan_write_ranges(meta.max_parallelism, meta.parallelism, plain, min_tasks))
    return ranges, native
