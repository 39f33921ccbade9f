"""Key groups and subtask ranges: Flink's vectors, partition invariants, prefixes, bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.errors import (
    InvalidKeyGroupPrefix,
    InvalidKeyHash,
    InvalidParallelism,
    KeyGroupOutOfRange,
    UnsupportedKeyType,
)
from state_engine.hashing import key_hash
from state_engine.keygroups import (
    DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    UPPER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    assign_to_key_group,
    assign_to_key_groups,
    check_max_parallelism,
    check_parallelism,
    clear_caches,
    compute_default_max_parallelism,
    compute_key_group_for_key_hash,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
    key_group_from_prefix,
    key_group_prefix,
    key_group_prefix_length,
    key_groups_for_hashes,
    operator_indexes_for_key_groups,
)

# Checked against a real Flink runtime (NOTES.md).
FLINK_VECTORS = [
    ("hello", 128, 35),
    ("user-1", 128, 121),
    ("", 128, 94),
    ("card-000042", 128, 48),
    ("card-000042", 4096, 4016),
    ("😀x", 128, 60),
    (42, 128, 29),
    (123456789012, 128, 123),
    (123456789012, 32768, 23419),
]


@pytest.mark.parametrize(("key", "max_p", "expected"), FLINK_VECTORS)
def test_key_groups_match_flink(key: object, max_p: int, expected: int) -> None:
    assert assign_to_key_group(key, max_p) == expected
    assert compute_key_group_for_key_hash(key_hash(key), max_p) == expected
    assert assign_to_key_groups([key], max_p).tolist() == [expected]


def test_vectorised_flink_vectors_by_type() -> None:
    for max_p in (128, 4096, 32768):
        strs = [k for k, m, _ in FLINK_VECTORS if isinstance(k, str) and m == max_p]
        ints = [k for k, m, _ in FLINK_VECTORS if isinstance(k, int) and m == max_p]
        want_s = [e for k, m, e in FLINK_VECTORS if isinstance(k, str) and m == max_p]
        want_i = [e for k, m, e in FLINK_VECTORS if isinstance(k, int) and m == max_p]
        assert assign_to_key_groups(pa.array(strs, pa.string()), max_p).tolist() == want_s
        assert assign_to_key_groups(np.array(ints, dtype=np.int64), max_p).tolist() == want_i


@pytest.mark.parametrize(
    ("p", "ranges"),
    [
        (3, [(0, 42), (43, 85), (86, 127)]),
        (7, [(0, 18), (19, 36), (37, 54), (55, 73), (74, 91), (92, 109), (110, 127)]),
    ],
)
def test_operator_ranges_match_flink(p: int, ranges: list[tuple[int, int]]) -> None:
    got = [compute_key_group_range_for_operator_index(128, p, i) for i in range(p)]
    assert got == [KeyGroupRange.of(s, e) for s, e in ranges]


@pytest.mark.parametrize(
    ("p", "expected"), [(1, 128), (85, 128), (86, 256), (200, 512), (30000, 32768)]
)
def test_default_max_parallelism_matches_flink(p: int, expected: int) -> None:
    assert compute_default_max_parallelism(p) == expected


def test_constants() -> None:
    assert DEFAULT_LOWER_BOUND_MAX_PARALLELISM == 128
    assert UPPER_BOUND_MAX_PARALLELISM == 32768


@st.composite
def max_p_p_and_index(draw: st.DrawFn) -> tuple[int, int, int]:
    max_p = draw(st.one_of(st.integers(1, 32768), st.sampled_from([1, 2, 127, 128, 129, 32768])))
    p = draw(st.one_of(st.integers(1, max_p), st.sampled_from([1, max_p])))
    return max_p, p, draw(st.integers(0, p - 1))


@settings(deadline=None, max_examples=300)
@given(max_p_p_and_index())
def test_ranges_partition_key_groups_contiguously(case: tuple[int, int, int]) -> None:
    max_p, p, i = case
    r = compute_key_group_range_for_operator_index(max_p, p, i)
    # Contiguity with the neighbours: together the ranges tile 0..max_p-1 in order.
    if i == 0:
        assert r.start == 0
    else:
        assert compute_key_group_range_for_operator_index(max_p, p, i - 1).end == r.start - 1
    if i == p - 1:
        assert r.end == max_p - 1
    else:
        assert compute_key_group_range_for_operator_index(max_p, p, i + 1).start == r.end + 1
    # p <= max_p, so no subtask idles.
    assert not r.is_empty
    # Every key group of the range, and its neighbours outside it, map to the right subtask.
    for kg in {r.start, r.end, (r.start + r.end) // 2}:
        assert compute_operator_index_for_key_group(max_p, p, kg) == i
    if r.start > 0:
        assert compute_operator_index_for_key_group(max_p, p, r.start - 1) == i - 1
    if r.end < max_p - 1:
        assert compute_operator_index_for_key_group(max_p, p, r.end + 1) == i + 1


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 300).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_full_partition_small_max_parallelism(case: tuple[int, int]) -> None:
    max_p, p = case
    ranges = [compute_key_group_range_for_operator_index(max_p, p, i) for i in range(p)]
    assert [kg for r in ranges for kg in r] == list(range(max_p))
    owners = operator_indexes_for_key_groups(np.arange(max_p), max_p, p).tolist()
    assert owners == [i for i, r in enumerate(ranges) for _ in r]


@settings(deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
    st.integers(1, 32768),
)
def test_vectorised_key_groups_equal_scalar_for_ints(keys: list[int], max_p: int) -> None:
    expected = [assign_to_key_group(k, max_p) for k in keys]
    assert assign_to_key_groups(np.array(keys, dtype=np.int64), max_p).tolist() == expected
    hashes = np.array([key_hash(k) for k in keys], dtype=np.int32)
    assert key_groups_for_hashes(hashes, max_p).tolist() == expected


@settings(deadline=None)
@given(st.lists(st.text(max_size=20), max_size=30), st.integers(1, 32768))
def test_vectorised_key_groups_equal_scalar_for_strings(keys: list[str], max_p: int) -> None:
    expected = [assign_to_key_group(k, max_p) for k in keys]
    assert assign_to_key_groups(pa.array(keys, pa.string()), max_p).tolist() == expected


@settings(deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=30), st.integers(1, 32768))
def test_vectorised_key_groups_equal_scalar_for_bytes(keys: list[bytes], max_p: int) -> None:
    expected = [assign_to_key_group(k, max_p) for k in keys]
    assert assign_to_key_groups(pa.array(keys, pa.binary()), max_p).tolist() == expected


@settings(deadline=None)
@given(st.integers(1, 32768).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_vectorised_operator_indexes_equal_scalar(case: tuple[int, int]) -> None:
    max_p, p = case
    kgs = np.unique(np.linspace(0, max_p - 1, num=min(max_p, 64)).astype(np.int64))
    expected = [compute_operator_index_for_key_group(max_p, p, int(k)) for k in kgs]
    out = operator_indexes_for_key_groups(kgs, max_p, p)
    assert out.dtype == np.int32
    assert out.tolist() == expected


def test_cached_scalar_path_gives_the_same_answers_after_clearing() -> None:
    keys = ["hello", 42, ("a", 1), b"x"] * 3
    first = [assign_to_key_group(k, 128) for k in keys]
    clear_caches()
    assert [assign_to_key_group(k, 128) for k in keys] == first
    assert first[:2] == [35, 29]


def test_key_group_of_every_key_is_in_range() -> None:
    kgs = assign_to_key_groups(np.arange(-5000, 5000, dtype=np.int64), 4096)
    assert kgs.dtype == np.int32
    assert kgs.min() >= 0 and kgs.max() < 4096


# --- KeyGroupRange ---


def test_key_group_range_behaviour() -> None:
    r = KeyGroupRange.of(3, 7)
    assert len(r) == 5
    assert list(r) == [3, 4, 5, 6, 7]
    assert 3 in r and 7 in r and 2 not in r and 8 not in r and "3" not in r
    assert str(r) == "KeyGroupRange{3..7}"
    assert not r.is_empty
    assert r.intersection(KeyGroupRange.of(5, 20)) == KeyGroupRange.of(5, 7)
    assert r.intersection(KeyGroupRange.of(8, 9)) == KeyGroupRange.empty()
    assert KeyGroupRange.of(0, 0) != KeyGroupRange.empty()
    assert len(KeyGroupRange.of(0, 0)) == 1


def test_empty_ranges_are_canonical() -> None:
    empty = KeyGroupRange.empty()
    assert empty.is_empty and len(empty) == 0 and list(empty) == [] and 0 not in empty
    assert not empty
    assert KeyGroupRange.of(5, 4) == empty
    assert str(empty) == "KeyGroupRange{empty}"
    assert empty.intersection(KeyGroupRange.of(0, 10)) == empty
    assert hash(KeyGroupRange.of(9, 8)) == hash(empty)


def test_key_group_range_survives_pickling() -> None:
    # Ranges travel to Spark executors and worker processes.
    r = KeyGroupRange.of(3, 9)
    assert pickle.loads(pickle.dumps(r)) == r
    assert pickle.loads(pickle.dumps(KeyGroupRange.empty())).is_empty


def test_key_group_range_is_frozen_and_accepts_numpy_ints() -> None:
    r = KeyGroupRange.of(np.int64(1), np.int32(2))  # type: ignore[arg-type]  # NumPy ints on purpose
    assert type(r.start) is int and r == KeyGroupRange.of(1, 2)
    with pytest.raises(AttributeError):
        r.start = 0  # type: ignore[misc]  # frozen: the assignment fails on purpose


@pytest.mark.parametrize(("start", "end"), [(-1, 3), (5, 3), (0, 32768), (1.0, 2), (True, 2)])
def test_invalid_key_group_ranges(start: object, end: object) -> None:
    with pytest.raises(KeyGroupOutOfRange):
        KeyGroupRange.of(start, end)  # type: ignore[arg-type]  # a wrong value on purpose


# --- prefixes ---


@pytest.mark.parametrize(
    ("kg", "max_p", "prefix"),
    [
        (0, 128, b"\x00"),
        (127, 128, b"\x7f"),
        (0, 129, b"\x00\x00"),
        (300, 4096, b"\x01\x2c"),
        (32767, 32768, b"\x7f\xff"),
        (0, 1, b"\x00"),
    ],
)
def test_key_group_prefix(kg: int, max_p: int, prefix: bytes) -> None:
    assert key_group_prefix(kg, max_p) == prefix
    assert key_group_prefix_length(max_p) == len(prefix)
    assert key_group_from_prefix(prefix + b"serialized-key", max_p) == kg
    assert key_group_from_prefix(memoryview(prefix), max_p) == kg


def test_prefixes_sort_like_key_groups() -> None:
    # Byte order equals key-group order, so a key-group range is one contiguous RocksDB key range.
    prefixes = [key_group_prefix(kg, 4096) for kg in range(4096)]
    assert prefixes == sorted(prefixes)


def test_prefix_bad_input() -> None:
    with pytest.raises(KeyGroupOutOfRange, match="outside 0..127"):
        key_group_prefix(128, 128)
    with pytest.raises(InvalidKeyGroupPrefix, match="2-byte"):
        key_group_from_prefix(b"\x01", 256)
    with pytest.raises(KeyGroupOutOfRange, match="different max parallelism"):
        key_group_from_prefix(b"\x01\x00", 256)


# --- bad input ---


@pytest.mark.parametrize("bad", [0, -1, 32769, True, 128.0, "128", None])
def test_bad_max_parallelism(bad: object) -> None:
    with pytest.raises(InvalidParallelism, match="max parallelism") as info:
        check_max_parallelism(bad)  # type: ignore[arg-type]  # a wrong value on purpose
    assert "1..32768" in str(info.value)
    with pytest.raises(InvalidParallelism):
        assign_to_key_group("k", bad)  # type: ignore[arg-type]  # a wrong value on purpose
    with pytest.raises(InvalidParallelism):
        assign_to_key_groups(["k"], bad)  # type: ignore[arg-type]  # a wrong value on purpose


def test_check_max_parallelism_returns_int() -> None:
    wide = np.int64(256)
    assert check_max_parallelism(wide) == 256  # type: ignore[arg-type]  # a NumPy int on purpose
    assert type(check_max_parallelism(wide)) is int  # type: ignore[arg-type]  # as above
    assert assign_to_key_group("hello", np.int32(128)) == 35  # type: ignore[arg-type]  # a wrong value on purpose


def test_parallelism_above_max_names_the_fix() -> None:
    with pytest.raises(InvalidParallelism) as info:
        check_parallelism(256, 300)
    assert str(info.value) == (
        "parallelism 300 exceeds max parallelism 256: raise max parallelism with an offline "
        "rescale, or choose at most 256"
    )
    with pytest.raises(InvalidParallelism, match="below 1"):
        check_parallelism(128, 0)
    with pytest.raises(InvalidParallelism, match="must be an int"):
        check_parallelism(128, 2.0)  # type: ignore[arg-type]  # a wrong value on purpose
    for bad in (0, 40000, 2.0, True):
        with pytest.raises(InvalidParallelism, match=r"outside 1..32768"):
            compute_default_max_parallelism(bad)  # type: ignore[arg-type]  # a wrong value on purpose


@pytest.mark.parametrize("index", [-1, 3, 1.0])
def test_operator_index_out_of_range(index: object) -> None:
    with pytest.raises(InvalidParallelism, match=r"operator index .* outside 0..2"):
        compute_key_group_range_for_operator_index(128, 3, index)  # type: ignore[arg-type]  # a wrong value on purpose


@pytest.mark.parametrize("kg", [-1, 128, 1.5])
def test_key_group_out_of_range(kg: object) -> None:
    with pytest.raises(KeyGroupOutOfRange, match="outside 0..127"):
        compute_operator_index_for_key_group(128, 4, kg)  # type: ignore[arg-type]  # a wrong value on purpose
    if isinstance(kg, int):
        with pytest.raises(KeyGroupOutOfRange, match="outside 0..127"):
            operator_indexes_for_key_groups(np.array([0, kg]), 128, 4)


@pytest.mark.parametrize("key", [1.5, None, ["a"]])
def test_unsupported_keys(key: object) -> None:
    with pytest.raises(UnsupportedKeyType, match=type(key).__name__):
        assign_to_key_group(key, 128)


def test_int_key_beyond_64_bits() -> None:
    with pytest.raises(UnsupportedKeyType, match="64-bit"):
        assign_to_key_group(2**64, 128)


def test_bad_key_hash() -> None:
    with pytest.raises(InvalidKeyHash):
        compute_key_group_for_key_hash(2**33, 128)
    compute_key_group_for_key_hash(1, 128)  # cached: an equal float must still be refused
    for bad in (1.0, True, "1", None):
        with pytest.raises(InvalidKeyHash, match="not a 32-bit int"):
            compute_key_group_for_key_hash(bad, 128)  # type: ignore[arg-type]  # a wrong value on purpose
    assert compute_key_group_for_key_hash(np.int32(-1), 128) == compute_key_group_for_key_hash(  # type: ignore[arg-type]  # a NumPy int on purpose
        -1, 128
    )
    with pytest.raises(InvalidKeyHash):
        key_groups_for_hashes(np.array([2**40]), 128)
