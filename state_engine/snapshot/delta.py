"""The heap-incremental delta format: the puts and deletes since the parent snapshot.

Delta rows are canonical rows plus ``op`` (PUT=0, DELETE=1, CLEAR=2) and ``seq`` (the write
sequence within the delta). A delete carries the identifying columns and an empty value. A clear
carries ``(key_group, key, namespace, state)``, no user key and an empty value, and removes every
row of that (state, key, namespace), whatever user keys it had. A heap delta writes a map entry
put or removed on its own as a PUT or DELETE of that entry, a value state's new value as one PUT
(its one row has no user key), and any other changed (state, key, namespace) as CLEAR followed
by PUTs of its complete current rows, so it never needs the old rows.
A chain of deltas rests on a full canonical base; ``chain_index`` in ``_metadata`` orders the
deltas (1 = first).

The fold rule, shared with the Spark compaction job: per identity
``(key_group, key, namespace, state, user_key)`` the row with the greatest
``(chain_index, seq)`` wins, the base counting as chain index 0; a winning DELETE removes the
entry; a CLEAR removes every identity of its ``(key_group, key, namespace, state)`` written
before it (lower ``(chain_index, seq)``). Within one delta file, rows with equal ``seq``
resolve by file order (later wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.errors import CorruptMetadata, InvalidStateRows
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    CanonicalWriter,
    arrow_array,
    as_table,
    batches_to_entries,
    binary_lengths,
    int_values,
    is_valid,
    read_key_groups,
)
from state_engine.snapshot.metadata import FileKind, SnapshotFile, SnapshotMetadata
from state_engine.snapshot.storage import ReadStats, SnapshotDir
from state_engine.state.meta import StateEntry

PUT = 0
DELETE = 1
CLEAR = 2
OPS = (PUT, DELETE, CLEAR)

DELTA_SCHEMA = KEYED_SCHEMA.append(pa.field("op", pa.int8(), nullable=False)).append(
    pa.field("seq", pa.int64(), nullable=False)
)


class DeltaEntry(NamedTuple):
    """One change: a StateEntry's fields, then ``op`` (PUT/DELETE) and ``seq``."""

    key_group: int
    key_hash: int
    key: bytes
    namespace: bytes
    state: str
    user_key: bytes | None
    value: bytes
    expires_at: int | None
    op: int
    seq: int


Identity = tuple[int, bytes, bytes, str, bytes | None]


def identity(row: Sequence[Any]) -> Identity:
    """The fold identity of a row: ``(key_group, key, namespace, state, user_key)``."""
    return (row[0], row[2], row[3], row[4], row[5])


class DeltaWriter(CanonicalWriter):
    """A :class:`CanonicalWriter` for delta rows (same row-group alignment and index)."""

    schema = DELTA_SCHEMA
    kind = FileKind.DELTA

    def __init__(self, snapshot: SnapshotDir, *, chain_index: int, **options: Any) -> None:
        if isinstance(chain_index, bool) or not isinstance(chain_index, int) or chain_index < 1:
            raise InvalidStateRows(
                f"delta chain_index {chain_index!r} for snapshot {snapshot.url} must be an "
                "integer >= 1 (its position after the base)"
            )
        super().__init__(snapshot, chain_index=chain_index, **options)

    def _extra_row_bytes(self, batch: pa.RecordBatch) -> int:
        return 9  # op (int8) + seq (int64)

    def _validate_batch(self, batch: pa.RecordBatch) -> None:
        # NumPy over the Arrow buffers, not pyarrow.compute with Python scalars: converting a
        # scalar imports pandas (seconds on the checkpoint thread, see canonical._from_buffers)
        op = int_values(batch.column("op"))
        bad_op = (op < min(OPS)) | (op > max(OPS))
        if bad_op.any():
            raise InvalidStateRows(
                f"delta rows for snapshot {self._where} have op {int(op[bad_op][0])}; use PUT "
                f"({PUT}), DELETE ({DELETE}) or CLEAR ({CLEAR})"
            )
        if ((op != PUT) & (binary_lengths(batch.column("value")) > 0)).any():
            raise InvalidStateRows(
                f"delta rows for snapshot {self._where} hold a DELETE or CLEAR with a value; they "
                "carry the identifying columns and an empty value (b'')"
            )
        if ((op == CLEAR) & is_valid(batch.column("user_key"))).any():
            raise InvalidStateRows(
                f"delta rows for snapshot {self._where} hold a CLEAR with a user key; a clear "
                "removes a whole (state, key, namespace): leave user_key None"
            )


