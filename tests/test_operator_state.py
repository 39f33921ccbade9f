"""Operator state: list, union and broadcast states, snapshot rows, restore and rescaling."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.backends.operator_state import (
    BroadcastState,
    OperatorListState,
    OperatorStateBackend,
    OperatorStateMeta,
    OperatorStateMode,
    SourceOffsets,
    group_by_subtask,
    merge_state_meta,
    redistribute,
)
from state_engine.errors import (
    CorruptOperatorState,
    IncompatibleSerializer,
    InvalidOffset,
    InvalidParallelism,
    InvalidStateDescriptor,
    SerializationError,
    StateError,
    StateRegistrationConflict,
    UnknownPartition,
)
from state_engine.serde import ArrowRecordSerializer, IntSerializer, JsonSerializer
from state_engine.snapshot.operator_rows import OperatorStateRow

SPLIT = OperatorStateMode.SPLIT_DISTRIBUTE
UNION = OperatorStateMode.UNION
BROADCAST = OperatorStateMode.BROADCAST


def _rescale(
    backends: list[OperatorStateBackend], new_parallelism: int
) -> list[OperatorStateBackend]:
    meta = merge_state_meta(b.state_meta() for b in backends)
    rows = [b.snapshot_rows() for b in backends]
    return OperatorStateBackend.restore_rescaled(rows, meta, new_parallelism)


# --- the state API ---


def test_list_state_add_get_update_clear() -> None:
    state = OperatorStateBackend(0, 1).get_list_state("buffer", int)
    assert state.get() == [] and len(state) == 0
    state.add(1)
    state.add_all([2, 3])
    assert state.get() == [1, 2, 3] and list(state) == [1, 2, 3]
    state.set(1, 20)
    state.set(-1, 30)
    assert state.get() == [1, 20, 30]
    state.update([7])
    assert state.get() == [7]
    state.update([])
    assert state.get() == []
    state.add(4)
    state.clear()
    assert state.get() == []


def test_list_state_holds_copies_not_references() -> None:
    state = OperatorStateBackend(0, 1).get_list_state("docs", "json")
    doc = {"a": [1]}
    state.add(doc)
    doc["a"].append(2)
    assert state.get() == [{"a": [1]}]


def test_list_state_changes_are_all_or_nothing() -> None:
    state = OperatorStateBackend(0, 1).get_list_state("n", int)
    state.add_all([1, 2])
    with pytest.raises(
        SerializationError, match="int serializer cannot encode a value of type str"
    ):
        state.add_all([3, "four", 5])
    with pytest.raises(SerializationError):
        state.update([9, "x"])
    with pytest.raises(StateError, match="cannot hold None"):
        state.add_all([3, None])
    assert state.get() == [1, 2]


def test_list_state_refuses_none_and_bad_indexes() -> None:
    state = OperatorStateBackend(0, 1).get_list_state("n", int)
    with pytest.raises(StateError, match="'n' cannot hold None"):
        state.add(None)
    with pytest.raises(StateError, match="has 0 elements, index 0 is outside"):
        state.set(0, 1)
    state.add(1)
    with pytest.raises(StateError, match="index True is outside"):
        state.set(True, 1)  # type: ignore[arg-type]  # a wrong value on purpose


def test_broadcast_state_is_a_map() -> None:
    rules = OperatorStateBackend(0, 2).get_broadcast_state("rules", str, "json")
    assert rules.is_empty() and rules.get("x") is None and rules.get("x", 0) == 0
    rules.put("b", {"limit": 2})
    rules.put_all({"a": {"limit": 1}, "c": {"limit": 3}})
    rules.put("b", {"limit": 20})
    assert rules.get("b") == {"limit": 20}
    assert rules.contains("a") and "c" in rules and "z" not in rules
    rules.remove("c")
    rules.remove("never-there")
    assert rules.items() == [("a", {"limit": 1}), ("b", {"limit": 20})]
    assert rules.keys() == ["a", "b"] and len(rules) == 2
    assert rules.values() == [{"limit": 1}, {"limit": 20}]
    with pytest.raises(StateError, match="cannot hold None for key 'a'"):
        rules.put("a", None)
    with pytest.raises(StateError, match="cannot hold None"):
        rules.put_all({"d": 1, "e": None})
    assert "d" not in rules
    rules.clear()
    assert rules.is_empty()


def test_broadcast_rows_do_not_depend_on_insertion_order() -> None:
    a = OperatorStateBackend(0, 2)
    b = OperatorStateBackend(1, 2)
    a.get_broadcast_state("rules", str, int).put_all({"x": 1, "y": 2, "z": 3})
    rb = b.get_broadcast_state("rules", str, int)
    for k, v in [("z", 3), ("x", 1), ("y", 2)]:
        rb.put(k, v)
    assert [r.value for r in a.snapshot_rows()] == [r.value for r in b.snapshot_rows()]


def test_registration_returns_the_same_state_and_refuses_conflicts() -> None:
    backend = OperatorStateBackend(0, 1)
    s = backend.get_list_state("s", int)
    assert backend.get_list_state("s", IntSerializer()) is s
    u = backend.get_union_list_state("u", str)
    assert isinstance(u, OperatorListState) and u.mode is UNION
    b = backend.get_broadcast_state("b", str, int)
    assert isinstance(b, BroadcastState) and backend.get_broadcast_state("b", "str", "int") is b
    with pytest.raises(
        StateRegistrationConflict, match="'s' is mode SPLIT.*cannot be used as mode"
    ):
        backend.get_union_list_state("s", int)
    with pytest.raises(StateRegistrationConflict, match="asked for again with value .*str"):
        backend.get_list_state("s", str)
    with pytest.raises(StateRegistrationConflict, match="'b' is mode BROADCAST"):
        backend.get_list_state("b", int)
    with pytest.raises(StateRegistrationConflict, match="'s' is mode SPLIT"):
        backend.get_broadcast_state("s", str, int)
    with pytest.raises(StateRegistrationConflict, match="key .*int"):
        backend.get_broadcast_state("b", int, int)
    assert backend.state_names() == ["b", "s", "u"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: b.get_list_state("", int), InvalidStateDescriptor, "non-empty str"),
        (lambda b: b.get_list_state(3, int), InvalidStateDescriptor, "non-empty str"),
        (lambda b: b.get_list_state("a\x00", int), InvalidStateDescriptor, "non-printable"),
        (lambda b: b.get_list_state("a", None), InvalidStateDescriptor, "has no serializer"),
        (
            lambda b: b.get_list_state("a", int, "SPLIT"),
            InvalidStateDescriptor,
            "OperatorStateMode",
        ),
        (lambda b: b.get_list_state("a", int, BROADCAST), InvalidStateDescriptor, "broadcast"),
        (lambda b: b.get_broadcast_state("a", None, int), InvalidStateDescriptor, "no key serial"),
        (lambda b: b.get_broadcast_state("a", str, None), InvalidStateDescriptor, "no value seri"),
    ],
)
def test_bad_registrations(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(OperatorStateBackend(0, 1))


@pytest.mark.parametrize(
    ("subtask", "parallelism", "match"),
    [
        (0, 0, "parallelism 0 is outside"),
        (0, 40000, "outside 1..32768"),
        (0, 1.0, "parallelism must be an int"),
        (0, True, "parallelism must be an int"),
        (2, 2, "subtask index 2 is outside 0..1"),
        (-1, 2, "subtask index -1"),
        ("0", 2, "subtask index '0'"),
    ],
)
def test_invalid_subtask_or_parallelism(subtask: Any, parallelism: Any, match: str) -> None:
    with pytest.raises(InvalidParallelism, match=match):
        OperatorStateBackend(subtask, parallelism)


# --- snapshot form ---


def test_snapshot_rows_and_meta() -> None:
    backend = OperatorStateBackend(1, 3)
    backend.get_list_state("s", str).add_all(["a", "b"])
    backend.get_union_list_state("u", int).add(5)
    backend.get_broadcast_state("b", str, int).put("k", 9)
    backend.get_list_state("empty", int)
    rows = backend.snapshot_rows()
    assert rows == [
        OperatorStateRow("b", "BROADCAST", 1, 0, b"\x00\x00\x00\x01k" + (9).to_bytes(8, "big")),
        OperatorStateRow("s", "SPLIT", 1, 0, b"a"),
        OperatorStateRow("s", "SPLIT", 1, 1, b"b"),
        OperatorStateRow("u", "UNION", 1, 0, (5).to_bytes(8, "big")),
    ]
    meta = backend.state_meta()
    assert list(meta) == ["b", "empty", "s", "u"]
    assert meta["b"].to_dict() == {
        "name": "b",
        "mode": "BROADCAST",
        "serializers": {
            "key": {"name": "str", "version": 1, "config": {}},
            "value": {"name": "int", "version": 1, "config": {}},
        },
    }
    as_json = json.loads(json.dumps({n: m.to_dict() for n, m in meta.items()}))
    assert {n: OperatorStateMeta.from_dict(d) for n, d in as_json.items()} == meta


def test_restore_at_same_parallelism_gives_back_every_state() -> None:
    backends = [OperatorStateBackend(i, 2) for i in range(2)]
    for i, b in enumerate(backends):
        b.get_list_state("s", int).add_all([i * 10, i * 10 + 1, i * 10 + 2][: i + 1])
        b.get_union_list_state("u", str).add(f"u{i}")
        b.get_broadcast_state("b", str, "json").put("cfg", {"v": 1})
    restored = _rescale(backends, 2)
    assert [r.get_list_state("s", int).get() for r in restored] == [[0], [10, 11]]
    assert [r.get_union_list_state("u", str).get() for r in restored] == [["u0", "u1"]] * 2
    assert [r.get_broadcast_state("b", str, "json").items() for r in restored] == [
        [("cfg", {"v": 1})]
    ] * 2


def test_scale_down_merges_and_scale_up_spreads() -> None:
    two = [OperatorStateBackend(i, 2) for i in range(2)]
    two[0].get_list_state("s", int).add_all([1, 2, 3])
    two[1].get_list_state("s", int).add_all([4, 5])
    (one,) = _rescale(two, 1)
    assert one.get_list_state("s", int).get() == [1, 2, 3, 4, 5]
    four = _rescale(two, 4)
    assert [b.get_list_state("s", int).get() for b in four] == [[1, 2], [3], [4], [5]]
    assert all(b.subtask_index == i and b.parallelism == 4 for i, b in enumerate(four))


def test_states_not_registered_again_survive_into_the_next_snapshot() -> None:
    old = OperatorStateBackend(0, 1)
    old.get_list_state("kept", "json").add_all([{"a": 1}, [2]])
    old.get_broadcast_state("b", int, str).put(1, "one")
    (new,) = _rescale([old], 1)
    assert new.snapshot_rows() == old.snapshot_rows()
    assert new.state_meta() == old.state_meta()


SCHEMA_V1 = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())])
SCHEMA_V2 = SCHEMA_V1.append(pa.field("score", pa.float64()))


def test_restore_migrates_an_evolved_serializer() -> None:
    old = OperatorStateBackend(0, 1)
    old.get_list_state("recs", ArrowRecordSerializer(SCHEMA_V1)).add({"id": 1, "name": "x"})
    old.get_broadcast_state("b", str, ArrowRecordSerializer(SCHEMA_V1)).put("k", {"id": 2})
    (new,) = _rescale([old], 1)
    recs = new.get_list_state("recs", ArrowRecordSerializer(SCHEMA_V2))
    assert recs.get() == [{"id": 1, "name": "x", "score": None}]
    assert (
        new.state_meta()["recs"].serializers["value"] == ArrowRecordSerializer(SCHEMA_V2).snapshot()
    )
    b = new.get_broadcast_state("b", str, ArrowRecordSerializer(SCHEMA_V2))
    assert b.get("k") == {"id": 2, "name": None, "score": None}
    recs.add({"id": 3, "score": 1.5})
    (again,) = _rescale([new], 1)
    assert again.get_list_state("recs", ArrowRecordSerializer(SCHEMA_V2)).get()[1]["score"] == 1.5


def test_restore_refuses_an_incompatible_serializer_or_mode() -> None:
    old = OperatorStateBackend(0, 1)
    old.get_list_state("recs", ArrowRecordSerializer(SCHEMA_V2)).add({"id": 1})
    old.get_list_state("n", int).add(1)
    (new,) = _rescale([old], 1)
    with pytest.raises(IncompatibleSerializer, match="'recs' was written with value serializer"):
        new.get_list_state("recs", ArrowRecordSerializer(SCHEMA_V1))
    with pytest.raises(IncompatibleSerializer, match="'n'"):
        new.get_list_state("n", str)
    with pytest.raises(StateRegistrationConflict, match="'n' is mode SPLIT"):
        new.get_union_list_state("n", int)
    assert new.get_list_state("n", int).get() == [1]


# --- redistribution properties ---

values = st.binary(max_size=6)


@st.composite
def old_snapshots(draw: st.DrawFn) -> tuple[list[list[OperatorStateRow]], int]:
    old_p = draw(st.integers(1, 5))
    backends = [OperatorStateBackend(i, old_p) for i in range(old_p)]
    broadcast = draw(
        st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**63 - 1), max_size=5)
    )
    for b in backends:
        b.get_list_state("split-a", bytes).add_all(draw(st.lists(values, max_size=8)))
        b.get_list_state("split-b", bytes).add_all(draw(st.lists(values, max_size=3)))
        b.get_union_list_state("union", bytes).add_all(draw(st.lists(values, max_size=4)))
        b.get_broadcast_state("bc", str, int).put_all(broadcast)
    return [b.snapshot_rows() for b in backends], draw(st.integers(1, 8))


def _values(rows: list[OperatorStateRow], state: str) -> list[bytes]:
    return [r.value for r in sorted(rows, key=lambda r: r.index) if r.state == state]


@settings(deadline=None)
@given(old_snapshots())
def test_redistribution_loses_nothing_and_balances(case: Any) -> None:
    old, new_p = case
    new = redistribute(old, new_p)
    assert len(new) == new_p
    for i, rows in enumerate(new):
        assert all(r.subtask == i for r in rows)
        for state in {r.state for r in rows}:
            assert [r.index for r in rows if r.state == state] == list(
                range(len(_values(rows, state)))
            )
    for state in ("split-a", "split-b"):
        before = [v for rows in old for v in _values(rows, state)]
        parts = [_values(rows, state) for rows in new]
        assert Counter(v for p in parts for v in p) == Counter(before)
        if new_p != len(old):
            assert [v for p in parts for v in p] == before  # contiguous, in old subtask order
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1
            if len(before) >= new_p:
                assert min(sizes) >= 1
        else:
            assert parts == [_values(rows, state) for rows in old]
    union = [v for rows in old for v in _values(rows, "union")]
    assert all(_values(rows, "union") == union for rows in new)
    assert all(_values(rows, "bc") == _values(old[0], "bc") for rows in new)
    assert redistribute(old, new_p) == new  # pure and deterministic


@settings(deadline=None)
@given(old_snapshots(), st.integers(1, 8))
def test_rescaling_twice_keeps_the_split_multiset(case: Any, final_p: int) -> None:
    old, new_p = case
    twice = redistribute(redistribute(old, new_p), final_p)
    for state in ("split-a", "split-b"):
        before = Counter(v for rows in old for v in _values(rows, state))
        assert Counter(v for rows in twice for v in _values(rows, state)) == before


# --- redistribution and restore refusals ---


def _row(
    state: str = "s", mode: str = "SPLIT", subtask: int = 0, index: int = 0, value: bytes = b"v"
) -> OperatorStateRow:
    return OperatorStateRow(state, mode, subtask, index, value)


@pytest.mark.parametrize(
    ("old", "match"),
    [
        ([[_row(mode="ROUND_ROBIN")]], "unknown operator-state mode 'ROUND_ROBIN'"),
        ([[_row(subtask=1)]], "says subtask 1 but sits in the rows of old subtask 0"),
        ([[_row(), _row(index=2)]], "indices must run 0..1, found 2"),
        ([[_row(), _row()]], "a gap or a duplicate"),
        ([[_row()], [_row(mode="UNION", subtask=1)]], "rows in mode SPLIT and UNION"),
        ([[_row(index=-1)]], "must be ints >= 0"),
        ([[("s", "SPLIT", 0, 0)]], "must be \\(state, mode, subtask, index, value\\)"),
        ([[OperatorStateRow("s", "SPLIT", 0, 0, "text")]], "value must be bytes"),  # type: ignore[arg-type]  # a str on purpose
        ([[OperatorStateRow("", "SPLIT", 0, 0, b"")]], "not a str"),
        ("rows", "one sequence of rows per old subtask"),
    ],
)
def test_redistribute_refuses_corrupt_rows(old: Any, match: str) -> None:
    with pytest.raises(CorruptOperatorState, match=match):
        redistribute(old, 2)


def test_group_by_subtask_feeds_redistribute_from_flat_rows() -> None:
    backends = [OperatorStateBackend(i, 3) for i in range(3)]
    for i, b in enumerate(backends):
        b.get_list_state("s", int).add_all(range(i * 10, i * 10 + i + 1))
    flat = [tuple(r) for b in reversed(backends) for r in b.snapshot_rows()]
    grouped = group_by_subtask(flat, 3)
    assert grouped == [b.snapshot_rows() for b in backends]
    assert redistribute(grouped, 2) == redistribute([b.snapshot_rows() for b in backends], 2)
    with pytest.raises(CorruptOperatorState, match="names subtask 2, but the snapshot has"):
        group_by_subtask(flat, 2)


def test_redistribute_refuses_diverging_broadcast_copies() -> None:
    a, b = OperatorStateBackend(0, 2), OperatorStateBackend(1, 2)
    a.get_broadcast_state("bc", str, int).put("x", 1)
    b.get_broadcast_state("bc", str, int).put("x", 2)
    with pytest.raises(CorruptOperatorState, match="broadcast state 'bc' differs between old"):
        redistribute([a.snapshot_rows(), b.snapshot_rows()], 3)


@pytest.mark.parametrize("new_p", [0, -1, 2.0, None])
def test_redistribute_refuses_bad_parallelism(new_p: Any) -> None:
    with pytest.raises(InvalidParallelism, match="new parallelism"):
        redistribute([[]], new_p)
    with pytest.raises(InvalidParallelism, match="at least one old subtask"):
        redistribute([], 1)


INT = {"name": "int", "version": 1}
STR = {"name": "str", "version": 1}


def _meta_with(mode: str, serializers: dict[str, Any]) -> dict[str, Any]:
    return {"name": "s", "mode": mode, "serializers": serializers}


def _meta(name: str = "s", mode: str = "SPLIT") -> dict[str, Any]:
    return {
        name: {"name": name, "mode": mode, "serializers": {"value": {"name": "int", "version": 1}}}
    }


@pytest.mark.parametrize(
    ("rows", "meta", "match"),
    [
        ([_row()], {}, "rows name state 's', which the metadata does not describe"),
        ([_row(subtask=1)], _meta(), "belongs to subtask 1, not 0"),
        ([_row(mode="UNION")], _meta(), "a row says mode UNION but the state is SPLIT"),
        ([_row(mode="BAD")], _meta(), "unknown operator-state mode 'BAD'"),
        ([], _meta(mode="BAD"), "unknown operator-state mode 'BAD'"),
        ([], {"s": {"name": "s"}}, "mapping with name, mode and serializers"),
        ([], {"t": _meta()["s"]}, "under 't' describes state 's'"),
        ([], {"s": _meta_with("BROADCAST", {"value": {}})}, "serializers for \\['key', 'value'\\]"),
        ([], {"s": _meta_with("SPLIT", {"value": {"name": "int"}})}, "needs exactly the keys"),
        ([], {"s": _meta_with("SPLIT", {"value": INT | {"config": {"x": 1}}})}, "takes no config"),
        (
            [_row(mode="BROADCAST", value=b"\x00\x00\x00\x09k")],
            {"s": _meta_with("BROADCAST", {"key": STR, "value": INT})},
            "no valid key length prefix",
        ),
        ([], [("s", "SPLIT")], "must map state name -> meta"),
    ],
)
def test_restore_refuses_corrupt_input(rows: Any, meta: Any, match: str) -> None:
    with pytest.raises(CorruptOperatorState, match=match):
        OperatorStateBackend.restore(0, 1, rows, meta)


def test_restore_refuses_a_duplicated_broadcast_key() -> None:
    blob = b"\x00\x00\x00\x01k" + (1).to_bytes(8, "big")
    rows = [OperatorStateRow("b", "BROADCAST", 0, i, blob) for i in range(2)]
    meta = OperatorStateBackend(0, 1)
    meta.get_broadcast_state("b", str, int)
    with pytest.raises(CorruptOperatorState, match="the same key appears twice"):
        OperatorStateBackend.restore(0, 1, rows, meta.state_meta())


def test_unknown_serializer_in_meta_is_reported() -> None:
    meta = {
        "s": {
            "name": "s",
            "mode": "SPLIT",
            "serializers": {"value": {"name": "avro", "version": 1}},
        }
    }
    with pytest.raises(KeyError, match="no serializer named 'avro'"):
        OperatorStateBackend.restore(0, 1, [], meta)


def test_merge_state_meta_refuses_diverging_registrations() -> None:
    a, b = OperatorStateBackend(0, 2), OperatorStateBackend(1, 2)
    a.get_list_state("s", int)
    b.get_list_state("s", str)
    b.get_union_list_state("only-b", int)
    with pytest.raises(CorruptOperatorState, match="'s' is .* on subtask 1 but"):
        merge_state_meta([a.state_meta(), b.state_meta()])
    c = OperatorStateBackend(1, 2)
    c.get_union_list_state("only-c", int)
    c.get_list_state("s", int)
    assert list(merge_state_meta([a.state_meta(), c.state_meta()])) == ["only-c", "s"]


# --- source offsets ---


def test_source_offsets_assign_advance_and_read() -> None:
    backend = OperatorStateBackend(0, 1)
    offsets = SourceOffsets(backend)
    assert offsets.assign(["p-1", "p-0", "p-1"]) == ["p-1", "p-0"]
    assert offsets.assign(["p-0", "p-2"], start_offset=100) == ["p-2"]
    assert offsets.partitions() == ["p-1", "p-0", "p-2"]
    offsets.advance("p-0", 5)
    offsets.advance("p-0", 5)
    offsets.advance("p-2", np.int64(101))  # type: ignore[arg-type]  # a NumPy int on purpose
    assert offsets.offset("p-0") == 5 and offsets.offset("p-2") == 101
    assert offsets.offsets() == {"p-1": 0, "p-0": 5, "p-2": 101}
    (restored,) = _rescale([backend], 1)
    assert SourceOffsets(restored).offsets() == {"p-1": 0, "p-0": 5, "p-2": 101}


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda o: o.offset("p-9"), UnknownPartition, "partition 'p-9' is not read by this"),
        (lambda o: o.advance("p-9", 1), UnknownPartition, "assign\\(\\) it first"),
        (lambda o: o.advance("p-0", 2), InvalidOffset, "at offset 3; advancing to 2 would move"),
        (lambda o: o.advance("p-0", -1), InvalidOffset, "int in 0..2\\*\\*63-1, got -1"),
        (lambda o: o.advance("p-0", 4.0), InvalidOffset, "got 4.0"),
        (lambda o: o.advance("p-0", True), InvalidOffset, "got True"),
        (lambda o: o.advance("p-0", 2**63), InvalidOffset, "got 9223372036854775808"),
        (lambda o: o.assign(["p-1"], start_offset=-5), InvalidOffset, "start offset"),
        (lambda o: o.assign(["ok", ""]), InvalidStateDescriptor, "non-empty str"),
        (lambda o: o.assign([7]), InvalidStateDescriptor, "got 7"),
    ],
)
def test_source_offsets_refusals(call: Any, error: type[Exception], match: str) -> None:
    offsets = SourceOffsets(OperatorStateBackend(0, 1))
    offsets.assign(["p-0"], start_offset=3)
    with pytest.raises(error, match=match):
        call(offsets)
    assert offsets.offsets() == {"p-0": 3}


def test_source_offsets_refuse_a_partition_held_twice() -> None:
    backend = OperatorStateBackend(0, 1)
    backend.get_list_state("source-offsets", (str, int)).add_all([("p", 1), ("p", 2)])
    with pytest.raises(CorruptOperatorState, match="hold partition 'p' twice"):
        SourceOffsets(backend)


@settings(deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 2**63 - 1), max_size=20),
    st.integers(1, 5),
    st.lists(st.integers(1, 7), min_size=1, max_size=3),
    st.randoms(use_true_random=False),
)
def test_every_partition_lands_on_exactly_one_subtask_after_rescales(
    partitions: dict[str, int], old_p: int, new_ps: list[int], rnd: Any
) -> None:
    backends = [OperatorStateBackend(i, old_p) for i in range(old_p)]
    sources = [SourceOffsets(b) for b in backends]
    for partition, offset in partitions.items():
        source = sources[rnd.randrange(old_p)]
        source.assign([partition])
        source.advance(partition, offset)
    for new_p in new_ps:
        before = [s.partitions() for s in sources]
        backends = _rescale(backends, new_p)
        sources = [SourceOffsets(b) for b in backends]
        held = Counter(p for s in sources for p in s.partitions())
        assert held == Counter(list(partitions))  # each partition exactly once
        assert {p: o for s in sources for p, o in s.offsets().items()} == partitions
        counts = [len(s.partitions()) for s in sources]
        if new_p == len(before):
            assert [s.partitions() for s in sources] == before  # unchanged parallelism: kept
        elif len(partitions) >= new_p:
            assert min(counts) >= 1  # nobody idles


def test_source_offsets_keep_working_after_a_rescale() -> None:
    backends = [OperatorStateBackend(i, 2) for i in range(2)]
    SourceOffsets(backends[0]).assign(["a", "b"])
    SourceOffsets(backends[1]).assign(["c"], start_offset=7)
    four = _rescale(backends, 4)
    sources = [SourceOffsets(b) for b in four]
    assert [s.partitions() for s in sources] == [["a"], ["b"], ["c"], []]
    sources[2].advance("c", 8)
    sources[3].assign(["d"])
    (one,) = _rescale(four, 1)
    assert SourceOffsets(one).offsets() == {"a": 0, "b": 0, "c": 8, "d": 0}


def test_json_list_state_round_trips_through_rows() -> None:
    backend = OperatorStateBackend(0, 1)
    backend.get_union_list_state("u", JsonSerializer()).add_all([{"k": [1, None]}, "s", 1.5])
    (restored,) = _rescale([backend], 1)
    assert restored.get_union_list_state("u", "json").get() == [{"k": [1, None]}, "s", 1.5]
