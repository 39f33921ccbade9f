"""Behaviour of every state kind, on both backends."""

from __future__ import annotations

import pytest

from state_engine.errors import (
    KeyGroupOutOfRange,
    NoCurrentKey,
    SerializationError,
    StateError,
    StateRegistrationConflict,
)
from state_engine.keygroups import KeyGroupRange, assign_to_key_group
from state_engine.state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)


class Avg(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        acc[0] += value  # mutates in place, as Flink's contract allows
        acc[1] += 1
        return acc

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


def test_value_state_default_update_clear(backend):
    v = backend.get_state(ValueStateDescriptor("count", int, default=0))
    backend.set_current_key("a")
    assert v.value() == 0
    v.update(5)
    backend.set_current_key("b")
    assert v.value() == 0
    v.update(7)
    backend.set_current_key("a")
    assert v.value() == 5
    v.update(None)  # Flink: update(null) clears
    assert v.value() == 0
    backend.set_current_key("b")
    v.clear()
    assert v.value() == 0


def test_list_state(backend):
    ls = backend.get_state(ListStateDescriptor("events", str))
    backend.set_current_key("k")
    assert ls.get() == []
    ls.add("a")
    ls.add_all(["b", "c"])
    assert ls.get() == ["a", "b", "c"]
    ls.update(["z"])
    assert ls.get() == ["z"]
    ls.update([])
    assert ls.get() == []
    ls.add("q")
    ls.clear()
    assert ls.get() == []
    with pytest.raises(StateError, match="None"):
        ls.add(None)
    with pytest.raises(StateError, match="iterable"):
        ls.add_all("abc")


def test_map_state(backend):
    m = backend.get_state(MapStateDescriptor("m", str, int))
    backend.set_current_key("k")
    assert m.is_empty() and m.get("x") is None and not m.contains("x")
    m.put("x", 1)
    m.put_all({"y": 2, "z": 3})
    assert m.get("y") == 2 and m.contains("z")
    assert sorted(m.keys()) == ["x", "y", "z"]
    assert sorted(m.values()) == [1, 2, 3]
    assert sorted(m.items()) == [("x", 1), ("y", 2), ("z", 3)]
    m.remove("y")
    m.remove("absent")
    assert sorted(m.keys()) == ["x", "z"]
    backend.set_current_key("other")
    assert m.is_empty()
    backend.set_current_key("k")
    m.clear()
    assert m.is_empty() and m.items() == []


def test_reducing_and_aggregating(backend):
    r = backend.get_state(ReducingStateDescriptor("sum", lambda a, b: a + b, int))
    a = backend.get_state(AggregatingStateDescriptor("avg", Avg(), "json"))
    backend.set_current_key("k")
    assert r.get() is None and a.get() is None
    for x in (1, 2, 3, 6):
        r.add(x)
        a.add(x)
    assert r.get() == 12 and a.get() == 3.0
    backend.set_current_key("j")
    assert r.get() is None
    backend.set_current_key("k")
    r.clear()
    a.clear()
    assert r.get() is None and a.get() is None


def test_namespaces_are_independent(backend):
    v = backend.get_state(ValueStateDescriptor("v", str))
    ls = backend.get_state(ListStateDescriptor("l", int))
    backend.set_current_key("k")
    v.update("void")
    for w in (1, 2):
        v.set_current_namespace(w)
        ls.set_current_namespace(w)
        v.update(f"w{w}")
        ls.add(w)
        ls.add(w * 10)
    v.set_current_namespace(1)
    assert v.value() == "w1"
    v.set_current_namespace(VOID_NAMESPACE)
    assert v.value() == "void"
    ls.set_current_namespace(2)
    assert ls.get() == [2, 20]
    ls.clear()
    ls.set_current_namespace(1)
    assert ls.get() == [1, 10]
    assert sorted(backend.keys("v", 2)) == ["k"]
    assert list(backend.keys("l", 2)) == []
    assert list(backend.keys("v", VOID_NAMESPACE)) == ["k"]
    with pytest.raises(SerializationError):
        v.set_current_namespace(1.5)


def test_keys_lists_every_key_with_a_value(backend):
    v = backend.get_state(ValueStateDescriptor("v", int))
    for i in range(50):
        backend.set_current_key(f"key-{i}")
        v.update(i)
    assert sorted(backend.keys("v", VOID_NAMESPACE)) == sorted(f"key-{i}" for i in range(50))


def test_same_descriptor_gives_same_state(backend):
    d = ValueStateDescriptor("v", int)
    assert backend.get_state(d) is backend.get_state(d)
    assert backend.get_state(ValueStateDescriptor("v", int)) is backend.get_state(d)


def test_no_current_key(backend):
    v = backend.get_state(ValueStateDescriptor("v", int))
    ls = backend.get_state(ListStateDescriptor("l", int))
    m = backend.get_state(MapStateDescriptor("m", str, int))
    for call in (v.value, lambda: v.update(1), ls.get, lambda: ls.add(1), lambda: m.get("x")):
        with pytest.raises(NoCurrentKey, match="set_current_key"):
            call()
    with pytest.raises(NoCurrentKey):
        _ = backend.current_key


def test_key_outside_owned_range(make_backend, backend_kind):
    b = make_backend(backend_kind, KeyGroupRange.of(0, 42))
    key = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", 128) > 42)
    with pytest.raises(KeyGroupOutOfRange, match="wrong subtask") as exc:
        b.set_current_key(key)
    assert str(assign_to_key_group(key, 128)) in str(exc.value)
    assert key in str(exc.value)
    ok = next(f"k{i}" for i in range(1000) if assign_to_key_group(f"k{i}", 128) <= 42)
    b.set_current_key(ok)
    assert b.current_key_group == assign_to_key_group(ok, 128)


def test_reregistration_conflicts(backend):
    backend.get_state(ValueStateDescriptor("s", int))
    with pytest.raises(StateRegistrationConflict, match="value serializer"):
        backend.get_state(ValueStateDescriptor("s", str))
    with pytest.raises(StateRegistrationConflict, match="kind VALUE vs LIST"):
        backend.get_state(ListStateDescriptor("s", int))
    d = ValueStateDescriptor("s", int).enable_time_to_live(StateTtlConfig(1000))
    with pytest.raises(StateRegistrationConflict, match="TTL"):
        backend.get_state(d)


def test_unencodable_value_names_the_state(backend):
    v = backend.get_state(ValueStateDescriptor("amount", int))
    backend.set_current_key("k")
    with pytest.raises(SerializationError, match="amount"):  # heap: at export; RocksDB: at write
        v.update("not an int")
        list(backend.snapshot_view().iter_entries())


def test_bad_descriptor_names():
    from state_engine.errors import InvalidStateDescriptor

    for bad in ("", "a\x00b", "tab\there", 3):
        with pytest.raises(InvalidStateDescriptor):
            ValueStateDescriptor(bad, int)
