"""Flink's built-in serializer encodings, decoded (properties against independent encoders here)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.errors import FlinkStateError, UnsupportedFlinkSerializer
from state_engine.flink.serializers import (
    Buf,
    ListSerializer,
    MapSerializer,
    RowSerializer,
    _Scalar,
    decode_modified_utf8,
    read_serializer_snapshot,
)

LONG = _Scalar(
    "org.apache.flink.api.common.typeutils.base.LongSerializer$LongSerializerSnapshot", 8, "long"
)
STRING = _Scalar("StringSerializer$StringSerializerSnapshot", None, "string")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def string_value(s: str | None) -> bytes:
    """Flink's StringValue.writeString: varint(len+1), then each UTF-16 unit as a varint."""
    if s is None:
        return b"\x00"
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    return _varint(len(units) + 1) + b"".join(_varint(u) for u in units)


def modified_utf8(s: str) -> bytes:
    """Java DataOutput.writeUTF's body: NUL as C0 80, supplementary characters as two surrogates."""
    out = bytearray()
    for unit in struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be")):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes([0xC0 | unit >> 6, 0x80 | unit & 0x3F])
        else:
            out += bytes([0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F])
    return bytes(out)


@given(st.text())
def test_string_value_round_trips_every_text(s: str) -> None:
    data = string_value(s) + b"\xff"
    buf = Buf(data)
    assert buf.string_value() == s
    assert buf.pos == len(data) - 1


def test_string_value_null_and_known_bytes() -> None:
    assert Buf(b"\x00").string_value() is None
    # the fixture README: 京东商城 in a map key
    assert Buf(bytes.fromhex("05ac9d019c9c01c6aa01ceaf01")).string_value() == "京东商城"


@given(st.text())
def test_modified_utf8_round_trips_every_text(s: str) -> None:
    assert decode_modified_utf8(modified_utf8(s)) == s


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))))
def test_map_serializer_reads_flinks_layout(d: dict[str, int | None]) -> None:
    data = struct.pack(">i", len(d))
    for k, v in d.items():
        data += string_value(k) + (b"\x01" if v is None else b"\x00" + struct.pack(">q", v))
    ser = MapSerializer("MapSerializerSnapshot", None, STRING, LONG)
    buf = Buf(data)
    assert ser.read(buf) == d and buf.pos == len(data)


@given(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=1, max_size=12), st.booleans())
def test_row_serializer_null_mask(fields: list[str | None], row_kind: bool) -> None:
    bits = len(fields) + (2 if row_kind else 0)
    mask = 0
    nbytes = (bits + 7) // 8
    for i, f in enumerate(fields):
        if f is None:
            mask |= 1 << (nbytes * 8 - 1 - (2 if row_kind else 0) - i)
    data = mask.to_bytes(nbytes, "big") + b"".join(string_value(f) for f in fields if f is not None)
    ser = RowSerializer(
        "RowSerializer$RowSerializerSnapshot", None, (STRING,) * len(fields), row_kind
    )
    buf = Buf(data)
    assert ser.read(buf) == tuple(fields) and buf.pos == len(data)


@settings(max_examples=50)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6), st.data())
def test_any_truncation_is_a_flink_state_error(values: list[int], data: st.DataObject) -> None:
    encoded = struct.pack(">i", len(values)) + b"".join(struct.pack(">q", v) for v in values)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    ser = ListSerializer("ListSerializerSnapshot", None, LONG)
    with pytest.raises(FlinkStateError, match="byte"):
        ser.read(Buf(encoded[:cut], where="test"))


def _snapshot(cls: str, version: int = 3) -> bytes:
    name = cls.encode()
    return struct.pack(">i", 2) + struct.pack(">H", len(name)) + name + struct.pack(">i", version)


def test_primitive_arrays_and_unknown_classes() -> None:
    base = "org.apache.flink.api.common.typeutils.base.array."
    ints = read_serializer_snapshot(
        Buf(_snapshot(base + "IntPrimitiveArraySerializer$IntPrimitiveArraySerializerSnapshot"))
    )
    assert ints.read(Buf(struct.pack(">iii", 2, 7, -1))) == [7, -1]
    chars = read_serializer_snapshot(
        Buf(_snapshot(base + "CharPrimitiveArraySerializer$CharPrimitiveArraySerializerSnapshot"))
    )
    assert chars.read(Buf(struct.pack(">iHH", 2, ord("h"), ord("é")))) == ["h", "é"]
    with pytest.raises(UnsupportedFlinkSerializer, match="AvroSerializerSnapshot"):
        read_serializer_snapshot(
            Buf(_snapshot("org.apache.flink.formats.avro.typeutils.AvroSerializerSnapshot"))
        )


def test_lone_surrogates_decode_and_print_as_replacement_characters() -> None:
    from state_engine.flink.keyed_state import as_json, as_text

    lone = Buf(bytes([3]) + _varint(0xD800) + b"x").string_value()
    assert lone == "\ud800x"
    assert as_text(lone) == "\ufffdx" and as_json([lone]) == '["\ufffdx"]'
    assert as_text("🍕") == "🍕"  # a surrogate *pair* is a real character
