"""RocksDB layout: one value per list, bounded prefix scans, reopen, migration, restore order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from state_engine.backends.rocksdb import RocksDBKeyedStateBackend
from state_engine.backends.rocksdb.layout import OLD_LIST_SEQ_KEY, decode_list, encode_list
from state_engine.errors import SerializationError, StateError
from state_engine.serde import PickleSerializer
from state_engine.state import (
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    StateEntry,
    StateTtlConfig,
    ValueStateDescriptor,
)
from tests.state.rocks import KGR, open_rocks


def db_rows(b: RocksDBKeyedStateBackend, state: str) -> list[tuple[bytes, bytes]]:
    """The rows of ``state`` in the DB itself, its write overlay flushed first."""
    b._flush(state)
    return list(b._cf(state).items())


@given(
    st.lists(st.binary(max_size=300), max_size=6),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
)
def test_list_value_encoding_round_trips(elements: list[bytes], ttl: bool, exp: int) -> None:
    expiries = [exp] * len(elements) if ttl else None
    raw = encode_list(elements, expiries)
    want = [(e, exp if ttl else None) for e in elements]
    assert decode_list(raw, ttl) == want
    if raw:
        with pytest.raises(SerializationError, match="truncated"):
            decode_list(raw + b"\x05", ttl)  # a dangling length or expiry


def test_a_list_is_one_row_whatever_was_done_to_it(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    ls = b.get_state(ListStateDescriptor("l", str))
    b.set_current_key("k")
    long = "x" * 300  # a two-byte varint length
    for i in range(20):
        ls.add(f"e{i}")
        if i % 5 == 4:
            ls.update([*ls.get()[-2:], long, ""])
    assert ls.get() == ["e18", "e19", long, ""]
    assert len(db_rows(b, "l")) == 1
    ls.clear()
    assert ls.get() == [] and db_rows(b, "l") == []
    b.close()


def test_map_iteration_stops_at_its_prefix(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    m = b.get_state(MapStateDescriptor("m", str, int))
    for k in ("a", "ab", "b"):  # "a"'s prefix is not a prefix of "ab"'s (length-prefixed)
        b.set_current_key(k)
        m.put_all({"x": 1, "y": 2})
    b.set_current_key("a")
    assert m.items() == [("x", 1), ("y", 2)]
    m.clear()
    assert m.is_empty()
    b.set_current_key("ab")
    assert m.keys() == ["x", "y"]
    b.close()


def test_reopen_keeps_lists_and_migrates_their_elements(tmp_path: Path) -> None:
    clock = ManualClock(0)
    ttl = StateTtlConfig(100)
    b = open_rocks(tmp_path, clock)
    ls = b.get_state(ListStateDescriptor("l", PickleSerializer(4)).enable_time_to_live(ttl))
    b.set_current_key("k")
    ls.add({"a": 1})
    clock.advance(50)
    ls.add([2, 3])
    b.close()
    again = open_rocks(tmp_path, clock)
    ls = again.get_state(ListStateDescriptor("l", PickleSerializer(5)).enable_time_to_live(ttl))
    again.set_current_key("k")
    (raw,) = [v for _, v in db_rows(again, "l")]
    assert [e[:2] for e, _ in decode_list(raw, True)] == [b"\x80\x05", b"\x80\x05"]
    assert [x for _, x in decode_list(raw, True)] == [100, 150]  # expiries kept
    assert ls.get() == [{"a": 1}, [2, 3]]
    clock.advance(50)
    assert ls.get() == [[2, 3]]
    again.close()


def test_cleanup_sweep_drops_expired_list_elements(tmp_path: Path) -> None:
    clock = ManualClock(0)
    b = open_rocks(tmp_path, clock)
    ls = b.get_state(ListStateDescriptor("l", int).enable_time_to_live(StateTtlConfig(100)))
    b.set_current_key("a")
    ls.add(1)
    b.set_current_key("b")
    ls.add(2)
    clock.advance(60)
    ls.add(3)
    clock.advance(40)
    assert b.cleanup_expired() == 2
    assert len(db_rows(b, "l")) == 1
    assert ls.get() == [3]
    b.close()


def test_restore_appends_list_rows_in_position_order_even_interleaved(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    ls = b.get_state(ListStateDescriptor("l", int))
    meta = b.registered_states()
    ser = meta["l"].serializers["value"].serialize

    def row(key: str, pos: int, v: int) -> StateEntry:
        from state_engine.hashing import key_hash
        from state_engine.keygroups import assign_to_key_group

        kg = assign_to_key_group(key, 128)
        return StateEntry(
            kg, key_hash(key), key.encode(), b"", "l", pos.to_bytes(4, "big"), ser(v), None
        )

    b.restore_entries([row("a", 0, 1), row("b", 0, 10), row("a", 1, 2), row("b", 1, 20)], meta)
    b.restore_entries([row("a", 2, 3)], meta)  # a later batch appends
    b.set_current_key("a")
    assert ls.get() == [1, 2, 3]
    b.set_current_key("b")
    assert ls.get() == [10, 20]
    with b.snapshot_view() as view:
        a_rows = [r for r in view.iter_entries() if r.key == b"a"]
    assert [r.user_key for r in a_rows] == [i.to_bytes(4, "big") for i in range(3)]
    b.close()


def test_a_db_in_the_old_list_layout_is_refused(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    b.get_state(ListStateDescriptor("l", int))
    b._db.put(OLD_LIST_SEQ_KEY, (7).to_bytes(8, "big"))
    b.close()
    with pytest.raises(StateError, match="old one-row-per-element layout"):
        open_rocks(tmp_path)


def test_rocksdb_has_no_incremental_row_view(tmp_path: Path) -> None:
    b = open_rocks(tmp_path)
    with pytest.raises(StateError, match="native"):
        b.snapshot_view(incremental=True)
    with b.snapshot_view() as first, b.snapshot_view() as second:
        assert second.view_id == first.view_id + 1
    b.close()


def test_map_clear_deletes_rows_without_range_tombstones(tmp_path: Path) -> None:
    """A job clears one small map per session; a range tombstone per clear would make every
    later map scan re-fragment all of them (seen: 0.7 ms per scan after 20k clears)."""
    b = open_rocks(tmp_path)
    ms = b.get_state(MapStateDescriptor("m", str, int))
    cf = b._cf("m")
    b.set_current_key("card")
    for session in range(50):
        ms.set_current_namespace(session)
        ms.put_all({f"merchant-{i}": i for i in range(3)})
    before = cf.property_int_value("rocksdb.num-deletes-active-mem-table")
    for session in range(0, 50, 2):
        ms.set_current_namespace(session)
        ms.clear()
        assert ms.items() == [] and ms.is_empty()
    # one point delete per cleared row; a delete_range would add none (and cost every scan)
    deletes = cf.property_int_value("rocksdb.num-deletes-active-mem-table") - before
    assert deletes == 25 * 3
    for session in range(1, 50, 2):
        ms.set_current_namespace(session)
        assert sorted(ms.items()) == [(f"merchant-{i}", i) for i in range(3)]
    b.set_current_key("other")
    ms.set_current_namespace(1)
    ms.clear()  # nothing stored under this prefix: nothing to delete
    assert cf.property_int_value("rocksdb.num-deletes-active-mem-table") - before == 75
    b.close()


def filtered_entries(b: RocksDBKeyedStateBackend, state: str) -> int:
    """How many keys the bloom filters of ``state``'s SSTs hold (RocksDB's table properties)."""
    props = b._cf(state).property_value("rocksdb.aggregated-table-properties")
    return int(re.search(r"# entries for filter=(\d+)", props).group(1))  # type: ignore[union-attr]  # RocksDB always reports it


def test_state_ssts_carry_a_bloom_filter_also_after_reopening(tmp_path: Path) -> None:
    """Point reads that miss the overlay skip the SSTs without their key (one L0 file per
    checkpoint), in a new DB and in one opened again (a restore in place)."""
    b = open_rocks(tmp_path / "live")
    v = b.get_state(ValueStateDescriptor("v", int))
    for i in range(50):
        b.set_current_key(f"k{i}")
        v.update(i)
    b.create_checkpoint(tmp_path / "chk")  # flushes the memtable into an SST
    assert filtered_entries(b, "v") == 50
    b.close()
    again = RocksDBKeyedStateBackend(tmp_path / "live", str, 128, KGR, ManualClock(0))
    v = again.get_state(ValueStateDescriptor("v", int))
    for i in range(50, 80):
        again.set_current_key(f"k{i}")
        v.update(i)
    again.create_checkpoint(tmp_path / "chk2")
    assert filtered_entries(again, "v") == 80
    again.close()
