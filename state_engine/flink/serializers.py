"""Flink's built-in type serializers, decoded from the bytes Flink wrote (no JVM).

Two halves:

* :class:`Buf` reads Java ``DataOutputStream`` primitives, Java *modified* UTF-8 (``writeUTF``) and
  Flink's ``StringValue`` strings (varint length+1, then every UTF-16 unit as a varint: not UTF-8).
* :func:`read_serializer_snapshot` turns a ``TypeSerializerSnapshot`` as written in a keyed-backend
  header into a :class:`FlinkSerializer` that can read values. Serializer snapshots have no length
  prefix, so a snapshot class we do not know stops the header: :class:`UnsupportedFlinkSerializer`
  names the class.

Decoded values are plain Python: ``str``, ``int``, ``float``, ``bool``, ``bytes``, ``list``,
``dict``; a Flink ``Row`` is a ``tuple``; a TTL-wrapped value is :class:`TtlValue`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from state_engine.errors import FlinkStateError, UnsupportedFlinkSerializer

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_I16_FROM = _I16.unpack_from
_I32_FROM = _I32.unpack_from
_I64_FROM = _I64.unpack_from

# CompositeTypeSerializerSnapshot / NestedSerializersSnapshotDelegate magic numbers
COMPOSITE_MAGIC = 911108
NESTED_MAGIC = 1333245


class Buf:
    """A cursor over bytes; a failed read names ``where`` and the offset."""

    __slots__ = ("data", "pos", "end", "where")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None, where: str = "") -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end
        self.where = where

    def fail(self, expected: str, at: int | None = None) -> FlinkStateError:
        return FlinkStateError(
            f"{self.where or 'Flink state bytes'}: at byte {self.pos if at is None else at} "
            f"expected {expected} (the data is truncated or not what its Flink header says; "
            "re-copy the snapshot, or read it with --raw)"
        )

    def take(self, n: int) -> bytes:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise self.fail(f"{n} more byte(s), {self.end - p} left")
        self.pos = p + n
        return self.data[p : p + n]

    def u8(self) -> int:
        p = self.pos
        if p >= self.end:
            raise self.fail("1 more byte, none left")
        self.pos = p + 1
        return self.data[p]

    def _unpack(self, s: struct.Struct, what: str) -> Any:
        p = self.pos
        if p + s.size > self.end:
            raise self.fail(f"{what} ({s.size} bytes), {self.end - p} left")
        self.pos = p + s.size
        return s.unpack_from(self.data, p)[0]

    def i8(self) -> int:
        v = self.u8()
        return v - 256 if v > 127 else v

    def i16(self) -> int:
        p = self.pos
        if p + 2 > self.end:
            raise self.fail(f"a short (2 bytes), {self.end - p} left")
        self.pos = p + 2
        value: int = _I16_FROM(self.data, p)[0]
        return value

    def u16(self) -> int:
        return int(self._unpack(_U16, "an unsigned short"))

    def i32(self) -> int:
        p = self.pos
        if p + 4 > self.end:
            raise self.fail(f"an int (4 bytes), {self.end - p} left")
        self.pos = p + 4
        value: int = _I32_FROM(self.data, p)[0]
        return value

    def i64(self) -> int:
        p = self.pos
        if p + 8 > self.end:
            raise self.fail(f"a long (8 bytes), {self.end - p} left")
        self.pos = p + 8
        value: int = _I64_FROM(self.data, p)[0]
        return value

    def f32(self) -> float:
        return float(self._unpack(_F32, "a float"))

    def f64(self) -> float:
        return float(self._unpack(_F64, "a double"))

    def boolean(self) -> bool:
        b = self.u8()
        if b > 1:
            raise self.fail(f"a boolean (0 or 1), found {b}", self.pos - 1)
        return b == 1

    def utf(self) -> str:
        """``DataInput.readUTF``: u16 length + Java modified UTF-8."""
        n = self.u16()
        return decode_modified_utf8(self.take(n), self, self.pos - n)

    def varint(self) -> int:
        """The 7-bits-per-byte, low-group-first variable int of ``StringValue``."""
        b = self.u8()
        if b < 0x80:
            return b
        value = b & 0x7F
        shift = 7
        while True:
            b = self.u8()
            if b < 0x80:
                return value | (b << shift)
            value |= (b & 0x7F) << shift
            shift += 7
            if shift > 35:
                raise self.fail("a StringValue varint of at most 5 bytes", self.pos - 1)

    def string_value(self) -> str | None:
        """``StringValue.readString``: varint(len+1) (0 = null), then UTF-16 units as varints."""
        p = self.pos
        if p < self.end and self.data[p] < 0x80:  # lengths below 127: one byte
            n = self.data[p]
            self.pos = p = p + 1
        else:
            n = self.varint()
            p = self.pos
        if n == 0:
            return None
        n -= 1
        if n > self.end - p:  # every unit takes at least one byte
            raise self.fail(f"a string of {n} characters, {self.end - p} byte(s) left")
        chunk = self.data[p : p + n]
        if len(chunk) == n and chunk.isascii():  # the common case: one byte per unit
            self.pos = p + n
            return chunk.decode("ascii")
        # each unit a varint of 1-3 bytes; a local loop, not a method call per byte
        data, end = self.data, self.end
        units: list[int] = []
        append = units.append
        for _ in range(n):
            if p >= end:
                self.pos = p
                raise self.fail("the rest of a StringValue")
            b = data[p]
            p += 1
            if b < 0x80:
                append(b)
                continue
            value, shift = b & 0x7F, 7
            while True:
                if p >= end:
                    self.pos = p
                    raise self.fail("the rest of a StringValue character")
                b = data[p]
                p += 1
                if b < 0x80:
                    value |= b << shift
                    break
                value |= (b & 0x7F) << shift
                shift += 7
            if value > 0xFFFF:
                self.pos = p
                raise self.fail("UTF-16 code units (<= 0xFFFF) in a StringValue")
            append(value)
        self.pos = p
        return struct.pack(f">{n}H", *units).decode("utf-16-be", "surrogatepass")


def decode_modified_utf8(raw: bytes, buf: Buf | None = None, at: int = 0) -> str:
    """Java modified UTF-8: NUL is ``C0 80``, supplementary characters are two 3-byte surrogates."""
    if raw.isascii():
        return raw.decode("ascii")
    try:
        # CESU-8 style surrogates decode with surrogatepass, then re-pair through UTF-16
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError:
        if buf is None:
            raise FlinkStateError(f"invalid Java modified UTF-8 string {raw[:40]!r}") from None
        raise buf.fail("a Java modified UTF-8 string", at) from None


class TtlValue(NamedTuple):
    """A value inside Flink's TTL wrapper (``TtlValue``): the user value and its last-access time.

    ``timestamp`` is ``lastAccessTimestamp``: processing time in ms since the epoch of the last
    write (or read, with OnReadAndWrite). The value expires at ``timestamp + ttl``; the TTL itself
    is not stored in the snapshot.
    """

    value: Any
    timestamp: int


# --- serializers ---


@dataclass(frozen=True)
class FlinkSerializer:
    """One Flink serializer: its snapshot class and how to read a value of it."""

    java_class: str
    #: bytes per value, or None when variable (decides the RocksDB key's length suffix)
    length: int | None = None

    def read(self, buf: Buf) -> Any:
        raise NotImplementedError

    def simple_name(self) -> str:
        return self.java_class.rsplit(".", 1)[-1]

    def describe(self) -> str:
        return self.simple_name().split("$")[0]


def _read_void(buf: Buf) -> None:
    buf.u8()
    return None


def _read_bytes(buf: Buf) -> bytes:
    return buf.take(buf.i32())


def _read_char(buf: Buf) -> str:
    return chr(buf.u16())


_SCALAR_READERS: dict[str, Any] = {
    "long": Buf.i64,
    "string": Buf.string_value,
    "int": Buf.i32,
    "short": Buf.i16,
    "byte": Buf.i8,
    "double": Buf.f64,
    "float": Buf.f32,
    "boolean": Buf.boolean,
    "char": _read_char,
    "bytes": _read_bytes,
    "void": _read_void,
}


@dataclass(frozen=True)
class _Scalar(FlinkSerializer):
    kind: str = ""

    def __post_init__(self) -> None:
        # an instance attribute shadows the method: one dict lookup at build time, none per value
        self.__dict__["read"] = _SCALAR_READERS[self.kind]

    def read(self, buf: Buf) -> Any:
        return _SCALAR_READERS[self.kind](buf)


@dataclass(frozen=True)
class _PrimitiveArray(FlinkSerializer):
    element: str = ""

    def read(self, buf: Buf) -> list[Any]:
        n = buf.i32()
        if n < 0:
            raise buf.fail(f"a non-negative array length, found {n}", buf.pos - 4)
        if self.element == "boolean":
            return [buf.boolean() for _ in range(n)]
        if self.element == "char":
            return [chr(buf.u16()) for _ in range(n)]
        fmt, size = _ARRAY_FORMATS[self.element]
        raw = buf.take(n * size)
        return list(struct.unpack(f">{n}{fmt}", raw))


_ARRAY_FORMATS = {
    "long": ("q", 8),
    "int": ("i", 4),
    "short": ("h", 2),
    "double": ("d", 8),
    "float": ("f", 4),
}


@dataclass(frozen=True)
class ListSerializer(FlinkSerializer):
    element: FlinkSerializer | None = None

    def read(self, buf: Buf) -> list[Any]:
        n = buf.i32()
        if n < 0:
            raise buf.fail(f"a non-negative list size, found {n}", buf.pos - 4)
        elem = self.element
        assert elem is not None
        return [elem.read(buf) for _ in range(n)]

    def describe(self) -> str:
        return f"List<{self.element.describe() if self.element else '?'}>"


@dataclass(frozen=True)
class MapSerializer(FlinkSerializer):
    key: FlinkSerializer | None = None
    value: FlinkSerializer | None = None

    def read(self, buf: Buf) -> dict[Any, Any]:
        n = buf.i32()
        if n < 0:
            raise buf.fail(f"a non-negative map size, found {n}", buf.pos - 4)
        k, v = self.key, self.value
        assert k is not None and v is not None
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = k.read(buf)
            out[key] = None if buf.boolean() else v.read(buf)
        return out

    def describe(self) -> str:
        k = self.key.describe() if self.key else "?"
        v = self.value.describe() if self.value else "?"
        return f"Map<{k}, {v}>"


@dataclass(frozen=True)
class RowSerializer(FlinkSerializer):
    fields: tuple[FlinkSerializer, ...] = ()
    supports_row_kind: bool = True

    def read(self, buf: Buf) -> tuple[Any, ...]:
        bits = len(self.fields) + (2 if self.supports_row_kind else 0)
        mask = int.from_bytes(buf.take((bits + 7) // 8), "big")
        total = ((bits + 7) // 8) * 8
        skip = 2 if self.supports_row_kind else 0
        out = []
        for i, f in enumerate(self.fields):
            is_null = (mask >> (total - 1 - skip - i)) & 1
            out.append(None if is_null else f.read(buf))
        return tuple(out)

    def describe(self) -> str:
        return f"Row<{', '.join(f.describe() for f in self.fields)}>"


@dataclass(frozen=True)
class TtlSerializer(FlinkSerializer):
    """``TtlStateFactory$TtlSerializer``: i64 lastAccessTimestamp, then the user value."""

    timestamp: FlinkSerializer | None = None
    value: FlinkSerializer | None = None

    def read(self, buf: Buf) -> TtlValue:
        assert self.timestamp is not None and self.value is not None
        ts = self.timestamp.read(buf)
        return TtlValue(self.value.read(buf), ts)

    def describe(self) -> str:
        return f"Ttl<{self.value.describe() if self.value else '?'}>"


@dataclass(frozen=True)
class TimerSerializer(FlinkSerializer):
    """``TimerSerializer``: i64 timestamp with its sign bit flipped, key, namespace."""

    key: FlinkSerializer | None = None
    namespace: FlinkSerializer | None = None

    def read(self, buf: Buf) -> dict[str, Any]:
        assert self.key is not None and self.namespace is not None
        ts = buf.i64() ^ -0x8000000000000000
        return {"timestamp": ts, "key": self.key.read(buf), "namespace": self.namespace.read(buf)}


_SIMPLE: dict[str, tuple[str, int | None]] = {
    "StringSerializer$StringSerializerSnapshot": ("string", None),
    "LongSerializer$LongSerializerSnapshot": ("long", 8),
    "IntSerializer$IntSerializerSnapshot": ("int", 4),
    "ShortSerializer$ShortSerializerSnapshot": ("short", 2),
    "ByteSerializer$ByteSerializerSnapshot": ("byte", 1),
    "DoubleSerializer$DoubleSerializerSnapshot": ("double", 8),
    "FloatSerializer$FloatSerializerSnapshot": ("float", 4),
    "BooleanSerializer$BooleanSerializerSnapshot": ("boolean", 1),
    "CharSerializer$CharSerializerSnapshot": ("char", 2),
    "BytePrimitiveArraySerializer$BytePrimitiveArraySerializerSnapshot": ("bytes", None),
    # PyFlink keys of MapState: a byte[] wrapper with the same encoding
    "ByteArrayWrapperSerializer$ByteArrayWrapperSerializerSnapshot": ("bytes", None),
    # writes one 0 byte; getLength() is 0, which Flink counts as fixed length
    "VoidNamespaceSerializer$VoidNamespaceSerializerSnapshot": ("void", 0),
    # Flink SQL's internal strings: i32 byte length + UTF-8 (kept as the bytes)
    "StringDataSerializer$StringDataSerializerSnapshot": ("bytes", None),
}
_ARRAYS = {
    f"{t}PrimitiveArraySerializer${t}PrimitiveArraySerializerSnapshot": t.lower()
    for t in ("Long", "Int", "Short", "Double", "Float", "Boolean", "Char")
}
_COMPOSITES = (
    "ListSerializerSnapshot",
    "MapSerializerSnapshot",
    "RowSerializer$RowSerializerSnapshot",
    "TtlStateFactory$TtlSerializerSnapshot",
    "TimerSerializerSnapshot",
    "RowDataSerializer$RowDataSerializerSnapshot",
)


def known_snapshot_classes() -> list[str]:
    """Simple names (after the package) of every serializer snapshot class this module reads."""
    return sorted([*_SIMPLE, *_ARRAYS, *_COMPOSITES])


def read_serializer_snapshot(buf: Buf, *, nested: bool = False) -> FlinkSerializer:
    """One ``TypeSerializerSnapshot`` as written by ``TypeSerializerSnapshotSerializationUtil``.

    Top-level snapshots start with the proxy version (2); nested ones (inside a composite) do not.
    """
    if not nested:
        at = buf.pos
        proxy_version = buf.i32()
        if proxy_version != 2:
            raise buf.fail(f"serializer snapshot proxy version 2, found {proxy_version}", at)
    java_class = buf.utf()
    version = buf.i32()
    simple = java_class.rsplit(".", 1)[-1]
    if simple in _SIMPLE:
        kind, length = _SIMPLE[simple]
        return _Scalar(java_class, length, kind)
    if simple in _ARRAYS:
        return _PrimitiveArray(java_class, None, _ARRAYS[simple])
    if simple == "RowDataSerializer$RowDataSerializerSnapshot":
        return _read_row_data(buf, java_class)
    if simple in _COMPOSITES:
        return _read_composite(buf, java_class, simple, version)
    raise UnsupportedFlinkSerializer(
        f"serializer snapshot class {java_class} (version {version}) is not one of Flink's "
        "built-in serializers this reader decodes (String, Long, Integer, Short, Byte, Double, "
        "Float, Boolean, Character, byte[], primitive arrays, List, Map, Row, TTL, VoidNamespace); "
        "use --raw to see the bytes as base64"
    )


@dataclass(frozen=True)
class RowDataSerializer(FlinkSerializer):
    """Flink SQL's ``RowDataSerializer``: a ``BinaryRowData`` as i32 length + its bytes (the
    row's bytes are what its ``hashCode`` hashes); read as those bytes."""

    kind: str = "binary-row"
    fields: tuple[FlinkSerializer, ...] = ()

    def read(self, buf: Buf) -> bytes:
        return buf.take(buf.i32())

    def describe(self) -> str:
        return f"RowData<{', '.join(f.describe() for f in self.fields)}>"


