"""Snappy decompression for Flink snapshots taken with snapshot compression.

With ``execution.checkpointing.snapshot-compression`` Flink's ``SnappyStreamCompressionDecorator``
wraps each key group of a canonical savepoint, and each state section of a heap key group, in
xerial's ``SnappyFramedOutputStream``: the snappy *framing format* (a ``0xFF "sNaPpY"`` stream
identifier chunk, then chunks of type ``0x00`` compressed or ``0x01`` uncompressed data, each with
a 4-byte masked CRC-32C; skippable chunks ``0x80-0xFE``).
Each wrapped piece is its own stream, so a new identifier chunk starts the next piece.

Pure Python: the block format is short, and the snapshots are small enough. CRCs are not checked
(a corrupt block still fails on the layout it decodes into).
"""

from __future__ import annotations

from state_engine.errors import FlinkStateError

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def _fail(where: str, at: int, what: str) -> FlinkStateError:
    return FlinkStateError(
        f"{where}: at byte {at} expected {what} in a snappy-compressed section (the data is "
        "truncated or corrupt; re-copy the snapshot)"
    )


def decompress_block(data: bytes, where: str = "snappy block") -> bytes:
    """One snappy raw block: varint uncompressed length, then literal and copy elements."""
    n = len(data)
    pos = shift = length = 0
    while True:
        if pos >= n:
            raise _fail(where, pos, "the uncompressed length")
        b = data[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 35:
            raise _fail(where, pos, "a varint of at most 5 bytes")
    out = bytearray()
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                if pos + extra > n:
                    raise _fail(where, pos, "a literal length")
                size = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            size += 1
            if pos + size > n:
                raise _fail(where, pos, f"{size} literal bytes")
            out += data[pos : pos + size]
            pos += size
            continue
        if kind == 1:
            if pos >= n:
                raise _fail(where, pos, "a copy offset")
            size = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            if pos + width > n:
                raise _fail(where, pos, "a copy offset")
            size = (tag >> 2) + 1
            offset = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        if offset == 0 or offset > len(out):
            raise _fail(where, pos, f"a copy offset within the {len(out)} bytes so far")
        start = len(out) - offset
        if offset >= size:
            out += out[start : start + size]
        else:  # an overlapping copy repeats the last `offset` bytes
            for i in range(size):
                out.append(out[start + i])
    if len(out) != length:
        raise _fail(where, pos, f"{length} uncompressed bytes, got {len(out)}")
    return bytes(out)


def read_framed(
    data: bytes, pos: int, end: int, where: str, *, identifier: bool = True
) -> tuple[bytes, int]:
    """One framed stream starting at ``pos``: its uncompressed bytes and where it stopped.

    The stream runs until ``end`` or the next stream identifier chunk (the next wrapped piece).
    ``identifier=False`` starts at a chunk boundary inside a stream (operator state offsets:
    Flink flushes a chunk at each list element).
    """
    end = min(end, len(data))
    if identifier:
        if data[pos : pos + len(STREAM_IDENTIFIER)] != STREAM_IDENTIFIER:
            raise _fail(where, pos, "the snappy stream identifier chunk (ff 06 00 00 sNaPpY)")
        pos += len(STREAM_IDENTIFIER)
    out = bytearray()
    while pos < end:
        kind = data[pos]
        if kind == 0xFF:
            break
        if pos + 4 > end:
            raise _fail(where, pos, "a chunk header")
        size = int.from_bytes(data[pos + 1 : pos + 4], "little")
        body = pos + 4
        if body + size > end:
            raise _fail(where, pos, f"a {size}-byte chunk")
        if kind == 0x00:
            out += decompress_block(data[body + 4 : body + size], where)
        elif kind == 0x01:
            out += data[body + 4 : body + size]
        elif kind < 0x80:
            raise _fail(where, pos, f"a known chunk type (found reserved type {kind:#x})")
        pos = body + size
    return bytes(out), pos
