"""Random operation sequences: heap, RocksDB and a plain Python model must agree.

RocksDB keeps point writes in a write overlay until something scans the DB; the sequences
interleave scans (map iteration and clear, ``keys``), exports (snapshot views) and overlay
flushes (a tiny overlay limit) with the point operations, so a missing flush shows up as a
disagreement.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.backends.rocksdb import RocksDBKeyedStateBackend
from state_engine.backends.rocksdb import backend as rocks_backend
from state_engine.backends.rocksdb.overlay import OVERLAY_LIMIT
from state_engine.keygroups import KeyGroupRange
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL = 100


class Model:
    """Per-entry TTL (OnCreateAndWrite, NeverReturnExpired): entries are (value, expires_at)."""

    def __init__(self) -> None:
        self.now = 0
        self.key: Any = None
        self.ns: Any = VOID_NAMESPACE
        self.v: dict[Any, tuple[int, int]] = {}
        self.l: dict[Any, list[tuple[int, int]]] = {}
        self.m: dict[Any, dict[str, tuple[int, int]]] = {}

    def ck(self) -> Any:
        return (self.key, self.ns)

    def live(self, e: tuple[int, int]) -> bool:
        return e[1] > self.now

    def apply(self, op: tuple) -> Any:
        name, *args = op
        exp = self.now + TTL
        ck = self.ck()
        if name == "key":
            self.key = args[0]
        elif name == "ns":
            self.ns = args[0]
        elif name == "advance":
            self.now += args[0]
        elif name == "v_update":
            self.v[ck] = (args[0], exp)
        elif name == "v_get":
            e = self.v.get(ck)
            return e[0] if e and self.live(e) else None
        elif name == "v_clear":
            self.v.pop(ck, None)
        elif name == "l_add":
            self.l.setdefault(ck, []).append((args[0], exp))
        elif name == "l_update":
            self.l[ck] = [(x, exp) for x in args[0]]
        elif name == "l_get":
            return [x for x, t in self.l.get(ck, []) if t > self.now]
        elif name == "m_put":
            self.m.setdefault(ck, {})[args[0]] = (args[1], exp)
        elif name == "m_remove":
            self.m.get(ck, {}).pop(args[0], None)
        elif name == "m_get":
            e = self.m.get(ck, {}).get(args[0])
            return e[0] if e and self.live(e) else None
        elif name == "m_items":
            return sorted((k, e[0]) for k, e in self.m.get(ck, {}).items() if self.live(e))
        elif name == "m_keys":
            return sorted(k for k, e in self.m.get(ck, {}).items() if self.live(e))
        elif name == "m_contains":
            e = self.m.get(ck, {}).get(args[0])
            return bool(e and self.live(e))
        elif name == "m_is_empty":
            return not any(self.live(e) for e in self.m.get(ck, {}).values())
        elif name == "m_clear":
            self.m.pop(ck, None)
        return None


class Driver:
    def __init__(self, backend: Any, clock: ManualClock) -> None:
        self.b, self.clock = backend, clock
        cfg = StateTtlConfig(TTL)
        self.v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
        self.l = backend.get_state(ListStateDescriptor("l", int).enable_time_to_live(cfg))
        self.m = backend.get_state(MapStateDescriptor("m", str, int).enable_time_to_live(cfg))

    def apply(self, op: tuple) -> Any:
        name, *args = op
        if name == "key":
            return self.b.set_current_key(args[0])
        if name == "ns":
            for s in (self.v, self.l, self.m):
                s.set_current_namespace(args[0])
            return None
        if name == "advance":
            return self.clock.advance(args[0])
        if name == "v_update":
            return self.v.update(args[0])
        if name == "v_get":
            return self.v.value()
        if name == "v_clear":
            return self.v.clear()
        if name == "l_add":
            return self.l.add(args[0])
        if name == "l_update":
            return self.l.update(args[0])
        if name == "l_get":
            return self.l.get()
        if name == "m_put":
            return self.m.put(args[0], args[1])
        if name == "m_remove":
            return self.m.remove(args[0])
        if name == "m_get":
            return self.m.get(args[0])
        if name == "m_items":
            return sorted(self.m.items())
        if name == "m_keys":
            return sorted(self.m.keys())
        if name == "m_contains":
            return self.m.contains(args[0])
        if name == "m_is_empty":
            return self.m.is_empty()
        if name == "m_clear":
            return self.m.clear()
        raise AssertionError(name)

    def export(self) -> tuple[list[Any], ...]:
        """Every row (a snapshot view) and each state's keys per namespace: the reads that do
        not go by point key."""
        keys = [sorted(self.b.keys(s, ns)) for s in "vlm" for ns in NAMESPACES]
        with self.b.snapshot_view() as view:
            rows = sorted(view.iter_entries())
        return keys, rows


NAMESPACES = [VOID_NAMESPACE, 1, "w"]
ints = st.integers(-5, 5)
uks = st.sampled_from(["a", "b", "c"])
ops = st.one_of(
    st.tuples(st.just("key"), st.sampled_from(["k1", "k2", "k3", "k4"])),
    st.tuples(st.just("ns"), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("advance"), st.integers(0, 60)),
    st.tuples(st.just("v_update"), ints),
    st.tuples(st.just("v_get")),
    st.tuples(st.just("v_clear")),
    st.tuples(st.just("l_add"), ints),
    st.tuples(st.just("l_update"), st.lists(ints, max_size=3)),
    st.tuples(st.just("l_get")),
    st.tuples(st.just("m_put"), uks, ints),
    st.tuples(st.just("m_remove"), uks),
    st.tuples(st.just("m_get"), uks),
    st.tuples(st.just("m_items")),
    st.tuples(st.just("m_keys")),
    st.tuples(st.just("m_contains"), uks),
    st.tuples(st.just("m_is_empty")),
    st.tuples(st.just("m_clear")),
    st.tuples(st.just("export")),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=60), st.sampled_from([1, 3, OVERLAY_LIMIT]))
def test_backends_agree_with_the_model(seq: list[tuple], overlay_limit: int) -> None:
    seq = [("key", "k1"), *seq]
    model = Model()
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(rocks_backend, "OVERLAY_LIMIT", overlay_limit),
    ):
        clocks = [ManualClock(0), ManualClock(0)]
        kgr = KeyGroupRange.of(0, 127)
        heap = HeapKeyedStateBackend(str, 128, kgr, clocks[0])
        rocks = RocksDBKeyedStateBackend(Path(tmp), str, 128, kgr, clocks[1])
        try:
            drivers = [Driver(heap, clocks[0]), Driver(rocks, clocks[1])]
            for op in seq:
                if op[0] == "export":
                    assert drivers[0].export() == drivers[1].export()
                    continue
                expected = model.apply(op)
                for d in drivers:
                    assert d.apply(op) == expected, (op, type(d.b).__name__)
            # and the exports agree row for row
            with heap.snapshot_view() as hv, rocks.snapshot_view() as rv:
                assert sorted(hv.iter_entries()) == sorted(rv.iter_entries())
        finally:
            heap.close()
            rocks.close()
