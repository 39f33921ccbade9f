"""A minimal reader of Java object serialization streams (``java.io.ObjectOutputStream``).

Flink's ``_metadata`` (version 4 and later) ends with a Java-serialized ``CheckpointProperties``:
the only place that says whether the file is a checkpoint or a savepoint and in which format. Only
what that object graph uses is supported (objects, class descriptors, strings, enums, references,
null, primitive fields, block data); anything else is a :class:`FlinkMetadataError` naming the
offset.

Objects decode to :class:`JavaObject` (class name + field dict, superclass fields merged), enums to
:class:`JavaEnum`, strings to ``str``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from state_engine.errors import FlinkMetadataError

STREAM_MAGIC = 0xACED
STREAM_VERSION = 5
_BASE_HANDLE = 0x7E0000

TC_NULL = 0x70
TC_REFERENCE = 0x71
TC_CLASSDESC = 0x72
TC_OBJECT = 0x73
TC_STRING = 0x74
TC_ARRAY = 0x75
TC_BLOCKDATA = 0x77
TC_ENDBLOCKDATA = 0x78
TC_LONGSTRING = 0x7C
TC_BLOCKDATALONG = 0x7A
TC_ENUM = 0x7E

SC_WRITE_METHOD = 0x01
SC_ENUM = 0x10

_PRIM = {"B": ">b", "C": ">H", "D": ">d", "F": ">f", "I": ">i", "J": ">q", "S": ">h", "Z": ">?"}


@dataclass
class JavaClassDesc:
    name: str
    flags: int
    fields: list[tuple[str, str]]  # (type code, field name)
    superclass: JavaClassDesc | None


@dataclass
class JavaObject:
    """A deserialized object: its class name and every serialized field (superclasses' included)."""

    class_name: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JavaEnum:
    class_name: str
    constant: str


class JavaStreamReader:
    """Reads one top-level object from ``data[start:]``; ``source`` and ``base`` name errors."""

    def __init__(self, data: bytes, start: int, source: str) -> None:
        self.data = data
        self.pos = start
        self.source = source
        self.handles: list[Any] = []

    def _fail(self, expected: str) -> FlinkMetadataError:
        return FlinkMetadataError(
            f"{self.source}: at byte offset {self.pos} expected {expected} in the Java-serialized "
            "CheckpointProperties; the file is truncated, corrupt or not written by Flink "
            "(re-take the checkpoint or savepoint)"
        )

    def _take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise self._fail(f"{what} ({n} bytes), found end of file")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _u8(self, what: str) -> int:
        return self._take(1, what)[0]

    def _unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]

    def _utf(self, what: str, long: bool = False) -> str:
        n = self._unpack(">q" if long else ">H", f"length of {what}")
        at = self.pos
        raw = self._take(n, what)
        try:
            return decode_modified_utf8(raw)
        except UnicodeDecodeError:
            self.pos = at
            raise self._fail(f"{what} as Java modified UTF-8") from None

    def read_stream(self) -> Any:
        if self._unpack(">H", "Java serialization magic 0xACED") != STREAM_MAGIC:
            self.pos -= 2
            raise self._fail("Java serialization magic 0xACED")
        if self._unpack(">H", "Java serialization version 5") != STREAM_VERSION:
            self.pos -= 2
            raise self._fail("Java serialization version 5")
        return self.read_content()

    def read_content(self) -> Any:
        start = self.pos
        tc = self._u8("a Java serialization type code")
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            h = self._unpack(">i", "a back-reference handle") - _BASE_HANDLE
            if not 0 <= h < len(self.handles):
                self.pos = start
                raise self._fail("a back-reference to an earlier object")
            return self.handles[h]
        if tc == TC_STRING:
            s = self._utf("a string")
            self.handles.append(s)
            return s
        if tc == TC_LONGSTRING:
            s = self._utf("a long string", long=True)
            self.handles.append(s)
            return s
        if tc == TC_ENUM:
            desc = self._class_desc()
            slot = len(self.handles)
            self.handles.append(None)
            constant = self.read_content()
            if not isinstance(constant, str):
                raise self._fail("an enum constant name")
            value = JavaEnum(desc.name if desc else "?", constant)
            self.handles[slot] = value
            return value
        if tc == TC_OBJECT:
            desc = self._class_desc()
            if desc is None:
                raise self._fail("a class descriptor for an object")
            obj = JavaObject(desc.name)
            self.handles.append(obj)
            chain: list[JavaClassDesc] = []
            d: JavaClassDesc | None = desc
            while d is not None:
                chain.append(d)
                d = d.superclass
            for d in reversed(chain):
                for code, name in d.fields:
                    if code in _PRIM:
                        obj.fields[name] = self._unpack(_PRIM[code], f"field {d.name}.{name}")
                    else:
                        obj.fields[name] = self.read_content()
                if d.flags & SC_WRITE_METHOD:
                    self._skip_annotation()
            return obj
        if tc == TC_CLASSDESC:
            self.pos = start
            return self._class_desc()
        self.pos = start
        raise self._fail("an object, string, enum, reference or null (type code 0x70-0x7E)")

    def _class_desc(self) -> JavaClassDesc | None:
        tc = self._u8("a class descriptor")
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            h = self._unpack(">i", "a class descriptor reference") - _BASE_HANDLE
            desc = self.handles[h] if 0 <= h < len(self.handles) else None
            if not isinstance(desc, JavaClassDesc):
                raise self._fail("a reference to an earlier class descriptor")
            return desc
        if tc != TC_CLASSDESC:
            self.pos -= 1
            raise self._fail("a class descriptor (0x72), reference (0x71) or null (0x70)")
        name = self._utf("a class name")
        self._take(8, "serialVersionUID")
        slot = len(self.handles)
        self.handles.append(None)
        flags = self._u8("class descriptor flags")
        n = self._unpack(">h", "field count")
        fields: list[tuple[str, str]] = []
        for _ in range(n):
            code = chr(self._u8("a field type code"))
            fname = self._utf("a field name")
            if code in ("L", "["):
                self.read_content()  # the field's type signature string
            elif code not in _PRIM:
                self.pos -= 1
                raise self._fail("a field type code (B C D F I J S Z L [)")
            fields.append((code, fname))
        self._skip_annotation()
        desc = JavaClassDesc(name, flags, fields, None)
        self.handles[slot] = desc
        desc.superclass = self._class_desc()
        return desc

    def _skip_annotation(self) -> None:
        while True:
            tc = self.data[self.pos] if self.pos < len(self.data) else -1
            if tc == TC_ENDBLOCKDATA:
                self.pos += 1
                return
            if tc == TC_BLOCKDATA:
                self.pos += 1
                self._take(self._u8("block data length"), "block data")
            elif tc == TC_BLOCKDATALONG:
                self.pos += 1
                self._take(self._unpack(">i", "block data length"), "block data")
            else:
                self.read_content()


def decode_modified_utf8(raw: bytes) -> str:
    """Java's modified UTF-8 (``writeUTF``): NUL as ``C0 80``, supplementary chars as surrogates."""
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        pass
    text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    # Pairs of 3-byte-encoded surrogates become one supplementary character.
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def read_java_object(data: bytes, start: int, source: str) -> tuple[Any, int]:
    """The object serialized at ``data[start:]`` and the offset just past it."""
    reader = JavaStreamReader(data, start, source)
    obj = reader.read_stream()
    return obj, reader.pos
