"""Key -> Java-compatible signed int32 hash, scalar and vectorised.

These rules are the platform's stable contract: snapshots store ``key_hash`` and the key groups
derived from it, so changing any rule invalidates every stored snapshot. The rule per key type
(Java ``Boolean``, ``String``, ``Long``, ``Arrays.hashCode(byte[])`` and Flink ``TupleN`` hash
codes; anything else is :class:`~state_engine.errors.UnsupportedKeyType`) is in
``docs/architecture.md``, "Keys, key groups and subtasks". ``bool`` is checked before ``int``
because it is a subclass of ``int`` in Python.

``murmur_hash`` is Flink's ``MathUtils.murmurHash``: 32-bit MurmurHash3 of the int's four
little-endian bytes with seed 0, folded to a non-negative int. :func:`key_hashes` hashes strings
and bytes with NumPy over all code units of a batch at once; only plain Python sequences take the
scalar function.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.errors import InvalidKeyHash, UnsupportedKeyType

__all__ = [
    "java_string_hash",
    "java_long_hash",
    "java_bytes_hash",
    "murmur_hash",
    "murmur_hash_array",
    "key_hash",
    "key_hashes",
]

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_INT32_MIN = -(1 << 31)
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_TRUE_HASH = 1231
_FALSE_HASH = 1237
_SUPPORTED = "str, int (signed 64-bit), bool, bytes/bytearray/memoryview, or a tuple of these"

# Strings at least this long are hashed with NumPy; below it the Python loop is faster.
_NUMPY_MIN_UNITS = 48
# Rows per NumPy batch in key_hashes: bounds the temporary arrays for huge inputs.
_BATCH_ROWS = 1 << 16


def _to_int32(h: int) -> int:
    """Reinterpret the low 32 bits of ``h`` as a signed Java int."""
    h &= _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


# --- powers of 31 modulo 2**32, shared by the polynomial hashes ---

_pow31 = np.ones(1, dtype=np.uint32)


def _powers_of_31(n: int) -> npt.NDArray[np.uint32]:
    """``31**k mod 2**32`` for ``k`` in ``0..n-1`` (grown on demand and kept)."""
    global _pow31
    if len(_pow31) < n:
        size = max(n, 2 * len(_pow31))
        table = np.full(size, 31, dtype=np.uint32)
        table[0] = 1
        _pow31 = np.cumprod(table, dtype=np.uint32)  # uint32 products wrap, i.e. mod 2**32
    return _pow31[:n]


def _polynomial_hash_units(units: npt.NDArray[Any]) -> int:
    """``sum(u_i * 31**(n-1-i)) mod 2**32`` of one sequence of code units (unsigned result)."""
    weights = _powers_of_31(len(units))[::-1]
    return int(np.sum(units.astype(np.uint32) * weights, dtype=np.uint32))


# --- scalar hashes ---


@functools.lru_cache(maxsize=1 << 16)
def java_string_hash(s: str) -> int:
    """Java ``String.hashCode`` of ``s`` as a signed int32 (cached: keys repeat per record)."""
    if not isinstance(s, str):
        raise UnsupportedKeyType(
            f"java_string_hash needs a str, got {type(s).__name__}: "
            "use key_hash for other key types"
        )
    if s.isascii():
        data: Any = s.encode("ascii")
    else:
        data = memoryview(s.encode("utf-16-le")).cast("H")
    if len(data) >= _NUMPY_MIN_UNITS:
        dtype = np.uint8 if isinstance(data, bytes) else np.uint16
        return _to_int32(_polynomial_hash_units(np.frombuffer(data, dtype=dtype)))
    h = 0
    for unit in data:
        h = (31 * h + unit) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


def java_long_hash(v: int) -> int:
    """Java ``Long.hashCode(v)``: ``(int)(v ^ (v >>> 32))``; ``v`` must fit a signed 64-bit int."""
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise UnsupportedKeyType(
            f"int key {v} is outside the signed 64-bit range [{_INT64_MIN}, {_INT64_MAX}] "
            "that Java Long keys have: use a str or bytes key for larger numbers"
        )
    u = v & _MASK64
    h = (u ^ (u >> 32)) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


def java_bytes_hash(data: bytes | bytearray | memoryview) -> int:
    """Java ``Arrays.hashCode(byte[])`` (bytes taken as signed) as a signed int32."""
    raw = data.tobytes() if isinstance(data, memoryview) else data
    n = len(raw)
    if n >= _NUMPY_MIN_UNITS:
        signed = np.frombuffer(raw, dtype=np.int8).astype(np.uint32)  # -1 -> 0xFFFFFFFF: wraps
        return _to_int32(int(_powers_of_31(n + 1)[n]) + _polynomial_hash_units(signed))
    h = 1
    for b in raw:
        h = (31 * h + (b - 256 if b > 127 else b)) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


def _check_key_hash(code: object) -> int:
    if isinstance(code, int | np.integer) and not isinstance(code, bool | np.bool_):
        value = int(code)
        if _INT32_MIN <= value <= _MASK32:
            return value
    raise InvalidKeyHash(
        f"key hash {code!r} is not a 32-bit int (allowed: {_INT32_MIN}..{_MASK32}): "
        "pass the value of key_hash(key)"
    )


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: a non-negative int in ``0..2**31-1``.

    ``code`` is a Java int: signed int32, or the same 32 bits given as an unsigned value.
    """
    if type(code) is not int or not _INT32_MIN <= code <= _MASK32:
        code = _check_key_hash(code)
    # Bits above 32 only ever flow upwards through * and +, so masking once after each
    # rotate-multiply (not after the rotate too) gives the same low 32 bits, with fewer operations.
    c = (code * 0xCC9E2D51) & _MASK32
    c = (((c << 15) | (c >> 17)) * 0x1B873593) & _MASK32
    c = ((((c << 13) | (c >> 19)) * 5 + 0xE6546B64) & _MASK32) ^ 4
    c ^= c >> 16
    c = (c * 0x85EBCA6B) & _MASK32
    c ^= c >> 13
    c = (c * 0xC2B2AE35) & _MASK32
    c ^= c >> 16
    if c < 0x80000000:
        return c
    # Negative as int32: Flink negates it, except Integer.MIN_VALUE, which it maps to 0.
    return 0x100000000 - c if c != 0x80000000 else 0


