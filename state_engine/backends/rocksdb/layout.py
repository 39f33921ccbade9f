"""The RocksDB backend's key and value layout (see :mod:`.backend` for the whole picture).

A row key is ``key-group prefix, varint(len(key)) key, varint(len(namespace)) namespace [suffix]``;
the default column family holds the state meta info under :data:`META_PREFIX`. These bytes are the
backend's alone: the native snapshot strategy reads them from here (to skip the meta column family
when it estimates rows per key group), nothing outside this package spells them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from state_engine.errors import SerializationError

#: the 8-byte big-endian ``expires_at`` before a TTL value or list element
EXPIRES_AT = struct.Struct(">q")
META_PREFIX = b"\x00meta:"
OLD_LIST_SEQ_KEY = b"\x00list-seq"  # only DBs of the one-row-per-element list layout have it
CF_PREFIX = "s:"


def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def encode_list(elements: Iterable[bytes], expiries: Iterable[int] | None = None) -> bytes:
    """One list value: ``[expires_at] varint(len) bytes`` per element (expiry only with TTL)."""
    if expiries is None:
        return b"".join(varint(len(e)) + e for e in elements)
    pack = EXPIRES_AT.pack
    return b"".join(pack(x) + varint(len(e)) + e for e, x in zip(elements, expiries, strict=True))


def decode_list(raw: bytes, ttl: bool) -> list[tuple[bytes, int | None]]:
    """The (element bytes, expires_at or None) of one list value."""
    out: list[tuple[bytes, int | None]] = []
    pos, end = 0, len(raw)
    unpack = EXPIRES_AT.unpack_from
    try:
        while pos < end:
            exp = None
            if ttl:
                exp = unpack(raw, pos)[0]
                pos += 8
            n = raw[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_varint(raw, pos)
            out.append((raw[pos : pos + n], exp))
            pos += n
    except (IndexError, struct.error):
        pos = end + 1
    if pos != end:
        raise SerializationError(
            f"list value of {end} bytes is truncated: it was not written by this list layout "
            "(restore the state from a canonical snapshot)"
        )
    return out


def list_values(raw: bytes) -> list[bytes]:
    """The element bytes of a list value without TTL (the ``get`` hot path)."""
    out = []
    pos, end = 0, len(raw)
    while pos < end:
        n = raw[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_varint(raw, pos)
        out.append(raw[pos : pos + n])
        pos += n
    return out
