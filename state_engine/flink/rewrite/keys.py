"""Java ``hashCode`` of a Flink key from its serialized bytes, for re-assigning key groups.

A key group is ``murmurHash(key.hashCode()) % maxParallelism`` (Flink's
``KeyGroupRangeAssignment``); the hash codes reproduced here are those of ``String``, ``Long``,
``Integer``, ``Short``, ``Byte``, ``Character``, ``Boolean``, ``Double``, ``Float``, ``Row`` (of
those) and Flink SQL's ``BinaryRowData``. Any other key serializer cannot be re-hashed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from state_engine.flink.serializers import Buf, FlinkSerializer, RowSerializer
from state_engine.hashing import java_long_hash, java_string_hash, murmur_hash

__all__ = ["BINARY_ROW", "KeyHasher", "binary_row_hash", "key_hasher", "unsupported_key"]

BINARY_ROW = "binary-row"
_MASK32 = 0xFFFFFFFF
_SCALARS = ("string", "long", "int", "short", "byte", "char", "boolean", "double", "float")


def _i32(h: int) -> int:
    h &= _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


def _double_hash(v: float) -> int:
    bits = 0x7FF8000000000000 if v != v else struct.unpack(">q", struct.pack(">d", v))[0]
    return java_long_hash(bits)


def _float_hash(v: float) -> int:
    if v != v:
        return 0x7FC00000
    return int(struct.unpack(">i", struct.pack(">f", v))[0])


def scalar_hash(kind: str, value: Any) -> int:
    """Java ``hashCode`` of a decoded boxed value of serializer kind ``kind``."""
    if kind == "string":
        return java_string_hash(value)
    if kind == "long":
        return java_long_hash(value)
    if kind in ("int", "short", "byte"):
        return int(value)
    if kind == "char":
        return ord(value)
    if kind == "boolean":
        return 1231 if value else 1237
    if kind == "double":
        return _double_hash(value)
    if kind == "float":
        return _float_hash(value)
    raise ValueError(kind)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _MASK32
    k1 = _rotl(k1, 15)
    return (k1 * 0x1B873593) & _MASK32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK32


def binary_row_hash(data: bytes) -> int:
    """``BinaryRowData.hashCode``: Flink's ``MurmurHashUtil.hashUnsafeBytes`` with seed 42 (4-byte
    little-endian words, then each tail byte mixed on its own, signed)."""
    n = len(data)
    aligned = n - n % 4
    h1 = 42
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _MASK32))
    h1 ^= n
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK32
    h1 ^= h1 >> 16
    return _i32(h1)


#: (key bytes buffer positioned at the key) -> Java hashCode; the buffer ends after the key
KeyHasher = Callable[[Buf], int]


def _row_hasher(ser: RowSerializer) -> KeyHasher | None:
    kinds = [getattr(f, "kind", "") for f in ser.fields]
    if any(k not in _SCALARS for k in kinds):
        return None

    def hasher(buf: Buf) -> int:
        row = ser.read(buf)
        # Row.hashCode (Flink 2.3, checked against its JVM): 31 * kind byte (INSERT = 0) plus
        # a polynomial from 1 over the fields, each field 31 + its hashCode (0 when null)
        h = 1
        for kind, value in zip(kinds, row, strict=True):
            field_hash = 0 if value is None else 31 + scalar_hash(kind, value)
            h = (31 * h + field_hash) & _MASK32
        return _i32(h)

    return hasher


def key_hasher(ser: FlinkSerializer) -> KeyHasher | None:
    """How to hash keys of serializer ``ser`` (None: its Java hashCode cannot be reproduced)."""
    kind = getattr(ser, "kind", "")
    if kind in _SCALARS:
        read = ser.read

        def scalar(buf: Buf) -> int:
            return scalar_hash(kind, read(buf))

        return scalar
    if kind == BINARY_ROW:

        def binary(buf: Buf) -> int:
            return binary_row_hash(buf.take(buf.i32()))

        return binary
    if isinstance(ser, RowSerializer):
        return _row_hasher(ser)
    return None


def unsupported_key(ser: FlinkSerializer) -> str | None:
    """The key serializer's class when its keys cannot be re-hashed, else None."""
    return None if key_hasher(ser) is not None else ser.java_class


def new_key_group(code: int, max_parallelism: int) -> int:
    return murmur_hash(code) % max_parallelism