def key_hash(key: object) -> int:
    """The signed int32 hash of ``key`` under the rules in this module's docstring."""
    t = type(key)
    if t is str:
        return java_string_hash(key)  # lru_cache: any hashable argument type-checks
    if t is int:
        return java_long_hash(key)  # type: ignore[arg-type]  # t is int: key is an int
    if t is bool or isinstance(key, np.bool_):
        return _TRUE_HASH if key else _FALSE_HASH
    if t is bytes or t is bytearray or t is memoryview:
        return java_bytes_hash(key)  # type: ignore[arg-type]  # t is one of the three types
    if t is tuple:
        h = 0
        for field in key:  # type: ignore[attr-defined]  # t is tuple: key is a tuple
            h = (31 * h + (0 if field is None else key_hash(field))) & _MASK32
        return h - 0x100000000 if h & 0x80000000 else h
    # Subclasses and NumPy scalars: slower checks, kept off the common path above.
    if isinstance(key, bool):
        return _TRUE_HASH if key else _FALSE_HASH
    # str()/int() may be overridden by a subclass (a (str, Enum) member's str() is "Cls.NAME"):
    # the base-class methods give the value itself.
    if isinstance(key, str):
        return java_string_hash(str.__str__(key))
    if isinstance(key, int):
        return java_long_hash(int.__int__(key))
    if isinstance(key, np.integer):
        return java_long_hash(int(key))
    if isinstance(key, bytes | bytearray | memoryview):
        return java_bytes_hash(bytes(key))
    if isinstance(key, tuple):
        return key_hash(tuple(key))
    raise UnsupportedKeyType(
        f"cannot hash a key of type {t.__name__} ({key!r:.60}): supported key types are "
        f"{_SUPPORTED}; convert the key to one of them (e.g. str(key))"
    )


# --- vectorised ---


