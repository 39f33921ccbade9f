"""Heap change tracking for delta snapshots: base + folded changes == a fresh full export."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.backends.base import ChangedKey
from state_engine.backends.heap import HeapKeyedStateBackend, HeapStateView
from state_engine.errors import StateError
from state_engine.keygroups import KeyGroupRange
from state_engine.state import (
    VOID_NAMESPACE,
    CleanupStrategies,
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateEntry,
    StateTtlConfig,
    ValueStateDescriptor,
)

KGR = KeyGroupRange.of(0, 127)
TTL = StateTtlConfig(100, cleanup=CleanupStrategies(incremental_size=2))
V = ValueStateDescriptor("v", int)
L = ListStateDescriptor("l", int).enable_time_to_live(TTL)
M = MapStateDescriptor("m", str, int).enable_time_to_live(StateTtlConfig(100))
R = ReducingStateDescriptor("r", lambda a, b: a + b, int)

Image = dict[tuple[str, int, bytes, bytes], list[StateEntry]]


def image(rows: list[StateEntry]) -> Image:
    out: Image = {}
    for r in rows:
        out.setdefault((r.state, r.key_group, r.key, r.namespace), []).append(r)
    return out


def fold(base: Image, changes: list[ChangedKey]) -> Image:
    out = dict(base)
    for c in changes:
        ident = (c.state, c.key_group, c.key, c.namespace)
        if c.rows:
            out[ident] = c.rows
        else:
            out.pop(ident, None)
    return out


def normal(img: Image) -> dict[Any, list[StateEntry]]:
    return {k: sorted(v) for k, v in img.items()}


def new_backend(clock: ManualClock) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(str, 128, KGR, clock, track_changes=True)


def test_incremental_view_needs_tracking() -> None:
    b = HeapKeyedStateBackend(str, 128, KGR, ManualClock(0))
    with pytest.raises(StateError, match="track_changes=True"):
        b.snapshot_view(incremental=True)
    with b.snapshot_view() as full, pytest.raises(StateError, match="incremental view"):
        list(full.changed())  # type: ignore[attr-defined]  # a heap view: changed() is the heap's
    b.confirm_view(full.view_id)  # a no-op without tracking
    b.close()


def test_confirm_checks_the_view_id() -> None:
    b = new_backend(ManualClock(0))
    with pytest.raises(StateError, match="no such view"):
        b.confirm_view(1)
    view = b.snapshot_view(incremental=True)
    assert view.view_id == 1
    with pytest.raises(StateError, match="view_id >= 1"):
        b.confirm_view(0)
    b.confirm_view(1)
    b.confirm_view(1)  # idempotent
    assert b.confirmed_view_id == 1
    view.release()
    b.close()


def test_changes_are_point_in_time_and_carried_until_confirmed() -> None:
    b = new_backend(ManualClock(0))
    v, m = b.get_state(V), b.get_state(M)
    for k in ("a", "b", "c"):
        b.set_current_key(k)
        v.update(1)
        m.put("x", 1)
    first = b.snapshot_view(incremental=True)
    b.set_current_key("a")
    v.update(2)  # after the view: not in its rows
    m.remove("x")
    got = list(first.changed())
    assert {(c.state, c.key) for c in got} == {(s, k) for s in "mv" for k in (b"a", b"b", b"c")}
    a_value = next(c for c in got if c.state == "v" and c.key == b"a")
    assert [r.value for r in a_value.rows] == [V.serializer.serialize(1)]
    assert [c.key_group for c in got] == sorted(c.key_group for c in got)
    first.release()  # its snapshot failed: not confirmed

    second = b.snapshot_view(incremental=True)
    changes = {(c.state, c.key): c for c in second.changed()}
    assert len(changes) == 6  # the first view's changes are carried forward
    assert changes[("m", b"a")].rows == []  # removed: no rows left
    b.confirm_view(second.view_id)
    second.release()
    with b.snapshot_view(incremental=True) as third:
        assert list(third.changed()) == []  # type: ignore[attr-defined]  # a heap view: changed() is the heap's
    b.close()


def test_changed_reads_from_another_thread_while_writing() -> None:
    b = new_backend(ManualClock(0))
    v = b.get_state(V)
    for i in range(100):
        b.set_current_key(f"k{i}")
        v.update(i)
    view = b.snapshot_view(incremental=True)
    for i in range(100):
        b.set_current_key(f"k{i}")
        v.clear()
    got: list[ChangedKey] = []
    t = threading.Thread(target=lambda: got.extend(view.changed()))
    t.start()
    t.join()
    assert len(got) == 100 and all(len(c.rows) == 1 for c in got)
    view.release()
    b.close()


def test_restored_rows_are_changes() -> None:
    src = new_backend(ManualClock(0))
    v = src.get_state(V)
    src.set_current_key("a")
    v.update(7)
    with src.snapshot_view() as full:
        rows, meta = list(full.iter_entries()), dict(full.states)
    dst = new_backend(ManualClock(0))
    dst.restore_entries(rows, meta)
    with dst.snapshot_view(incremental=True) as view:
        assert [r for c in view.changed() for r in c.rows] == rows  # type: ignore[attr-defined]  # a heap view: changed() is the heap's
    src.close()
    dst.close()


keys = st.sampled_from(["k1", "k2", "k3", "k4", "k5"])
small = st.integers(-3, 3)
op = st.one_of(
    st.tuples(st.just("key"), keys),
    st.tuples(st.just("ns"), st.sampled_from([VOID_NAMESPACE, 1, "w"])),
    st.tuples(st.just("advance"), st.integers(0, 70)),
    st.tuples(st.just("v_update"), small),
    st.tuples(st.just("v_clear")),
    st.tuples(st.just("l_add"), small),
    st.tuples(st.just("l_update"), st.lists(small, max_size=2)),
    st.tuples(st.just("l_get")),
    st.tuples(st.just("m_put"), st.sampled_from("ab"), small),
    st.tuples(st.just("m_remove"), st.sampled_from("ab")),
    st.tuples(st.just("m_get"), st.sampled_from("ab")),
    st.tuples(st.just("r_add"), small),
    st.tuples(st.just("view"), st.booleans()),
    st.tuples(st.just("confirm"), st.integers(0, 5)),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=80))
def test_base_plus_folded_changes_equals_a_full_export(seq: list[tuple]) -> None:
    clock = ManualClock(0)
    b = new_backend(clock)
    v, ls, m, r = (b.get_state(d) for d in (V, L, M, R))
    b.set_current_key("k1")
    # The test's snapshot store: the full image each taken view stands for, and the confirmed one.
    images: dict[int, Image] = {}
    taken: list[int] = []
    confirmed: Image = {}
    confirmed_id = 0
    try:
        for name, *args in seq:
            if name == "key":
                b.set_current_key(args[0])
            elif name == "ns":
                for s in (v, ls, m, r):
                    s.set_current_namespace(args[0])
            elif name == "advance":
                clock.advance(args[0])
            elif name == "v_update":
                v.update(args[0])
            elif name == "v_clear":
                v.clear()
            elif name == "l_add":
                ls.add(args[0])
            elif name == "l_update":
                ls.update(args[0])
            elif name == "l_get":
                ls.get()
            elif name == "m_put":
                m.put(args[0], args[1])
            elif name == "m_remove":
                m.remove(args[0])
            elif name == "m_get":
                m.get(args[0])
            elif name == "r_add":
                r.add(args[0])
            elif name == "view":
                view: HeapStateView = b.snapshot_view(incremental=args[0])
                full = image(list(view.iter_entries()))
                if args[0]:
                    changes = list(view.changed())
                    assert [c.key_group for c in changes] == sorted(c.key_group for c in changes)
                    assert normal(fold(confirmed, changes)) == normal(full)
                images[view.view_id] = full
                taken.append(view.view_id)
                view.release()
            elif name == "confirm" and taken:
                vid = taken[args[0] % len(taken)]
                b.confirm_view(vid)
                if vid > confirmed_id:
                    confirmed_id, confirmed = vid, images[vid]
        with b.snapshot_view(incremental=True) as last:
            got = fold(confirmed, list(last.changed()))  # type: ignore[attr-defined]  # a heap view: changed() is the heap's
            assert normal(got) == normal(image(list(last.iter_entries())))
    finally:
        b.close()


def test_ttl_cleanup_and_expiry_on_read_are_changes() -> None:
    clock = ManualClock(0)
    b = new_backend(clock)
    ls, m = b.get_state(L), b.get_state(M)
    for k in ("a", "b"):
        b.set_current_key(k)
        ls.add(1)
        m.put("x", 1)
    with b.snapshot_view() as base:
        b.confirm_view(base.view_id)
    clock.advance(100)
    b.set_current_key("a")
    assert m.get("x") is None  # expired on read: removed
    for _ in range(200):  # incremental cleanup walks every slot and purges "b"'s list
        ls.get()
    with b.snapshot_view(incremental=True) as view:
        changes = {(c.state, c.key): c.rows for c in view.changed()}  # type: ignore[attr-defined]  # a heap view: changed() is the heap's
    assert changes == {("m", b"a"): [], ("l", b"a"): [], ("l", b"b"): []}
    b.close()
