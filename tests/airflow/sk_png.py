"""A small PNG reader for the browser test: checks the container, then decodes the pixels.

Only what a Chromium screenshot uses: 8-bit RGB or RGBA, not interlaced. No imaging library is
installed, and the test needs to know the screenshot is a real picture, not just a PNG header.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type -> channels (RGB, RGBA)


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    pixels: np.ndarray  # (height, width, channels) uint8

    def rgb(self) -> np.ndarray:
        return self.pixels[:, :, :3]


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG: bad signature")
    out, pos = [], len(SIGNATURE)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"not a valid PNG: bad CRC in chunk {kind!r}")
        out.append((kind, body))
        pos += 12 + length
        if kind == b"IEND":
            return out
    raise ValueError("not a valid PNG: no IEND chunk (truncated)")


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter_row(kind: int, row: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return row
    if kind == 1:  # Sub: a running sum per channel, which numpy does in one go
        pixels = row.reshape(-1, bpp).astype(np.uint64)
        return (np.cumsum(pixels, axis=0) % 256).astype(np.uint8).reshape(-1)
    if kind == 2:
        return ((row.astype(np.uint16) + prev) % 256).astype(np.uint8)
    out = bytearray(row.tobytes())
    up = prev.tobytes()
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        c = up[i - bpp] if i >= bpp else 0
        if kind == 3:
            out[i] = (out[i] + ((a + up[i]) >> 1)) & 0xFF
        elif kind == 4:
            out[i] = (out[i] + _paeth(a, up[i], c)) & 0xFF
        else:
            raise ValueError(f"not a valid PNG: unknown filter type {kind}")
    return np.frombuffer(bytes(out), dtype=np.uint8)


def decode(data: bytes) -> Image:
    parts = chunks(data)
    if parts[0][0] != b"IHDR":
        raise ValueError("not a valid PNG: IHDR is not the first chunk")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", parts[0][1])
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(
            f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}"
        )
    bpp = CHANNELS[colour]
    raw = np.frombuffer(zlib.decompress(b"".join(b for k, b in parts if k == b"IDAT")), np.uint8)
    stride = width * bpp + 1
    if raw.size != stride * height:
        raise ValueError("not a valid PNG: image data does not match its header")
    rows = raw.reshape(height, stride)
    pixels = np.empty((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.uint8)
    for y in range(height):
        prev = pixels[y] = _unfilter_row(int(rows[y, 0]), rows[y, 1:], prev, bpp)
    return Image(width, height, pixels.reshape(height, width, bpp))