def murmur_hash_array(codes: npt.ArrayLike) -> npt.NDArray[np.int32]:
    """:func:`murmur_hash` of every element of an int32 array (other integer dtypes must fit)."""
    arr = np.asarray(codes)
    if arr.dtype == np.int32 or arr.dtype == np.uint32:
        c = arr.astype(np.uint32)  # same bits; a copy, so the caller's array is untouched
    elif arr.dtype.kind in "iu":
        if arr.size and (int(arr.min()) < _INT32_MIN or int(arr.max()) > _MASK32):
            raise InvalidKeyHash(
                f"key hashes must be 32-bit ints ({_INT32_MIN}..{_MASK32}), got values in "
                f"{int(arr.min())}..{int(arr.max())}: pass the output of key_hashes"
            )
        c = arr.astype(np.int64).astype(np.uint32)
    else:
        raise InvalidKeyHash(
            f"key hashes must be an integer array, got dtype {arr.dtype}: pass the output of "
            "key_hashes"
        )
    c *= np.uint32(0xCC9E2D51)
    c = (c << np.uint32(15)) | (c >> np.uint32(17))
    c *= np.uint32(0x1B873593)
    c = (c << np.uint32(13)) | (c >> np.uint32(19))
    c *= np.uint32(5)
    c += np.uint32(0xE6546B64)
    c ^= np.uint32(4)
    c ^= c >> np.uint32(16)
    c *= np.uint32(0x85EBCA6B)
    c ^= c >> np.uint32(13)
    c *= np.uint32(0xC2B2AE35)
    c ^= c >> np.uint32(16)
    signed = c.view(np.int32)
    # Flink's sign rule; np.abs wraps Integer.MIN_VALUE to itself, which then becomes 0.
    out = np.abs(signed)
    out[out == np.int32(_INT32_MIN)] = 0
    return out


def _long_hashes(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    u = values.view(np.uint64)
    return (u ^ (u >> np.uint64(32))).astype(np.uint32).view(np.int32)


def _integer_array_hashes(arr: npt.NDArray[Any]) -> npt.NDArray[np.int32]:
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > _INT64_MAX:
        raise UnsupportedKeyType(
            f"int key {int(arr.max())} is outside the signed 64-bit range [{_INT64_MIN}, "
            f"{_INT64_MAX}] that Java Long keys have: use str or bytes keys for larger numbers"
        )
    return _long_hashes(np.ascontiguousarray(arr, dtype=np.int64))


def _segmented_polynomial(
    units: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint32]:
    """Per segment ``offsets[i]:offsets[i+1]`` of ``units``: ``sum(u_j * 31**(end-1-j)) mod 2**32``.

    ``offsets`` starts at 0 and ends at ``len(units)``; empty segments give 0.
    """
    lengths = np.diff(offsets)
    if len(units) == 0:
        return np.zeros(len(lengths), dtype=np.uint32)
    width = int(lengths[0])
    if width * len(lengths) == len(units) and (lengths == width).all():
        # Fixed-width keys (formatted ids) need no per-unit index arrays: one row per key.
        weights = _powers_of_31(width)[::-1]
        fixed: npt.NDArray[np.uint32] = (units.reshape(-1, width) * weights).sum(
            axis=1, dtype=np.uint32
        )
        return fixed
    out = np.zeros(len(lengths), dtype=np.uint32)
    # Exponent of unit j is (end of its segment - 1 - j).
    ends = np.repeat(offsets[1:], lengths)
    exponents = ends - 1 - np.arange(len(units), dtype=np.int64)
    terms = units * _powers_of_31(int(lengths.max()))[exponents]
    nonempty = lengths > 0
    # reduceat over the starts of non-empty segments: each runs to the next one's start, which is
    # its own end because empty segments in between hold no units.
    out[nonempty] = np.add.reduceat(terms, offsets[:-1][nonempty], dtype=np.uint32)
    return out


def _reject_nulls(arr: pa.Array) -> None:
    if arr.null_count:
        raise UnsupportedKeyType(
            f"key array has {arr.null_count} null(s): None is not a key; drop or fill the nulls "
            "before hashing"
        )


def _value_offsets(arr: pa.Array) -> tuple[np.ndarray, memoryview]:
    """Offsets (rebased to 0) and value bytes of a (large_)string/binary array, honouring slices."""
    offset_type = (
        np.int64
        if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        else np.int32
    )
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[arr.offset : arr.offset + len(arr) + 1]
    offsets = offsets.astype(np.int64)
    base, stop = int(offsets[0]), int(offsets[-1])
    data = memoryview(buffers[2] if buffers[2] is not None else b"")[base:stop]
    return offsets - base, data


def _string_array_hashes(arr: pa.Array) -> npt.NDArray[np.int32]:
    if pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.large_string())
    byte_offsets, data = _value_offsets(arr)
    text = bytes(data).decode("utf-8")
    if text.isascii():
        # ASCII: every byte is one UTF-16 code unit, so the byte offsets are unit offsets.
        units = np.frombuffer(data, dtype=np.uint8).astype(np.uint32)
        return _segmented_polynomial(units, byte_offsets).view(np.int32)
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    cp_lengths = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    cp_offsets = np.concatenate(([0], np.cumsum(cp_lengths)))
    # Each code point above the BMP is a surrogate pair: one extra unit.
    extra = np.concatenate(([0], np.cumsum(code_points > 0xFFFF)))
    unit_offsets = cp_offsets + extra[cp_offsets]
    units = np.frombuffer(text.encode("utf-16-le"), dtype=np.uint16).astype(np.uint32)
    return _segmented_polynomial(units, unit_offsets).view(np.int32)