def _read_row_data(buf: Buf, java_class: str) -> FlinkSerializer:
    # RowDataSerializerSnapshot: i32 field count, each field's LogicalType as its own Java
    # serialization stream, then the nested serializer snapshots
    from state_engine.flink.javaser import read_java_object

    n = buf.i32()
    if not 0 <= n <= 1024:
        raise buf.fail(f"a RowData field count, found {n}", buf.pos - 4)
    for _ in range(n):
        try:
            _, buf.pos = read_java_object(buf.data, buf.pos, buf.where or "serializer snapshot")
        except Exception as exc:  # the Java stream reader's own errors name the offset
            raise UnsupportedFlinkSerializer(
                f"{java_class}: a field's logical type is not readable ({exc})"
            ) from None
    at = buf.pos
    if buf.i32() != NESTED_MAGIC:
        raise buf.fail(f"nested serializer snapshots magic {NESTED_MAGIC}", at)
    buf.i32()
    count = buf.i32()
    if count != n:
        raise buf.fail(f"{n} nested serializers in {java_class}, found {count}", buf.pos - 4)
    nested = tuple(read_serializer_snapshot(buf, nested=True) for _ in range(count))
    return RowDataSerializer(java_class, None, "binary-row", nested)


def _read_composite(buf: Buf, java_class: str, simple: str, version: int) -> FlinkSerializer:
    if version < 3:
        raise UnsupportedFlinkSerializer(
            f"serializer snapshot class {java_class} version {version}: only the composite "
            "snapshot layout of Flink 1.11+ (version 3) is read; use --raw"
        )
    at = buf.pos
    if buf.i32() != COMPOSITE_MAGIC:
        raise buf.fail(f"composite serializer snapshot magic {COMPOSITE_MAGIC}", at)
    outer_version = buf.i32()
    supports_row_kind = True
    if simple.startswith("RowSerializer"):
        # outer version 3+ records whether the row carries a RowKind byte
        supports_row_kind = buf.boolean() if outer_version >= 3 else False
    at = buf.pos
    if buf.i32() != NESTED_MAGIC:
        raise buf.fail(f"nested serializer snapshots magic {NESTED_MAGIC}", at)
    buf.i32()  # nested delegate version
    n = buf.i32()
    if not 0 <= n <= 1024:
        raise buf.fail(f"a nested serializer count, found {n}", buf.pos - 4)
    nested = [read_serializer_snapshot(buf, nested=True) for _ in range(n)]
    want = {"ListSerializerSnapshot": 1, "MapSerializerSnapshot": 2}.get(simple, 2)
    if simple.startswith("RowSerializer"):
        return RowSerializer(java_class, None, tuple(nested), supports_row_kind)
    if len(nested) != want:
        raise buf.fail(f"{want} nested serializer(s) in {java_class}, found {len(nested)}")
    if simple == "ListSerializerSnapshot":
        return ListSerializer(java_class, None, nested[0])
    if simple == "MapSerializerSnapshot":
        return MapSerializer(java_class, None, nested[0], nested[1])
    if simple.startswith("TtlStateFactory"):
        return TtlSerializer(java_class, None, nested[0], nested[1])
    return TimerSerializer(java_class, None, nested[0], nested[1])
