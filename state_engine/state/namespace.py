"""Namespaces (windows use them) and their default serializer."""

from __future__ import annotations

import struct
from typing import Any

from state_engine.errors import SerializationError
from state_engine.serde import TypeSerializer, register_serializer


class VoidNamespace:
    """The namespace of state that is not scoped to a window; serialized as no bytes."""

    _instance: VoidNamespace | None = None

    def __new__(cls) -> VoidNamespace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"

    def __reduce__(self) -> str:
        return "VOID_NAMESPACE"


VOID_NAMESPACE = VoidNamespace()

_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_TAG_INT, _TAG_STR, _TAG_BYTES, _TAG_TUPLE, _TAG_FALSE, _TAG_TRUE = 1, 2, 3, 4, 5, 6


@register_serializer
class NamespaceSerializer(TypeSerializer):
    """The default namespace serializer: the void namespace, int, str, bytes, bool and tuples.

    VOID is ``b""``; other values are a tag byte then the payload (int: 8-byte big-endian; tuple
    fields each behind a 4-byte length), so different types never collide.
    """

    name = "namespace"
    version = 1

    def serialize(self, value: Any) -> bytes:
        if value is VOID_NAMESPACE:
            return b""
        t = type(value)
        try:
            if t is int:
                return b"\x01" + _I64.pack(value)
            if t is str:
                text: str = value
                return b"\x02" + text.encode("utf-8")
            if t is bytes:
                raw: bytes = value
                return b"\x03" + raw
            if t is bool:
                return b"\x06" if value else b"\x05"
            if t is tuple:
                parts = [b"\x04"]
                for field in value:
                    enc = self.serialize(field)
                    parts.append(_U32.pack(len(enc)))
                    parts.append(enc)
                return b"".join(parts)
        except (struct.error, UnicodeEncodeError) as exc:
            raise SerializationError(
                f"namespace serializer cannot encode {value!r:.60}: {exc}; use a 64-bit int, a "
                "str, bytes or a tuple of those as namespace, or pass a namespace_serializer"
            ) from None
        raise SerializationError(
            f"namespace serializer cannot encode a {t.__name__} ({value!r:.60}): namespaces are "
            "VOID_NAMESPACE, int, str, bytes, bool or tuples of those; pass a namespace_serializer "
            "to get_state for other types"
        )

    def deserialize(self, data: bytes) -> Any:
        if not data:
            return VOID_NAMESPACE
        tag = data[0]
        try:
            if tag == _TAG_INT and len(data) == 9:
                return _I64.unpack_from(data, 1)[0]
            if tag == _TAG_STR:
                return data[1:].decode("utf-8")
            if tag == _TAG_BYTES:
                return bytes(data[1:])
            if tag == _TAG_FALSE and len(data) == 1:
                return False
            if tag == _TAG_TRUE and len(data) == 1:
                return True
            if tag == _TAG_TUPLE:
                out = []
                pos = 1
                while pos < len(data):
                    (n,) = _U32.unpack_from(data, pos)
                    pos += 4
                    if pos + n > len(data):
                        break
                    out.append(self.deserialize(bytes(data[pos : pos + n])))
                    pos += n
                if pos == len(data):
                    return tuple(out)
        except (struct.error, UnicodeDecodeError):
            pass
        raise SerializationError(
            f"namespace serializer cannot decode {len(data)} bytes: not written by the default "
            "namespace serializer; restore with the namespace serializer the state was written with"
        )
