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

import pyarrow as pa

from state_engine.checkpoint.canonical import (
    KEYED_SCHEMA,
    CanonicalWriter,
    batches_to_entries,
    binary_lengths,
    int_values,
    is_valid,
    read_key_groups,
)
from state_engine.checkpoint.metadata import FileKind, SnapshotFile, SnapshotMetadata
from state_engine.checkpoint.storage import ReadStats, SnapshotDir
from state_engine.errors import CorruptMetadata, InvalidStateRows
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
