"""TTL on both backends, with a manual clock (no sleeps)."""

from __future__ import annotations

import pytest

from state_engine.errors import InvalidStateDescriptor
from state_engine.state import (
    VOID_NAMESPACE,
    CleanupStrategies,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    TtlTimeDomain,
    UpdateType,
    ValueStateDescriptor,
)


def ttl(ms=100, **kw):
    return StateTtlConfig(ms, **kw)


def test_value_expires_after_write(backend, clock):
    v = backend.get_state(ValueStateDescriptor("v", int, default=-1).enable_time_to_live(ttl()))
    backend.set_current_key("k")
    v.update(1)
    clock.advance(99)
    assert v.value() == 1  # OnCreateAndWrite: reading does not extend
    clock.advance(1)
    assert v.value() == -1
    v.update(2)
    clock.advance(50)
    v.update(3)
    clock.advance(60)
    assert v.value() == 3


def test_on_read_and_write_extends_on_read(backend, clock):
    cfg = ttl(update_type=UpdateType.ON_READ_AND_WRITE)
    v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    backend.set_current_key("k")
    v.update(1)
    for _ in range(5):
        clock.advance(80)
        assert v.value() == 1
    clock.advance(100)
    assert v.value() is None


def test_disabled_update_type_turns_ttl_off(backend, clock):
    cfg = ttl(update_type=UpdateType.DISABLED)
    v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    backend.set_current_key("k")
    v.update(1)
    clock.advance(10_000)
    assert v.value() == 1


def test_return_expired_if_not_cleaned_up(backend, clock):
    cfg = ttl(visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)
    v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    backend.set_current_key("k")
    v.update(1)
    clock.advance(500)
    assert v.value() == 1  # returned once, and cleaned up by that read (as in Flink)
    assert v.value() is None


def test_list_ttl_is_per_element(backend, clock):
    ls = backend.get_state(ListStateDescriptor("l", str).enable_time_to_live(ttl()))
    backend.set_current_key("k")
    ls.add("old")
    clock.advance(60)
    ls.add("new")
    assert ls.get() == ["old", "new"]
    clock.advance(40)
    assert ls.get() == ["new"]
    clock.advance(60)
    assert ls.get() == []


def test_map_ttl_is_per_entry(backend, clock):
    m = backend.get_state(MapStateDescriptor("m", str, int).enable_time_to_live(ttl()))
    backend.set_current_key("k")
    m.put("a", 1)
    clock.advance(60)
    m.put("b", 2)
    clock.advance(40)
    assert m.get("a") is None and m.get("b") == 2
    assert m.items() == [("b", 2)] and not m.contains("a")
    clock.advance(60)
    assert m.is_empty()


def test_reducing_ttl_starts_over_after_expiry(backend, clock):
    d = ReducingStateDescriptor("r", lambda a, b: a + b, int).enable_time_to_live(ttl())
    r = backend.get_state(d)
    backend.set_current_key("k")
    r.add(1)
    r.add(2)
    clock.advance(100)
    r.add(5)
    assert r.get() == 5


def test_event_time_ttl_follows_the_watermark(backend, clock):
    cfg = ttl(time_domain=TtlTimeDomain.EVENT_TIME)
    v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    backend.advance_watermark(1_000)
    backend.set_current_key("k")
    v.update(1)
    clock.advance(1_000_000)  # processing time is irrelevant
    assert v.value() == 1
    backend.advance_watermark(1_099)
    assert v.value() == 1
    backend.advance_watermark(500)  # watermarks never go back
    assert backend.current_watermark == 1_099
    backend.advance_watermark(1_100)
    assert v.value() is None


def test_full_snapshot_cleanup_leaves_expired_rows_out(backend, clock):
    cfg = ttl(cleanup=CleanupStrategies(full_snapshot=True))
    v = backend.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    ls = backend.get_state(ListStateDescriptor("l", int).enable_time_to_live(cfg))
    keep = backend.get_state(ValueStateDescriptor("keep", int).enable_time_to_live(ttl()))
    backend.set_current_key("k")
    v.update(1)
    ls.add_all([1, 2])
    keep.update(1)
    clock.advance(50)
    ls.add(3)
    clock.advance(50)
    view = backend.snapshot_view()
    rows = list(view.iter_entries())
    view.release()
    assert [(r.state, r.value[-1]) for r in rows if r.state != "keep"] == [("l", 3)]
    assert [r.user_key for r in rows if r.state == "l"] == [b"\x00\x00\x00\x00"]
    assert {r.expires_at for r in rows} == {1_100, 1_150}
    assert len([r for r in rows if r.state == "keep"]) == 1  # no full-snapshot cleanup: kept


def test_heap_incremental_cleanup_removes_untouched_expired_state(make_backend, clock):
    b = make_backend("heap")
    cfg = ttl(cleanup=CleanupStrategies(incremental_size=10, incremental_every_record=True))
    v = b.get_state(ValueStateDescriptor("v", int).enable_time_to_live(cfg))
    for i in range(100):
        b.set_current_key(f"k{i}")
        v.update(i)
    clock.advance(100)
    for _ in range(30):  # 30 records x 10 checks cover the 256 slots' 100 entries
        b.set_current_key("k0")
    assert list(b.keys("v", VOID_NAMESPACE)) == []


def test_rocksdb_cleanup_sweep(make_backend, clock):
    b = make_backend("rocksdb")
    cfg = ttl(cleanup=CleanupStrategies(rocksdb_compaction=True))
    m = b.get_state(MapStateDescriptor("m", str, int).enable_time_to_live(cfg))
    b.set_current_key("k")
    m.put("a", 1)
    clock.advance(50)
    m.put("b", 2)
    clock.advance(50)
    assert b.cleanup_expired() == 1
    clock.advance(50)
    assert b.cleanup_expired() == 1
    assert b.cleanup_expired() == 0


def test_ttl_config_validation_and_round_trip():
    cfg = StateTtlConfig(
        5_000,
        UpdateType.ON_READ_AND_WRITE,
        StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
        CleanupStrategies(full_snapshot=True, incremental_size=5),
        TtlTimeDomain.EVENT_TIME,
    )
    assert StateTtlConfig.from_dict(cfg.to_dict()) == cfg
    for bad in (0, -1, 1.5):
        with pytest.raises(InvalidStateDescriptor, match="positive int"):
            StateTtlConfig(bad)
    with pytest.raises(InvalidStateDescriptor):
        CleanupStrategies(incremental_size=-1)
    with pytest.raises(InvalidStateDescriptor):
        StateTtlConfig.from_dict({"nope": 1})
