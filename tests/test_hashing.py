"""Key hashes: Java/Flink-compatible values, scalar and vectorised paths agreeing, bad keys."""

from __future__ import annotations

import collections
import enum
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine import hashing
from state_engine.errors import InvalidKeyHash, UnsupportedKeyType
from state_engine.hashing import (
    java_bytes_hash,
    java_long_hash,
    java_string_hash,
    key_hash,
    key_hashes,
    murmur_hash,
    murmur_hash_array,
)

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _signed32(h: int) -> int:
    h %= 2**32
    return h - 2**32 if h >= 2**31 else h


# --- independent reference implementations (written from the specs, not from the module) ---


def ref_murmur3_x86_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 over arbitrary bytes, as published by Austin Appleby."""
    c1, c2, m32 = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m32

    h = seed
    n_blocks = len(data) // 4
    for (k,) in struct.iter_unpack("<I", data[: 4 * n_blocks]):
        k = rotl((k * c1) & m32, 15) * c2 & m32
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & m32
    tail = data[4 * n_blocks :]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl((k * c1) & m32, 15) * c2 & m32
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m32
    h ^= h >> 16
    return h


def ref_flink_murmur(code: int) -> int:
    h = _signed32(ref_murmur3_x86_32(struct.pack("<i", code)))
    if h >= 0:
        return h
    return -h if h != -(2**31) else 0


def ref_string_hash(s: str) -> int:
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    return _signed32(sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)))


def ref_bytes_hash(b: bytes) -> int:
    signed = struct.unpack(f"{len(b)}b", b)
    return _signed32(31 ** len(b) + sum(v * 31 ** (len(b) - 1 - i) for i, v in enumerate(signed)))


# --- known Java values ---


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),  # the classic collision with "BB"
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # hashCode is Integer.MIN_VALUE
        ("😀", 0xD83D * 31 + 0xDE00),  # one emoji is two UTF-16 surrogate units
    ],
)
def test_java_string_hash_matches_java(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected
    assert key_hash(s) == expected


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (0, 0),
        (42, 42),
        (-1, 0),
        (1 << 32, 1),
        (2**63 - 1, -(2**31)),
        (-(2**63), -(2**31)),
        (123456789012, _signed32(123456789012 ^ (123456789012 >> 32))),
    ],
)
def test_java_long_hash_matches_java(v: int, expected: int) -> None:
    assert java_long_hash(v) == expected
    assert key_hash(v) == expected


def test_bool_keys_use_java_boolean_hash_not_long_hash() -> None:
    assert key_hash(True) == 1231
    assert key_hash(False) == 1237
    assert key_hash(np.bool_(True)) == 1231
    assert key_hash(1) == 1  # the int 1 is a Long key, distinct from True


@pytest.mark.parametrize(
    ("b", "expected"),
    [(b"", 1), (b"\x00", 31), (b"\xff", 30), (b"a", 31 + 97), (b"\x80\x7f", 31 * (31 - 128) + 127)],
)
def test_bytes_hash_is_java_arrays_hashcode(b: bytes, expected: int) -> None:
    assert java_bytes_hash(b) == expected
    assert key_hash(b) == key_hash(bytearray(b)) == key_hash(memoryview(b)) == expected


def test_tuple_hash_is_flink_tuple_hashcode() -> None:
    assert key_hash(()) == 0
    assert key_hash(("a",)) == 97
    assert key_hash(("a", 1)) == 31 * 97 + 1
    assert key_hash((None, 1)) == 1
    assert key_hash(("a", None)) == 31 * 97
    assert key_hash((("a", 1), True)) == _signed32(31 * (31 * 97 + 1) + 1231)
    # Wraps like Java int arithmetic.
    assert key_hash(("polygenelubricants", 0)) == _signed32(31 * -(2**31))


def test_subclass_keys_hash_by_value() -> None:
    class Color(str, enum.Enum):  # noqa: UP042 - the mixin whose str() is not its value
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 123456789012

    point = collections.namedtuple("point", "name id")
    assert key_hash(Color.RED) == key_hash("red")
    assert key_hash(Level.HIGH) == key_hash(123456789012)
    assert key_hash(point("a", 1)) == key_hash(("a", 1))


def test_numpy_integer_scalars_hash_like_ints() -> None:
    assert key_hash(np.int64(123456789012)) == key_hash(123456789012)
    assert key_hash(np.int32(-5)) == key_hash(-5)
    assert key_hash(np.str_("hello")) == 99162322


@settings(deadline=None)
@given(st.text(max_size=200))
def test_string_hash_matches_reference(s: str) -> None:
    assert java_string_hash(s) == ref_string_hash(s)


def test_long_strings_use_same_hash_as_short_path() -> None:
    for s in ["x" * 10_000, "é" * 3000 + "😀" * 500, "a😀" * 40]:
        assert java_string_hash(s) == ref_string_hash(s)
    b = bytes(range(256)) * 20
    assert java_bytes_hash(b) == ref_bytes_hash(b)


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_bytes_hash_matches_reference(b: bytes) -> None:
    assert java_bytes_hash(b) == ref_bytes_hash(b)


@settings(max_examples=2000, deadline=None)
@given(INT32)
def test_murmur_hash_is_murmur3_with_flink_sign_rule(code: int) -> None:
    expected = ref_flink_murmur(code)
    assert murmur_hash(code) == expected
    assert 0 <= expected < 2**31
    # The same 32 bits given unsigned give the same answer.
    assert murmur_hash(code % 2**32) == expected


def test_murmur_edges() -> None:
    for code in (0, 1, -1, 2**31 - 1, -(2**31)):
        assert murmur_hash(code) == ref_flink_murmur(code)


@settings(deadline=None)
@given(st.lists(INT32, max_size=50))
def test_murmur_hash_array_equals_scalar(codes: list[int]) -> None:
    arr = np.array(codes, dtype=np.int32)
    out = murmur_hash_array(arr)
    assert out.dtype == np.int32
    assert out.tolist() == [murmur_hash(c) for c in codes]
    assert arr.tolist() == codes  # input untouched


# --- vectorised == scalar ---

EXTREME_INT64 = st.sampled_from([0, 1, -1, 2**31, -(2**31), 2**32, 2**63 - 1, -(2**63)])


@settings(deadline=None)
@given(st.lists(st.one_of(INT64, EXTREME_INT64), max_size=60))
def test_key_hashes_int64_equals_scalar(values: list[int]) -> None:
    expected = [key_hash(v) for v in values]
    np_arr = np.array(values, dtype=np.int64)
    assert key_hashes(np_arr).tolist() == expected
    assert key_hashes(pa.array(values, type=pa.int64())).tolist() == expected
    chunked = pa.chunked_array([values[: len(values) // 2], values[len(values) // 2 :]], pa.int64())
    assert key_hashes(chunked).tolist() == expected
    assert key_hashes(values).tolist() == expected
    assert key_hashes(np_arr).dtype == np.int32


@settings(deadline=None)
@given(st.lists(INT32, max_size=40))
def test_key_hashes_narrow_int_arrays_equal_scalar(values: list[int]) -> None:
    expected = [key_hash(v) for v in values]
    assert key_hashes(np.array(values, dtype=np.int32)).tolist() == expected
    assert key_hashes(pa.array(values, type=pa.int32())).tolist() == expected


def test_key_hashes_uint64_within_long_range() -> None:
    values = [0, 2**63 - 1]
    assert key_hashes(np.array(values, dtype=np.uint64)).tolist() == [key_hash(v) for v in values]


TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)


@settings(deadline=None)
@given(st.lists(st.one_of(TEXT, st.sampled_from(["", "😀x", "hello", "é😀€"])), max_size=40))
def test_key_hashes_strings_equal_scalar(strings: list[str]) -> None:
    expected = [key_hash(s) for s in strings]
    assert key_hashes(pa.array(strings, type=pa.string())).tolist() == expected
    assert key_hashes(pa.array(strings, type=pa.large_string())).tolist() == expected
    assert key_hashes(pa.array(strings, type=pa.string_view())).tolist() == expected
    assert key_hashes(strings).tolist() == expected
    # Sliced arrays read only their own window of the shared buffers.
    padded = pa.array(["pre😀", *strings, "post"], type=pa.string())
    assert key_hashes(padded.slice(1, len(strings))).tolist() == expected


@settings(deadline=None)
@given(st.lists(st.text(alphabet="ab😀\x00é", max_size=8), max_size=20))
def test_key_hashes_numpy_str_array_equals_scalar_of_elements(strings: list[str]) -> None:
    arr = np.array(strings, dtype=str) if strings else np.array([], dtype=str)
    # NumPy drops trailing NULs of each element; the scalar hash of each element sees the same.
    assert key_hashes(arr).tolist() == [key_hash(str(s)) for s in arr]


@settings(deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=40))
def test_key_hashes_bytes_equal_scalar(blobs: list[bytes]) -> None:
    expected = [key_hash(b) for b in blobs]
    assert key_hashes(pa.array(blobs, type=pa.binary())).tolist() == expected
    assert key_hashes(pa.array(blobs, type=pa.large_binary())).tolist() == expected
    assert key_hashes(blobs).tolist() == expected


def test_key_hashes_fixed_size_binary_and_bool() -> None:
    blobs = [b"\x00\xff", b"ab", b"\x80\x80"]
    assert key_hashes(pa.array(blobs, type=pa.binary(2))).tolist() == [key_hash(b) for b in blobs]
    flags = [True, False, True]
    assert key_hashes(pa.array(flags)).tolist() == [1231, 1237, 1231]
    assert key_hashes(np.array(flags)).tolist() == [1231, 1237, 1231]


def test_key_hashes_batches_large_string_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "_BATCH_ROWS", 7)
    strings = [f"key-{i}-{'😀' * (i % 3)}" for i in range(100)]
    expected = [ref_string_hash(s) for s in strings]
    assert key_hashes(pa.array(strings)).tolist() == expected


def test_key_hashes_fixed_width_strings_equal_reference() -> None:
    # Equal-length keys take a reshaped path; non-BMP keys of equal UTF-16 length do too.
    for strings in (
        [f"card-{i:06d}" for i in range(500)],
        ["😀a", "b😀", "éé😀"[:2] + "x"],
        ["", "", ""],
        ["a"],
    ):
        assert key_hashes(pa.array(strings)).tolist() == [ref_string_hash(s) for s in strings]


def test_key_hashes_mixed_python_sequence_and_empty_inputs() -> None:
    keys = ["a", 1, True, b"x", ("a", 1)]
    assert key_hashes(keys).tolist() == [key_hash(k) for k in keys]
    assert key_hashes(np.array(keys, dtype=object)).tolist() == [key_hash(k) for k in keys]
    empty: object
    for empty in (
        [],
        np.array([], dtype=np.int64),
        pa.array([], pa.string()),
        pa.chunked_array([], pa.int64()),
    ):
        out = key_hashes(empty)
        assert out.dtype == np.int32 and out.size == 0


# --- bad input ---


@pytest.mark.parametrize("key", [1.5, None, [1, 2], {"a": 1}, object(), ("a", 1.0)])
def test_unsupported_keys_name_the_type_and_the_supported_ones(key: object) -> None:
    with pytest.raises(UnsupportedKeyType, match="supported key types are str, int") as info:
        key_hash(key)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("v", [2**63, -(2**63) - 1, 10**30])
def test_int_keys_beyond_64_bits_are_rejected_with_a_fix(v: int) -> None:
    with pytest.raises(UnsupportedKeyType, match=r"outside the signed 64-bit range.*use a str"):
        key_hash(v)


def test_vectorised_bad_input() -> None:
    with pytest.raises(UnsupportedKeyType, match="null"):
        key_hashes(pa.array(["a", None]))
    with pytest.raises(UnsupportedKeyType, match="float"):
        key_hashes(np.array([1.0, 2.0]))
    with pytest.raises(UnsupportedKeyType, match="double"):
        key_hashes(pa.array([1.0]))
    with pytest.raises(UnsupportedKeyType, match="64-bit"):
        key_hashes(np.array([2**63], dtype=np.uint64))
    with pytest.raises(UnsupportedKeyType, match="single str"):
        key_hashes("abc")
    with pytest.raises(UnsupportedKeyType, match="NoneType"):
        key_hashes([1, None])


def test_murmur_rejects_values_that_are_not_32_bit() -> None:
    with pytest.raises(InvalidKeyHash, match="not a 32-bit int"):
        murmur_hash(2**32)
    for bad in (1.0, True, None, "1"):
        with pytest.raises(InvalidKeyHash, match="not a 32-bit int"):
            murmur_hash(bad)  # type: ignore[arg-type]  # a wrong value on purpose
    assert murmur_hash(np.int32(-7)) == murmur_hash(-7)  # type: ignore[arg-type]  # NumPy int on purpose
    with pytest.raises(InvalidKeyHash, match="32-bit"):
        murmur_hash_array(np.array([2**40], dtype=np.int64))
    with pytest.raises(InvalidKeyHash, match="integer array"):
        murmur_hash_array(np.array([1.0]))
    with pytest.raises(UnsupportedKeyType, match="needs a str"):
        java_string_hash(b"abc")  # type: ignore[arg-type]  # a wrong value on purpose
