"""Heap-incremental deltas: puts and deletes on a base, folded by (chain position, seq)."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.errors import InvalidStateRows
from state_engine.snapshot.canonical import KEYED_SCHEMA, CanonicalWriter, state_columns
from state_engine.snapshot.delta import (
    CLEAR,
    DELETE,
    DELTA_SCHEMA,
    PUT,
    DeltaEntry,
    DeltaWriter,
    fold,
    fold_tables,
    read_folded,
    read_folded_table,
)
from state_engine.snapshot.metadata import (
    OperatorSnapshot,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
    verify,
    write_metadata,
)
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind
from state_engine.state.meta import StateEntry

MAX_P = 16

# (key group, key, user key or None, value or None for a delete)
operations = st.lists(
    st.tuples(
        st.integers(0, MAX_P - 1),
        st.sampled_from([b"a", b"b", b"c"]),
        st.sampled_from([None, b"", b"u"]),
        st.none() | st.binary(min_size=1, max_size=4),
    ),
    max_size=80,
)


def _entry(kg: int, key: bytes, user_key: bytes | None, value: bytes) -> StateEntry:
    return StateEntry(kg, 0, key, b"", "s", user_key, value, None)


def _model(ops: list[tuple]) -> dict:
    state: dict = {}
    for kg, key, uk, value in ops:
        if value is None:
            state.pop((kg, key, uk), None)
        else:
            state[(kg, key, uk)] = value
    return state


def _as_deltas(segments: list[list[tuple]], first_seq: int) -> list[list[DeltaEntry]]:
    """Each segment as a delta file: rows in key-group order (not seq order), seq increasing."""
    deltas = []
    seq = first_seq
    for segment in segments:
        rows = []
        for kg, key, uk, value in segment:
            op = PUT if value is not None else DELETE
            rows.append(DeltaEntry(kg, 0, key, b"", "s", uk, value or b"", None, op, seq))
            seq += 1
        deltas.append(sorted(rows, key=lambda r: r.key_group))
    return deltas


def _expected(ops: list[tuple]) -> list[StateEntry]:
    live = [_entry(kg, key, uk, v) for (kg, key, uk), v in _model(ops).items()]
    return fold(live, [])


@given(ops=operations, cuts=st.lists(st.integers(0, 80), max_size=4))
def test_fold_equals_replaying_every_operation(ops: list[tuple], cuts: list[int]) -> None:
    bounds = sorted({0, len(ops), *(min(c, len(ops)) for c in cuts)})
    segments = [ops[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [[]]
    base_ops, delta_segments = segments[0], segments[1:]
    base = _expected(base_ops)
    assert fold(base, _as_deltas(delta_segments, first_seq=100)) == _expected(ops)


def test_later_delta_wins_over_higher_seq_in_an_earlier_one() -> None:
    first = [DeltaEntry(1, 0, b"k", b"", "s", None, b"old", None, PUT, 50)]
    second = [DeltaEntry(1, 0, b"k", b"", "s", None, b"new", None, PUT, 3)]
    assert [e.value for e in fold([], [first, second])] == [b"new"]
    deleted = [DeltaEntry(1, 0, b"k", b"", "s", None, b"", None, DELETE, 1)]
    assert fold([_entry(1, b"k", None, b"base")], [first, deleted]) == []


def test_user_key_none_and_empty_are_different_entries() -> None:
    base = [_entry(2, b"k", None, b"v1"), _entry(2, b"k", b"", b"v2")]
    delete_none = [DeltaEntry(2, 0, b"k", b"", "s", None, b"", None, DELETE, 1)]
    assert fold(base, [delete_none]) == [_entry(2, b"k", b"", b"v2")]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=operations,
    cuts=st.lists(st.integers(0, 80), min_size=1, max_size=3),
    asked=st.tuples(st.integers(0, MAX_P - 1), st.integers(0, MAX_P - 1)).map(sorted),
)
def test_a_delta_chain_on_storage_reads_back_folded(
    storage: CheckpointStorage, ops: list[tuple], cuts: list[int], asked: list[int]
) -> None:
    bounds = sorted({0, len(ops), *(min(c, len(ops)) for c in cuts)})
    segments = [ops[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [[]]
    job = f"job-{uuid.uuid4().hex}"
    snap = storage.checkpoint(job, len(segments) + 1)
    with CanonicalWriter(
        snap, subtask=0, max_parallelism=MAX_P, directory="../shared", row_group_bytes=64
    ) as base_writer:
        base_writer.write(_expected(segments[0]))
    files = list(base_writer.finish().files)
    for i, delta in enumerate(_as_deltas(segments[1:], first_seq=0), start=1):
        with DeltaWriter(
            snap,
            chain_index=i,
            subtask=0,
            max_parallelism=MAX_P,
            directory="../shared",
            row_group_bytes=64,
        ) as writer:
            writer.write(delta)
        files.extend(writer.finish().files)
    meta = SnapshotMetadata(
        job=job,
        checkpoint_id=len(segments) + 1,
        kind=SnapshotKind.CHECKPOINT,
        format=SnapshotFormat.DELTA,
        parent=len(segments),
        max_parallelism=MAX_P,
        parallelism=1,
        operators=(
            OperatorSnapshot(
                "op", None, {}, (SubtaskSnapshot(0, (0, MAX_P - 1), tuple(f.path for f in files)),)
            ),
        ),
        files=tuple(files),
    )
    write_metadata(snap, None, meta)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    first, last = asked
    want = [e for e in _expected(ops) if first <= e.key_group <= last]
    assert list(read_folded(snap, meta, (first, last))) == want
    table = read_folded_table(snap, meta, (first, last))
    assert sorted((StateEntry(*r.values()) for r in table.to_pylist()), key=repr) == sorted(
        want, key=repr
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (DeltaEntry(1, 0, b"k", b"", "s", None, b"v", None, 3, 1), "op 3"),
        (DeltaEntry(1, 0, b"k", b"", "s", None, b"v", None, DELETE, 1), "DELETE or CLEAR with a"),
        (DeltaEntry(1, 0, b"k", b"", "s", b"u", b"", None, CLEAR, 1), "CLEAR with a user key"),
        ((1, 0, b"k", b"", "s", None, b"v", None), "must have 10 fields"),
        (DeltaEntry(1, 0, b"k", b"", "s", None, b"v", None, PUT, None), "'seq'"),  # type: ignore[arg-type]  # no seq, on purpose
    ],
)
def test_bad_delta_rows_are_refused(storage: CheckpointStorage, row: tuple, message: str) -> None:
    with (
        pytest.raises(InvalidStateRows, match=message),
        DeltaWriter(
            storage.checkpoint("job", 2), chain_index=1, subtask=0, max_parallelism=16
        ) as w,
    ):
        w.write([row])
    assert storage.list_files("job") == []


@pytest.mark.parametrize("chain_index", [0, -1, True, "1"])
def test_delta_chain_index_starts_at_one(storage: CheckpointStorage, chain_index: Any) -> None:
    with pytest.raises(InvalidStateRows, match="chain_index"):
        DeltaWriter(
            storage.checkpoint("job", 2), chain_index=chain_index, subtask=0, max_parallelism=16
        )


def test_clear_removes_every_user_key_of_a_key_written_before_it() -> None:
    base = [
        StateEntry(3, 7, b"k", b"", "m", b"a", b"1", None),
        StateEntry(3, 7, b"k", b"", "m", b"b", b"2", None),
        StateEntry(3, 7, b"k", b"ns", "m", b"a", b"3", None),  # another namespace: kept
        StateEntry(3, 7, b"j", b"", "m", b"a", b"4", None),  # another key: kept
    ]
    delta = [
        DeltaEntry(3, 7, b"k", b"", "m", None, b"", None, CLEAR, 1),
        DeltaEntry(3, 7, b"k", b"", "m", b"c", b"5", None, PUT, 2),
    ]
    later = [DeltaEntry(3, 7, b"j", b"", "m", None, b"", None, CLEAR, 1)]
    assert fold(base, [delta, later]) == [
        StateEntry(3, 7, b"k", b"", "m", b"c", b"5", None),
        StateEntry(3, 7, b"k", b"ns", "m", b"a", b"3", None),
    ]


# --- the vectorised fold (restores) against the reference fold ---


def _table(rows: list, schema: pa.Schema) -> pa.Table:
    cols: list[list[Any]] = [[r[i] for r in rows] for i in range(len(schema))]
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)


identities = st.tuples(
    st.integers(0, 3),  # key group
    st.sampled_from([b"k", b"j"]),
    st.sampled_from([b"", b"ns"]),
    st.sampled_from(["v", "m"]),
)
delta_rows = st.lists(
    st.tuples(
        identities,
        st.sampled_from([None, b"a", b"b"]),
        st.sampled_from([PUT, PUT, DELETE, CLEAR]),
        st.integers(0, 3),
    ),
    max_size=25,
)


def _delta_row(ident: tuple, uk: bytes | None, op: int, seq: int, n: int) -> DeltaEntry:
    kg, key, ns, state = ident
    if op == CLEAR:
        uk = None
    return DeltaEntry(kg, 7, key, ns, state, uk, b"v%d" % n if op == PUT else b"", None, op, seq)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.lists(st.tuples(identities, st.sampled_from([None, b"a", b"b"])), max_size=20),
    chain=st.lists(delta_rows, max_size=4),
)
def test_fold_tables_equals_the_reference_fold(base: list, chain: list) -> None:
    unique = {
        ((kg, key, ns, state), uk): StateEntry(kg, 7, key, ns, state, uk, b"base", None)
        for (kg, key, ns, state), uk in base
    }
    base_rows = sorted(unique.values(), key=lambda e: e.key_group)
    deltas = [
        [_delta_row(i, uk, op, seq, n) for n, (i, uk, op, seq) in enumerate(rows)]  # seq unordered
        for rows in chain
    ]
    want = fold(base_rows, deltas)
    got = fold_tables(_table(base_rows, KEYED_SCHEMA), [_table(d, DELTA_SCHEMA) for d in deltas])
    rows = [StateEntry(*r.values()) for r in got.to_pylist()]
    assert [r.key_group for r in rows] == sorted(r.key_group for r in rows)
    assert sorted(rows, key=repr) == sorted(want, key=repr)


def test_fold_tables_refuses_an_unknown_op() -> None:
    bad = _table([DeltaEntry(1, 0, b"k", b"", "s", None, b"", None, 5, 1)], DELTA_SCHEMA)
    with pytest.raises(InvalidStateRows, match="op 5"):
        fold_tables(None, [bad])


def test_list_elements_come_out_in_position_order_after_a_fold() -> None:
    """A delta that rewrites one element of a list stamps it after the base's others; the
    restore's columns put a list state's elements back in position order."""
    pos = [i.to_bytes(4, "big") for i in range(3)]
    base = [StateEntry(1, 7, b"k", b"", "l", p, b"e%d" % i, None) for i, p in enumerate(pos)]
    delta = [DeltaEntry(1, 7, b"k", b"", "l", pos[1], b"new", None, PUT, 1)]
    folded = fold_tables(_table(base, KEYED_SCHEMA), [_table(delta, DELTA_SCHEMA)])
    assert folded.column("value").to_pylist() == [b"e0", b"e2", b"new"]  # chain order
    (columns,) = state_columns(folded, ["l"])
    assert columns.column("user_key") == pos
    assert columns.column("value") == [b"e0", b"new", b"e2"]
