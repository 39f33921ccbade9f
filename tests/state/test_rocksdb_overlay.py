"""RocksDB's write overlay: point writes wait in a dict, and every read of the DB other than by
point key (scans, checkpoints, key-group deletes, TTL sweeps, restores, close) sees them."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.backends.rocksdb import backend as rocks_backend
from state_engine.errors import StateError
from state_engine.hashing import key_hash
from state_engine.keygroups import KeyGroupRange, assign_to_key_group
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    StateEntry,
    StateTtlConfig,
    UpdateType,
    ValueStateDescriptor,
)
from tests.state.rocks import open_rocks


def test_point_writes_wait_in_the_overlay_which_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rocks_backend, "OVERLAY_LIMIT", 5)
    b = open_rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", int))
    b.set_current_key("k0")
    v.update(1)
    assert list(b._cf("v").keys()) == []  # not in the DB yet
    assert v.value() == 1
    for i in range(1, 12):
        b.set_current_key(f"k{i}")
        v.update(i)
    assert len(b._overlays["v"]) <= 5
    assert len(list(b._cf("v").keys())) >= 7  # written out each time the overlay overflowed
    for i in range(12):
        b.set_current_key(f"k{i}")
        assert v.value() == max(i, 1)
    b.close()


def test_map_scans_see_unflushed_puts_removes_and_clears(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("card")
    m.put("a", 1)
    m.put("b", 2)
    assert m.items() == [("a", 1), ("b", 2)]
    m.remove("a")  # a delete in the overlay of a row already in the DB
    assert m.keys() == ["b"] and m.values() == [2] and not m.contains("a")
    m.clear()
    assert m.is_empty() and m.get("b") is None
    m.put("c", 3)
    assert m.items() == [("c", 3)]
    b.close()


def test_a_delete_in_the_overlay_hides_the_row_in_the_db(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", int, default=-1))
    ls = b.get_state(ListStateDescriptor("l", int))
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    v.update(7)
    ls.add(1)
    m.put("x", 1)
    b._flush()
    v.clear()
    ls.update(None)
    m.remove("x")
    assert v.value() == -1 and ls.get() == [] and m.get("x") is None
    assert list(b.keys("v", VOID_NAMESPACE)) == []  # the backend's key scan sees the delete too
    b.close()


def test_a_native_checkpoint_holds_every_write_before_it(tmp_path: Path) -> None:
    b = open_rocks(tmp_path / "live")
    v = b.get_state(ValueStateDescriptor("v", int))
    ls = b.get_state(ListStateDescriptor("l", int))
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    v.update(5)
    m.put("gone", 0)
    b._flush()
    m.remove("gone")
    ls.add(1)
    ls.add(2)
    m.put("x", 9)
    (tmp_path / "restored").mkdir()
    b.create_checkpoint(tmp_path / "restored" / "db")
    v.update(6)  # after the checkpoint: not in it
    b.close()
    r = open_rocks(tmp_path / "restored")
    v = r.get_state(ValueStateDescriptor("v", int))
    ls = r.get_state(ListStateDescriptor("l", int))
    m = r.get_state(MapStateDescriptor("m", str, int))
    r.set_current_key("k")
    assert (v.value(), ls.get(), m.items()) == (5, [1, 2], [("x", 9)])
    r.close()


def test_close_writes_the_overlay_and_a_closed_state_refuses(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", int))
    b.set_current_key("k")
    v.update(3)
    b.close()
    with pytest.raises(StateError, match="closed RocksDB backend"):
        v.update(4)
    with pytest.raises(StateError, match="closed RocksDB backend"):
        v.value()
    again = open_rocks(tmp_path)
    v = again.get_state(ValueStateDescriptor("v", int))
    again.set_current_key("k")
    assert v.value() == 3
    again.close()


def test_ttl_reads_expire_and_refresh_through_the_overlay(tmp_path: Path) -> None:
    clock = ManualClock(0)
    b = open_rocks(tmp_path, clock)
    ttl = StateTtlConfig(100, UpdateType.ON_READ_AND_WRITE)
    v = b.get_state(ValueStateDescriptor("v", int).enable_time_to_live(ttl))
    m = b.get_state(MapStateDescriptor("m", str, int).enable_time_to_live(ttl))
    b.set_current_key("k")
    v.update(1)
    m.put("x", 1)
    clock.advance(60)
    assert v.value() == 1 and m.get("x") == 1  # refreshed: now expire at 160
    clock.advance(60)
    assert v.value() == 1 and m.items() == [("x", 1)]  # refreshed again: 220
    clock.advance(100)
    assert v.value() is None and m.get("x") is None  # expired (and deleted in the overlay)
    assert list(b.keys("v", VOID_NAMESPACE)) == []
    b.close()


def test_the_ttl_sweep_sees_unflushed_rows(tmp_path: Path) -> None:
    clock = ManualClock(0)
    b = open_rocks(tmp_path, clock)
    v = b.get_state(ValueStateDescriptor("v", int).enable_time_to_live(StateTtlConfig(100)))
    for k in ("a", "b", "c"):
        b.set_current_key(k)
        v.update(1)
    clock.advance(100)
    assert b.cleanup_expired() == 3
    assert list(b.keys("v", VOID_NAMESPACE)) == []
    b.close()


def test_a_key_group_delete_covers_unflushed_rows(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", str))
    keys = [f"key-{i}" for i in range(40)]
    for k in keys:
        b.set_current_key(k)
        v.update(k)
    b.delete_key_group_range(KeyGroupRange.of(0, 63))
    for k in keys:
        b.set_current_key(k)
        assert v.value() == (None if assign_to_key_group(k, 128) < 64 else k)
    b.close()


def test_restored_rows_land_after_unflushed_writes(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    ls = b.get_state(ListStateDescriptor("l", int))
    v = b.get_state(ValueStateDescriptor("v", int))
    meta = b.registered_states()
    ser = meta["l"].serializers["value"].serialize
    kg = assign_to_key_group("a", 128)
    b.set_current_key("a")
    ls.add(1)
    v.update(1)
    rows = [
        StateEntry(kg, key_hash("a"), b"a", b"", "l", (0).to_bytes(4, "big"), ser(2), None),
        StateEntry(kg, key_hash("a"), b"a", b"", "v", None, ser(2), None),
    ]
    b.restore_entries(rows, meta)
    assert ls.get() == [1, 2]  # appended to the unflushed list
    assert v.value() == 2  # the restored row overwrote the earlier write
    b.close()