def fold(
    base_rows: Iterable[Sequence[Any]], deltas: Iterable[Iterable[Sequence[Any]]]
) -> list[StateEntry]:
    """Apply a chain of deltas, in order, onto base rows; return the live entries.

    The result is sorted by key group, then identity (deterministic, so two folds of the same
    chain compare equal).
    """
    # Rows are kept as they come (StateEntry or plain tuples) and made StateEntry only if they
    # survive the fold: most PUTs of a long chain are overwritten by a later delta.
    live: dict[tuple[int, bytes, bytes, str], dict[bytes | None, Sequence[Any]]] = {}
    for row in base_rows:
        live.setdefault((row[0], row[2], row[3], row[4]), {})[row[5]] = row
    for position, delta in enumerate(deltas, start=1):
        rows = list(delta)
        bad = [r for r in rows if len(r) != len(DELTA_SCHEMA)]
        if bad:
            raise InvalidStateRows(
                f"delta {position} of the chain has a row with {len(bad[0])} fields; delta rows "
                f"have {len(DELTA_SCHEMA)} ({', '.join(DELTA_SCHEMA.names)})"
            )
        for row in sorted(rows, key=lambda r: r[9]):  # stable: equal seq keeps file order
            group = (row[0], row[2], row[3], row[4])
            if row[8] == PUT:
                live.setdefault(group, {})[row[5]] = row
            elif row[8] == DELETE:
                held = live.get(group)
                if held is not None:
                    held.pop(row[5], None)
                    if not held:
                        del live[group]
            elif row[8] == CLEAR:
                live.pop(group, None)
            else:
                raise InvalidStateRows(
                    f"delta {position} of the chain has op {row[8]!r}; use PUT ({PUT}), "
                    f"DELETE ({DELETE}) or CLEAR ({CLEAR})"
                )
    make = StateEntry._make
    return sorted(
        (
            e if type(e) is StateEntry else make(e[:8])
            for held in live.values()
            for e in held.values()
        ),
        key=_sort_key,
    )


def _sort_key(e: StateEntry) -> tuple[Any, ...]:
    return (e.key_group, e.key, e.namespace, e.state, e.user_key is not None, e.user_key or b"")


def fold_tables(base: pa.Table | None, deltas: Sequence[pa.Table]) -> pa.Table:
    """:func:`fold` on Arrow tables, vectorised: the live rows of ``base`` (canonical rows, or
    None) with ``deltas`` (delta rows, in chain order) applied, as a canonical table in
    key-group order.

    Every row gets a stamp, its position in the chain (the base first, then each delta stably
    sorted by ``seq``); identities and (key group, key, namespace, state) groups become integer
    ids through Arrow's hash-based dictionary encoding, so the rule costs a few linear passes:
    a row survives only after its group's last CLEAR, and per identity the last surviving row
    wins if it is a PUT.
    """
    parts = []
    with_base = base is not None and base.num_rows > 0
    if base is not None and with_base:
        n = base.num_rows
        columns = base.select(KEYED_SCHEMA.names).cast(KEYED_SCHEMA).columns
        op_seq = [arrow_array(np.full(n, PUT, dtype=np.int8)), arrow_array(np.zeros(n, np.int64))]
        parts.append(pa.Table.from_arrays([*columns, *op_seq], schema=DELTA_SCHEMA))
    for position, delta in enumerate(deltas, start=1):
        if delta.num_rows == 0:
            continue
        missing = [name for name in DELTA_SCHEMA.names if name not in delta.column_names]
        if missing:
            raise InvalidStateRows(
                f"delta {position} of the chain lacks column(s) {', '.join(missing)}; delta rows "
                f"have {len(DELTA_SCHEMA)} ({', '.join(DELTA_SCHEMA.names)})"
            )
        delta = delta.select(DELTA_SCHEMA.names).cast(DELTA_SCHEMA)
        seq = int_values(delta.column("seq"))
        if len(seq) > 1 and (seq[1:] < seq[:-1]).any():
            delta = delta.take(arrow_array(np.argsort(seq, kind="stable")))
        op = int_values(delta.column("op"))
        bad = (op != PUT) & (op != DELETE) & (op != CLEAR)
        if bad.any():
            raise InvalidStateRows(
                f"delta {position} of the chain has op {int(op[bad][0])}; use PUT ({PUT}), "
                f"DELETE ({DELETE}) or CLEAR ({CLEAR})"
            )
        parts.append(delta)
    if not parts:
        return KEYED_SCHEMA.empty_table()
    if len(parts) == 1 and with_base:
        return _in_key_group_order(parts[0].select(KEYED_SCHEMA.names))  # the base alone
    chain = pa.concat_tables(parts)
    op = int_values(chain.column("op"))
    stamp = np.arange(chain.num_rows, dtype=np.int64)
    group = _ids([chain.column(c) for c in ("key_group", "key", "namespace", "state")])
    survives = op != CLEAR
    cleared = ~survives
    if cleared.any():
        last_clear = np.full(int(group.max()) + 1, -1, dtype=np.int64)
        np.maximum.at(last_clear, group[cleared], stamp[cleared])
        survives &= stamp > last_clear[group]
    rows = stamp[survives]
    ident = _densify(_pair(group[rows], _ids([chain.column("user_key")])[rows]))
    last = np.full(int(ident.max()) + 1 if len(ident) else 0, -1, dtype=np.int64)
    np.maximum.at(last, ident, rows)
    last = last[last >= 0]  # ids are bounded, not dense
    winners = last[op[last] == PUT]
    # chain order within a key group (list elements need it), key groups ascending: one take
    winners.sort()
    kg = int_values(chain.column("key_group"))[winners]
    if len(kg) > 1 and (kg[1:] < kg[:-1]).any():
        winners = winners[np.argsort(kg, kind="stable")]
    return chain.select(KEYED_SCHEMA.names).take(arrow_array(winners))


