"""Java modified UTF-8 (``DataOutput.writeUTF``), the inverse of the readers' decoder."""

from __future__ import annotations

__all__ = ["encode_modified_utf8"]


def encode_modified_utf8(text: str) -> bytes:
    """``text`` as Java writes it: NUL as ``C0 80``, characters above U+FFFF as two 3-byte
    surrogates."""
    if text.isascii() and "\x00" not in text:
        return text.encode("ascii")
    units = text.encode("utf-16-le", "surrogatepass")
    out = bytearray()
    for i in range(0, len(units), 2):
        u = units[i] | (units[i + 1] << 8)
        if 0 < u < 0x80:
            out.append(u)
        elif u < 0x800:
            out += bytes([0xC0 | (u >> 6), 0x80 | (u & 0x3F)])
        else:
            out += bytes([0xE0 | (u >> 12), 0x80 | ((u >> 6) & 0x3F), 0x80 | (u & 0x3F)])
    return bytes(out)