def _binary_array_hashes(arr: pa.Array) -> npt.NDArray[np.int32]:
    if pa.types.is_binary_view(arr.type) or pa.types.is_fixed_size_binary(arr.type):
        arr = arr.cast(pa.large_binary())
    offsets, data = _value_offsets(arr)
    units = np.frombuffer(data, dtype=np.int8).astype(np.uint32)  # signed bytes, wrapped
    h = _segmented_polynomial(units, offsets)
    # Arrays.hashCode starts at 1, which contributes 31**n.
    h += _powers_of_31(int(np.diff(offsets).max(initial=0)) + 1)[np.diff(offsets)]
    return h.view(np.int32)


def _arrow_array_hashes(arr: pa.Array) -> npt.NDArray[np.int32]:
    _reject_nulls(arr)
    t = arr.type
    if pa.types.is_integer(t):
        return _integer_array_hashes(arr.to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(t):
        values = arr.to_numpy(zero_copy_only=False)
        return np.where(values, np.int32(_TRUE_HASH), np.int32(_FALSE_HASH)).astype(np.int32)
    is_str = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    is_bin = (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )
    if not (is_str or is_bin):
        raise UnsupportedKeyType(
            f"cannot hash an Arrow array of type {t}: supported are integer, boolean, string "
            "and binary arrays; cast the keys to one of them"
        )
    fn = _string_array_hashes if is_str else _binary_array_hashes
    if len(arr) <= _BATCH_ROWS:
        return fn(arr)
    parts = [fn(arr.slice(i, _BATCH_ROWS)) for i in range(0, len(arr), _BATCH_ROWS)]
    return np.concatenate(parts)


def key_hashes(keys: Any) -> npt.NDArray[np.int32]:
    """:func:`key_hash` of every key, as an int32 array.

    Accepts a NumPy integer, bool or str array, a pyarrow integer, boolean, (large_)string or
    (large_)binary Array or ChunkedArray (no nulls), or any iterable of keys (hashed one by one).
    """
    if isinstance(keys, pa.ChunkedArray):
        if keys.num_chunks == 0:
            return np.empty(0, dtype=np.int32)
        return np.concatenate([_arrow_array_hashes(chunk) for chunk in keys.chunks])
    if isinstance(keys, pa.Array):
        return _arrow_array_hashes(keys)
    if isinstance(keys, np.ndarray):
        kind = keys.dtype.kind
        if kind in "iu":
            return _integer_array_hashes(keys.ravel())
        if kind == "b":
            return np.where(keys.ravel(), np.int32(_TRUE_HASH), np.int32(_FALSE_HASH)).astype(
                np.int32
            )
        if kind in "UT":  # fixed-width unicode and NumPy 2 StringDType
            return _arrow_array_hashes(pa.array(keys.ravel().astype(object), type=pa.string()))
        if kind == "O":
            return _iterable_hashes(keys.ravel())
        raise UnsupportedKeyType(
            f"cannot hash a NumPy array of dtype {keys.dtype}: supported are integer, bool and "
            "str arrays (or object arrays of supported keys); convert the keys first"
        )
    if isinstance(keys, str | bytes | bytearray | memoryview):
        raise UnsupportedKeyType(
            f"key_hashes needs a collection of keys, got a single {type(keys).__name__}: "
            "use key_hash for one key, or wrap it in a list"
        )
    if not isinstance(keys, Iterable):
        raise UnsupportedKeyType(
            f"key_hashes needs an array or iterable of keys, got {type(keys).__name__}"
        )
    return _iterable_hashes(keys)


def _iterable_hashes(keys: Iterable[object]) -> npt.NDArray[np.int32]:
    return np.fromiter((key_hash(k) for k in keys), dtype=np.int32)