def _in_key_group_order(table: pa.Table) -> pa.Table:
    kg = int_values(table.column("key_group"))
    if len(kg) < 2 or (kg[1:] >= kg[:-1]).all():
        return table
    return table.take(arrow_array(np.argsort(kg, kind="stable")))


def _ids(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Bounded int64 ids (0 <= id < 2 * rows) of the rows' values in ``columns``, equal exactly
    when the values are (a null is a value of its own)."""
    out: np.ndarray | None = None
    for col in columns:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if pa.types.is_integer(col.type):
            codes = int_values(col).astype(np.int64)
            codes = codes - codes.min() if len(codes) else codes
        else:
            enc = pc.dictionary_encode(col)
            codes = int_values(enc.indices, null=-1).astype(np.int64) + 1
        out = codes if out is None else _densify(_pair(out, codes))
    assert out is not None
    return _densify(out)


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One int64 per (a, b) pair of non-negative ids, equal exactly when both are."""
    width = int(b.max()) + 1 if len(b) else 1
    if len(a) and int(a.max()) >= (1 << 62) // width:
        raise InvalidStateRows(f"too many distinct identities to fold ({len(a)} rows)")
    paired: np.ndarray = a * width + b
    return paired


def _densify(codes: np.ndarray) -> np.ndarray:
    """``codes`` (non-negative) renumbered below ``2 * len(codes)``: as they are if they already
    are, else 0..m-1 in order of first appearance (a hash pass, no sort)."""
    if len(codes) == 0:
        return codes
    if int(codes.max()) < 2 * len(codes):
        return codes  # already small: ids need not be contiguous, only bounded
    enc = pc.dictionary_encode(arrow_array(codes))
    return int_values(enc.indices).astype(np.int64)


def read_folded_table(
    snapshot: SnapshotDir,
    meta: SnapshotMetadata,
    key_group_range: tuple[int, int],
    *,
    operator: str | None = None,
    stats: ReadStats | None = None,
) -> pa.Table:
    """The live rows of ``key_group_range`` in a delta snapshot as one canonical table in
    key-group order: its base with its delta files folded on in ``chain_index`` order (each
    file read only for the range's row groups), by :func:`fold_tables`."""
    base, chain = _chain_files(snapshot, meta, operator)

    def table(files: list[SnapshotFile], schema: pa.Schema) -> pa.Table:
        return as_table(
            read_key_groups(snapshot, meta, key_group_range, files=files, stats=stats), schema
        )

    return fold_tables(
        table(base, KEYED_SCHEMA), [table(chain[i], DELTA_SCHEMA) for i in sorted(chain)]
    )


def _chain_files(
    snapshot: SnapshotDir, meta: SnapshotMetadata, operator: str | None
) -> tuple[list[SnapshotFile], dict[int, list[SnapshotFile]]]:
    """An operator's keyed base files and its delta files by chain index."""
    op = meta.operator(operator)
    by_path = {f.path: f for f in meta.files}
    paths = dict.fromkeys(p for s in op.subtasks for p in s.files)
    base = [by_path[p] for p in paths if by_path[p].kind is FileKind.KEYED]
    chain: dict[int, list[SnapshotFile]] = {}
    for p in paths:
        f = by_path[p]
        if f.kind is FileKind.DELTA:
            if f.chain_index is None:
                raise CorruptMetadata(
                    f"_metadata of snapshot {snapshot.url}: field chain_index of delta file "
                    f"{f.path!r} is missing; restore from another snapshot"
                )
            chain.setdefault(f.chain_index, []).append(f)
    return base, chain


def read_folded(
    snapshot: SnapshotDir,
    meta: SnapshotMetadata,
    key_group_range: tuple[int, int],
    *,
    operator: str | None = None,
    stats: ReadStats | None = None,
) -> Iterator[StateEntry]:
    """The live entries of ``key_group_range`` in a delta snapshot: its base folded with its
    delta files in ``chain_index`` order (each read only for the range's row groups)."""
    base, chain = _chain_files(snapshot, meta, operator)
    base_rows = batches_to_entries(
        read_key_groups(snapshot, meta, key_group_range, files=base, stats=stats)
    )
    deltas = (
        _delta_rows(read_key_groups(snapshot, meta, key_group_range, files=chain[i], stats=stats))
        for i in sorted(chain)
    )
    yield from fold(base_rows, deltas)


def _delta_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[Any, ...]]:
    # plain tuples in DeltaEntry's field order: fold reads them by position
    for batch in batches:
        cols = [batch.column(name).to_pylist() for name in DELTA_SCHEMA.names]
        yield from zip(*cols, strict=True)
