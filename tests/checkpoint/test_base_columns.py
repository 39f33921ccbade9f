"""A heap delta chain's new base is written from the view's columns: the same rows, in the same
order, as the view's entries (every state kind, namespaces, TTL with expired entries left out)."""

from __future__ import annotations

from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.keygroups import KeyGroupRange, assign_to_key_group
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

# expired entries are left out of a full snapshot's export
TTL = StateTtlConfig(100, cleanup=CleanupStrategies(full_snapshot=True))
V = ValueStateDescriptor("v", int)
VT = ValueStateDescriptor("vt", int).enable_time_to_live(TTL)
L = ListStateDescriptor("l", int).enable_time_to_live(TTL)
M = MapStateDescriptor("m", str, int)
R = ReducingStateDescriptor("r", lambda a, b: a + b, int)


RANGE = KeyGroupRange.of(10, 90)  # not from 0: key groups are numbered from the range's start
KEYS = [k for k in (f"k{i}" for i in range(600)) if assign_to_key_group(k, 128) in RANGE]


def filled(clock: ManualClock) -> HeapKeyedStateBackend:
    b = HeapKeyedStateBackend(str, 128, RANGE, clock, track_changes=True)
    v, vt, lst, m, r = (b.get_state(d) for d in (V, VT, L, M, R))
    for i, key in enumerate(KEYS):
        b.set_current_key(key)
        if i % 50 == 0:
            clock.advance(60)  # older TTL entries expire by the time the view is taken
        v.update(i)
        vt.update(-i)
        lst.add(i)
        lst.add(i + 1)
        m.put(f"u{i % 3}", i)
        m.put("w", i)
        r.add(i)
        if i % 7 == 0:
            m.set_current_namespace(i % 4)
            m.put("ns", i)
            m.set_current_namespace(VOID_NAMESPACE)
    return b


def test_entry_columns_are_the_views_entries_in_order() -> None:
    b = filled(ManualClock(0))
    view = b.snapshot_view()
    try:
        expected = list(view.iter_entries())
        chunks = list(view.entry_columns(batch_rows=300))
        got = [StateEntry(*row) for cols in chunks for row in zip(*cols.values(), strict=True)]
        assert got == expected
        assert len(chunks) > 1  # cut into batches, each ending at a key group's end
        assert all(len(cols["key_group"]) >= 300 for cols in chunks[:-1])
        assert {e.state for e in expected} == {"v", "vt", "l", "m", "r"}
        # some TTL rows expired and are left out of both
        assert 0 < len([e for e in expected if e.state == "vt"]) < len(KEYS)
        assert 0 < len([e for e in expected if e.state == "l"]) < 2 * len(KEYS)
    finally:
        view.release()
        b.close()
