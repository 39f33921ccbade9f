"""Typed, versioned serializers with compatibility checks on restore.

Every piece of state is written as bytes by a :class:`TypeSerializer`. A serializer describes itself
with a :class:`SerializerSnapshot` (name, format version, config) that snapshots' ``_metadata`` and
the catalog store next to the data, so a restore can rebuild the serializer that wrote the bytes
(:func:`serializer_from_snapshot`), ask the current serializer whether it can read them
(:meth:`TypeSerializer.resolve_compatibility`, as Flink's ``TypeSerializerSchemaCompatibility``),
and rewrite them when it cannot read them as they are (:func:`migrate`).

Serialization is deterministic (equal values give equal bytes) because keys are serialized and
then compared as bytes. Floats are the one caveat, as in Java's ``Double.equals``: they are compared
by bit pattern, so ``0.0`` and ``-0.0`` are different keys and a NaN (with one payload) is one key.
"""

from __future__ import annotations

import abc
import enum
import json
import pickle
import struct
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from state_engine.errors import (
    IncompatibleSerializer,
    SerializationError,
    SerializerRegistrationConflict,
    UnknownSerializer,
)

__all__ = [
    "ArrowRecordSerializer",
    "BoolSerializer",
    "BytesSerializer",
    "Compatibility",
    "FloatSerializer",
    "IntSerializer",
    "JsonSerializer",
    "PickleSerializer",
    "SerializerSnapshot",
    "StrSerializer",
    "TupleSerializer",
    "TypeSerializer",
    "check_compatibility",
    "deserialize_all",
    "get_serializer",
    "migrate",
    "register_serializer",
    "registered_serializers",
    "serialize_all",
    "serializer_from_snapshot",
]


class Compatibility(enum.Enum):
    """Whether the current serializer can read what a previous serializer wrote."""

    COMPATIBLE_AS_IS = "COMPATIBLE_AS_IS"
    COMPATIBLE_AFTER_MIGRATION = "COMPATIBLE_AFTER_MIGRATION"
    INCOMPATIBLE = "INCOMPATIBLE"

    def combine(self, other: Compatibility) -> Compatibility:
        """The weaker of two results (for composite serializers)."""
        return self if _RANK[self] >= _RANK[other] else other


_RANK = {
    Compatibility.COMPATIBLE_AS_IS: 0,
    Compatibility.COMPATIBLE_AFTER_MIGRATION: 1,
    Compatibility.INCOMPATIBLE: 2,
}


def _json_normal(config: Mapping[str, Any], what: str) -> dict[str, Any]:
    # A JSON round trip both validates the config and normalises it (tuples become lists), so a
    # snapshot built in memory equals the one read back from _metadata.
    try:
        normal: dict[str, Any] = json.loads(
            json.dumps(dict(config), sort_keys=True, allow_nan=False)
        )
        return normal
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what}: the serializer config must be JSON-able ({exc}); store only names, numbers, "
            "strings, lists and dicts in it"
        ) from None


@dataclass(frozen=True)
class SerializerSnapshot:
    """What a serializer writes about itself next to its data: name, format version, config."""

    name: str
    version: int
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SerializationError(
                f"serializer snapshot name must be a non-empty string, got {self.name!r}; "
                "the snapshot metadata is malformed"
            )
        if type(self.version) is not int or self.version < 1:
            raise SerializationError(
                f"serializer snapshot {self.name!r}: version must be an integer >= 1, got "
                f"{self.version!r}; the snapshot metadata is malformed"
            )
        if not isinstance(self.config, Mapping):
            raise SerializationError(
                f"serializer snapshot {self.name!r}: config must be a mapping, got "
                f"{type(self.config).__name__}; the snapshot metadata is malformed"
            )
        normal = _json_normal(self.config, f"serializer snapshot {self.name!r}")
        object.__setattr__(self, "config", types.MappingProxyType(normal))

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __reduce__(self) -> tuple[Any, ...]:
        return (SerializerSnapshot, (self.name, self.version, dict(self.config)))

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict (a deep copy)."""
        return {
            "name": self.name,
            "version": self.version,
            "config": json.loads(json.dumps(dict(self.config))),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SerializerSnapshot:
        if not isinstance(data, Mapping):
            raise SerializationError(
                f"a serializer snapshot must be a mapping with name, version and config, got "
                f"{type(data).__name__}; the snapshot metadata is malformed"
            )
        unknown = set(data) - {"name", "version", "config"}
        if "name" not in data or "version" not in data or unknown:
            raise SerializationError(
                "a serializer snapshot needs exactly the keys name, version and (optional) config, "
                f"got {sorted(map(str, data))}; the snapshot metadata is malformed"
            )
        return cls(data["name"], data["version"], data.get("config", {}))

    def to_json(self) -> str:
        """Stable JSON: sorted keys, no whitespace."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> SerializerSnapshot:
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"serializer snapshot is not valid JSON ({exc}); the snapshot metadata is corrupt"
            ) from None
        return cls.from_dict(data)


class TypeSerializer(abc.ABC):
    """Turns values of one type into bytes and back; deterministic; describes itself by snapshot.

    Subclasses set ``name`` and ``version`` (the format version: bump it when the bytes change, and
    keep the old class registered so old data can still be read and migrated). A serializer with
    parameters overrides :meth:`config` and :meth:`from_config`.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    #: Size in bytes of every serialized value, or None when it varies (a class constant, except
    #: for serializers whose width follows their parameters, e.g. a tuple's fields).
    fixed_size: int | None = None

    @abc.abstractmethod
    def serialize(self, value: Any) -> bytes: ...

    @abc.abstractmethod
    def deserialize(self, data: bytes) -> Any: ...

    def config(self) -> dict[str, Any]:
        """The parameters that :meth:`from_config` needs to rebuild this serializer."""
        return {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TypeSerializer:
        if config:
            raise SerializationError(
                f"serializer {cls.name!r} takes no config, got {dict(config)!r}; the snapshot "
                "metadata is malformed or was written by another serializer"
            )
        return cls()

    def snapshot(self) -> SerializerSnapshot:
        return SerializerSnapshot(self.name, self.version, self.config())

    def resolve_compatibility(self, previous: SerializerSnapshot) -> Compatibility:
        """Can this serializer read what ``previous`` wrote: as is, after migration, or not."""
        if previous.name != self.name:
            return Compatibility.INCOMPATIBLE
        if previous.version == self.version:
            return self._resolve_config(previous.config)
        if previous.version < self.version and previous.version in _REGISTRY.get(self.name, {}):
            return Compatibility.COMPATIBLE_AFTER_MIGRATION
        return Compatibility.INCOMPATIBLE

    def _resolve_config(self, previous: Mapping[str, Any]) -> Compatibility:
        """Same name and version: compare the configs (parameterised serializers refine this)."""
        if dict(previous) == self.snapshot().config:
            return Compatibility.COMPATIBLE_AS_IS
        return Compatibility.INCOMPATIBLE

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TypeSerializer):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    def __hash__(self) -> int:
        return hash(self.snapshot())

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled structs and bound methods do not pickle; the config rebuilds them (Spark ships
        # serializers to executors this way).
        return (_rebuild, (type(self), self.config()))

    def __repr__(self) -> str:
        config = self.config()
        return f"{type(self).__name__}({config!r})" if config else f"{type(self).__name__}()"


def _rebuild(cls: type[TypeSerializer], config: Mapping[str, Any]) -> TypeSerializer:
    return cls.from_config(config)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} ({text})"


def _cannot_encode(serializer: str, value: Any, advice: str) -> SerializationError:
    return SerializationError(
        f"{serializer} serializer cannot encode a value of type {_describe(value)}: {advice}"
    )


def _corrupt(serializer: str, data: Any, why: str) -> SerializationError:
    size = len(data) if hasattr(data, "__len__") else "?"
    return SerializationError(
        f"{serializer} serializer cannot decode {size} bytes: {why}; the data is corrupt or was "
        "written by another serializer (check the state's serializer snapshot)"
    )


# --- registry ---

_REGISTRY: dict[str, dict[int, type[TypeSerializer]]] = {}


def register_serializer(cls: type[TypeSerializer]) -> type[TypeSerializer]:
    """Register a serializer class under its (name, version); usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, TypeSerializer)):
        raise SerializerRegistrationConflict(
            f"register_serializer takes a TypeSerializer subclass, got {cls!r}; subclass "
            "state_engine.serde.TypeSerializer"
        )
    name = getattr(cls, "name", None)
    version = getattr(cls, "version", None)
    if not isinstance(name, str) or not name or type(version) is not int or version < 1:
        raise SerializerRegistrationConflict(
            f"{cls.__name__} needs class attributes name (non-empty str) and version (int >= 1), "
            f"got name={name!r} version={version!r}"
        )
    versions = _REGISTRY.setdefault(name, {})
    existing = versions.get(version)
    if existing is not None and existing is not cls:
        raise SerializerRegistrationConflict(
            f"serializer name {name!r} version {version} is already registered to "
            f"{existing.__module__}.{existing.__qualname__}; pick another name for "
            f"{cls.__qualname__} (or bump its version if it is a new format of the same type)"
        )
    versions[version] = cls
    return cls


def registered_serializers() -> dict[str, list[int]]:
    """Registered names and their known format versions."""
    return {name: sorted(versions) for name, versions in sorted(_REGISTRY.items())}


def serializer_from_snapshot(snapshot: SerializerSnapshot | Mapping[str, Any]) -> TypeSerializer:
    """Rebuild the serializer that wrote the data described by ``snapshot`` (version and config)."""
    if not isinstance(snapshot, SerializerSnapshot):
        snapshot = SerializerSnapshot.from_dict(snapshot)
    versions = _REGISTRY.get(snapshot.name)
    if versions is None:
        raise UnknownSerializer(
            f"no serializer named {snapshot.name!r} is registered (known: "
            f"{', '.join(sorted(_REGISTRY))}); import or register_serializer() the module that "
            "defines it before restoring"
        )
    cls = versions.get(snapshot.version)
    if cls is None:
        raise IncompatibleSerializer(
            f"serializer {snapshot.name!r} version {snapshot.version} is not known to this code "
            f"(known versions: {sorted(versions)}); the data was written by a newer Statekeeper or "
            "a plugin that is not installed: upgrade before restoring"
        )
    return cls.from_config(snapshot.config)


def check_compatibility(
    previous: SerializerSnapshot, current: TypeSerializer, what: str
) -> Compatibility:
    """Resolve compatibility for restoring ``what``; INCOMPATIBLE raises IncompatibleSerializer."""
    result = current.resolve_compatibility(previous)
    if result is Compatibility.INCOMPATIBLE:
        raise IncompatibleSerializer(
            f"{what} was written by serializer {previous.to_json()} which the current serializer "
            f"{current.snapshot().to_json()} cannot read; restore with the original serializer "
            "(or a compatible evolution of it) or rewrite the state offline"
        )
    return result


def migrate(data: bytes, previous: TypeSerializer, current: TypeSerializer) -> bytes:
    """Rewrite bytes written by ``previous`` in ``current``'s format."""
    return current.serialize(previous.deserialize(data))


# --- scalar built-ins ---

_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_U32 = struct.Struct(">I")


@register_serializer
class StrSerializer(TypeSerializer):
    """str as UTF-8."""

    name = "str"
    version = 1

    def serialize(self, value: Any) -> bytes:
        try:
            return str.encode(value)
        except (TypeError, UnicodeEncodeError) as exc:
            if isinstance(value, str):
                raise _cannot_encode(
                    "str", value, f"{exc}; lone surrogates are not valid UTF-8, clean the text"
                ) from None
            raise _cannot_encode(
                "str", value, "pass a str, or declare the state with a serializer for that type"
            ) from None

    def deserialize(self, data: bytes) -> str:
        try:
            return str(data, "utf-8")
        except (TypeError, UnicodeDecodeError) as exc:
            raise _corrupt("str", data, f"not UTF-8 ({exc})") from None


@register_serializer
class IntSerializer(TypeSerializer):
    """int as signed 64-bit big-endian (Java long); values outside the range are refused."""

    name = "int"
    version = 1
    fixed_size = 8

    def serialize(self, value: Any) -> bytes:
        try:
            return _I64.pack(value)
        except struct.error:
            if isinstance(value, int):
                raise _cannot_encode(
                    "int",
                    value,
                    "outside the signed 64-bit range [-2**63, 2**63 - 1]; use the json or str "
                    "serializer for larger integers",
                ) from None
            raise _cannot_encode(
                "int", value, "pass an int, or declare the state with a serializer for that type"
            ) from None

    def deserialize(self, data: bytes) -> int:
        try:
            value: int = _I64.unpack(data)[0]
            return value
        except (struct.error, TypeError):
            raise _corrupt("int", data, "expected exactly 8 bytes") from None


@register_serializer
class FloatSerializer(TypeSerializer):
    """float as an IEEE 754 double, big-endian, bit-exact (NaN payloads and -0.0 survive)."""

    name = "float"
    version = 1
    fixed_size = 8

    def serialize(self, value: Any) -> bytes:
        try:
            return _F64.pack(value)
        except (struct.error, OverflowError) as exc:
            raise _cannot_encode(
                "float",
                value,
                f"{exc}; pass a float (or an int within the double range), or declare the state "
                "with a serializer for that type",
            ) from None

    def deserialize(self, data: bytes) -> float:
        try:
            value: float = _F64.unpack(data)[0]
            return value
        except (struct.error, TypeError):
            raise _corrupt("float", data, "expected exactly 8 bytes") from None


@register_serializer
class BytesSerializer(TypeSerializer):
    """bytes as they are (bytearray and memoryview are accepted and read back as bytes)."""

    name = "bytes"
    version = 1

    def serialize(self, value: Any) -> bytes:
        if type(value) is bytes:
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        # bytes(5) would silently give five zero bytes, hence the explicit refusal.
        raise _cannot_encode(
            "bytes", value, "pass bytes, or declare the state with a serializer for that type"
        )

    def deserialize(self, data: bytes) -> bytes:
        if type(data) is bytes:
            return data
        try:
            return bytes(memoryview(data))
        except TypeError:
            raise _corrupt("bytes", data, "not a bytes-like object") from None


_TRUE = b"\x01"
_FALSE = b"\x00"


@register_serializer
class BoolSerializer(TypeSerializer):
    """bool as one byte, 0x01 or 0x00."""

    name = "bool"
    version = 1
    fixed_size = 1

    def serialize(self, value: Any) -> bytes:
        if value is True:
            return _TRUE
        if value is False:
            return _FALSE
        raise _cannot_encode(
            "bool", value, "pass True or False (no truthiness is assumed); convert with bool()"
        )

    def deserialize(self, data: bytes) -> bool:
        if data == _TRUE:
            return True
        if data == _FALSE:
            return False
        raise _corrupt("bool", data, "expected one byte 0x00 or 0x01")


_json_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)
_json_decoder = json.JSONDecoder()


_SEQUENCES = frozenset({list, tuple})
_INTS = frozenset({int})


@register_serializer
class JsonSerializer(TypeSerializer):
    """JSON values as compact, key-sorted UTF-8 JSON.

    JSON semantics apply: tuples come back as lists and non-string dict keys come back as strings.
    NaN and infinities are refused (they are not JSON); use the float serializer for them.
    """

    name = "json"
    version = 1

    def serialize(self, value: Any) -> bytes:
        # A list of ints (a count and a sum, say) is written directly: the same bytes as the
        # encoder's, in half the time (it is serialized on every write to a RocksDB state).
        if type(value) in _SEQUENCES and set(map(type, value)) <= _INTS:
            return ("[" + ",".join(map(str, value)) + "]").encode()
        try:
            return _json_encoder.encode(value).encode()
        except TypeError as exc:
            raise _cannot_encode(
                "json",
                value,
                f"{exc}; JSON holds None, bool, int, float, str, list and dict with str keys: "
                "convert the value, or use an arrow-record or pickle serializer",
            ) from None
        except UnicodeEncodeError as exc:
            raise _cannot_encode(
                "json", value, f"{exc}; lone surrogates are not valid UTF-8, clean the text"
            ) from None
        except ValueError as exc:
            raise _cannot_encode(
                "json",
                value,
                f"{exc}; JSON has no NaN or infinities (store those with the float serializer or "
                "map them to None) and no self-containing values",
            ) from None
        except RecursionError:
            raise _cannot_encode(
                "json", value, "the value is nested too deeply or contains itself"
            ) from None

    def deserialize(self, data: bytes) -> Any:
        try:
            return _json_decoder.decode(str(data, "utf-8"))
        except (TypeError, ValueError) as exc:
            raise _corrupt("json", data, f"not UTF-8 JSON ({exc})") from None


@register_serializer
class PickleSerializer(TypeSerializer):
    """Any picklable Python object, with a fixed pickle protocol.

    Only used when asked for by name ("pickle") or instance, never chosen implicitly, because pickle
    bytes are not deterministic (equal sets or dicts built in another order pickle differently, so
    pickled keys would not be found again), unpickling runs code named by the data (never restore a
    snapshot you do not trust), and the bytes name Python classes by module path (a refactoring
    makes old snapshots unreadable).
    """

    name = "pickle"
    version = 1

    def __init__(self, protocol: int = 5) -> None:
        if type(protocol) is not int or not 2 <= protocol <= pickle.HIGHEST_PROTOCOL:
            raise SerializationError(
                f"pickle protocol must be an int between 2 and {pickle.HIGHEST_PROTOCOL}, got "
                f"{protocol!r}"
            )
        self.protocol = protocol

    def config(self) -> dict[str, Any]:
        return {"protocol": self.protocol}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PickleSerializer:
        if set(config) != {"protocol"}:
            raise SerializationError(
                f"pickle serializer config must hold exactly 'protocol', got {dict(config)!r}; "
                "the snapshot metadata is malformed"
            )
        return cls(config["protocol"])

    def _resolve_config(self, previous: Mapping[str, Any]) -> Compatibility:
        # Every protocol reads every older protocol; new data is written with this one.
        if previous.get("protocol") == self.protocol:
            return Compatibility.COMPATIBLE_AS_IS
        return Compatibility.COMPATIBLE_AFTER_MIGRATION

    def serialize(self, value: Any) -> bytes:
        try:
            return pickle.dumps(value, self.protocol)
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
            raise _cannot_encode(
                "pickle", value, f"{exc}; make the object picklable or convert it first"
            ) from None

    def deserialize(self, data: bytes) -> Any:
        try:
            return pickle.loads(data)
        except Exception as exc:  # unpickling can fail with any exception the data triggers
            raise _corrupt("pickle", data, f"{type(exc).__name__}: {exc}") from None


# --- composite keys ---


@register_serializer
class TupleSerializer(TypeSerializer):
    """A fixed-length tuple whose fields have their own serializers (composite keys).

    Fixed-width fields are written as they are, the others behind a 4-byte big-endian length, so the
    encoding is prefix-free and deterministic. Lists of the right length are accepted; values come
    back as tuples.
    """

    name = "tuple"
    version = 1

    def __init__(self, *fields: Any) -> None:
        if not fields:
            raise SerializationError(
                "TupleSerializer needs at least one field serializer, e.g. "
                "TupleSerializer(str, int)"
            )
        self.fields: tuple[TypeSerializer, ...] = tuple(get_serializer(f) for f in fields)
        self._arity = len(self.fields)
        self._plan = [(f.serialize, f.fixed_size) for f in self.fields]
        self._read_plan = [(f.deserialize, f.fixed_size) for f in self.fields]
        sizes = [f.fixed_size for f in self.fields if f.fixed_size is not None]
        self.fixed_size = sum(sizes) if len(sizes) == len(self.fields) else None

    def config(self) -> dict[str, Any]:
        return {"fields": [f.snapshot().to_dict() for f in self.fields]}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TupleSerializer:
        fields = config.get("fields")
        if set(config) != {"fields"} or not isinstance(fields, list) or not fields:
            raise SerializationError(
                f"tuple serializer config must hold a non-empty list 'fields', got "
                f"{dict(config)!r}; the snapshot metadata is malformed"
            )
        return cls(*(serializer_from_snapshot(f) for f in fields))

    def _resolve_config(self, previous: Mapping[str, Any]) -> Compatibility:
        fields = previous.get("fields")
        if not isinstance(fields, list) or len(fields) != self._arity:
            return Compatibility.INCOMPATIBLE
        result = Compatibility.COMPATIBLE_AS_IS
        for mine, theirs in zip(self.fields, fields, strict=True):
            try:
                snap = SerializerSnapshot.from_dict(theirs)
            except SerializationError:
                return Compatibility.INCOMPATIBLE
            result = result.combine(mine.resolve_compatibility(snap))
        return result

    def serialize(self, value: Any) -> bytes:
        if type(value) is not tuple and not isinstance(value, (tuple, list)):
            raise _cannot_encode(
                "tuple", value, f"pass a tuple of {self._arity} values matching {self!r}"
            )
        if len(value) != self._arity:
            raise _cannot_encode(
                "tuple",
                value,
                f"it has {len(value)} fields but the serializer has {self._arity}: {self!r}",
            )
        parts: list[bytes] = []
        append = parts.append
        index = 0
        try:
            for (write, size), item in zip(self._plan, value, strict=True):
                data = write(item)
                if size is None:
                    append(_U32.pack(len(data)))
                append(data)
                index += 1
        except SerializationError as exc:
            raise SerializationError(f"tuple field {index}: {exc}") from None
        return b"".join(parts)

    def deserialize(self, data: bytes) -> tuple[Any, ...]:
        if type(data) is not bytes:
            data = bytes(data)
        out: list[Any] = []
        pos = 0
        end = len(data)
        try:
            for read, size in self._read_plan:
                if size is None:
                    (size,) = _U32.unpack_from(data, pos)
                    pos += 4
                nxt = pos + size
                if nxt > end:
                    raise _corrupt("tuple", data, f"field {len(out)} runs past the end")
                out.append(read(data[pos:nxt]))
                pos = nxt
        except struct.error:
            raise _corrupt("tuple", data, f"field {len(out)} has a truncated length") from None
        if pos != end:
            raise _corrupt("tuple", data, f"{end - pos} bytes left after the last field")
        return tuple(out)


# --- Arrow records ---

# Arrow type name (str(pa type)) -> (pyarrow type, struct code, or None for variable width).
_ARROW_TYPES: dict[str, tuple[pa.DataType, str | None]] = {
    "bool": (pa.bool_(), "?"),
    "int8": (pa.int8(), "b"),
    "int16": (pa.int16(), "h"),
    "int32": (pa.int32(), "i"),
    "int64": (pa.int64(), "q"),
    "uint8": (pa.uint8(), "B"),
    "uint16": (pa.uint16(), "H"),
    "uint32": (pa.uint32(), "I"),
    "uint64": (pa.uint64(), "Q"),
    "float": (pa.float32(), "f"),
    "double": (pa.float64(), "d"),
    "string": (pa.string(), None),
    "large_string": (pa.large_string(), None),
    "binary": (pa.binary(), None),
    "large_binary": (pa.large_binary(), None),
}
_STRING_TYPES = frozenset({"string", "large_string"})
# Old type -> new types that read every old value unchanged.
_WIDENINGS: dict[str, frozenset[str]] = {
    "int8": frozenset({"int16", "int32", "int64"}),
    "int16": frozenset({"int32", "int64"}),
    "int32": frozenset({"int64"}),
    "uint8": frozenset({"uint16", "uint32", "uint64", "int16", "int32", "int64"}),
    "uint16": frozenset({"uint32", "uint64", "int32", "int64"}),
    "uint32": frozenset({"uint64", "int64"}),
    "float": frozenset({"double"}),
    "string": frozenset({"large_string"}),
    "binary": frozenset({"large_binary"}),
}


def _as_bytes(value: Any) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError("binary field needs bytes")


def _schema_fields(schema: pa.Schema) -> list[dict[str, Any]]:
    fields = []
    for f in schema:
        type_name = str(f.type)
        if type_name not in _ARROW_TYPES:
            raise SerializationError(
                f"arrow-record serializer cannot encode field {f.name!r} of type {f.type}: "
                f"supported types are {', '.join(_ARROW_TYPES)}; store nested or temporal values "
                "as int64/string fields or use the json serializer"
            )
        fields.append({"name": f.name, "type": type_name, "nullable": bool(f.nullable)})
    return fields


class _NullInRequired(Exception):
    pass


@register_serializer
class ArrowRecordSerializer(TypeSerializer):
    """One record (a dict of field -> value) of an Arrow schema in a compact binary layout.

    Layout: a header packed with one precompiled struct (null bitmap over the nullable fields, then
    every fixed-width field in schema order, then the byte length of every variable-width field),
    followed by the variable-width payloads. A null fixed field holds zeros; a null variable field
    is empty. A nullable field missing from the dict is null; a key outside the schema is refused.
    Compatibility: identical schema -> as is; added nullable fields, widened numbers (int32 ->
    int64, float -> double, uintN -> wider ints), string -> large_string, reordering or relaxing
    nullability -> after migration; removed fields, narrowed or changed types -> incompatible.
    """

    name = "arrow-record"
    version = 1

    def __init__(self, schema: pa.Schema) -> None:
        if not isinstance(schema, pa.Schema):
            raise SerializationError(
                f"ArrowRecordSerializer takes a pyarrow.Schema, got {_describe(schema)}; build "
                "one with pa.schema([...])"
            )
        names = schema.names
        if len(set(names)) != len(names) or not names:
            raise SerializationError(
                f"arrow-record schema needs at least one field and unique field names, got "
                f"{names}; rename the duplicates"
            )
        self._fields = _schema_fields(schema)
        self.schema = pa.schema(
            [
                pa.field(f["name"], _ARROW_TYPES[f["type"]][0], nullable=f["nullable"])
                for f in self._fields
            ]
        )
        self._names = list(names)
        self._name_set = frozenset(names)
        nullable = [f["name"] for f in self._fields if f["nullable"]]
        bits = {name: 1 << i for i, name in enumerate(nullable)}
        self._required = [f["name"] for f in self._fields if not f["nullable"]]
        n_null = len(nullable)
        if n_null == 0:
            bitmap_code = ""
            self._bitmap_bytes = 0
        elif n_null <= 64:
            bitmap_code = (
                "B" if n_null <= 8 else "H" if n_null <= 16 else "I" if n_null <= 32 else "Q"
            )
            self._bitmap_bytes = 0
        else:
            self._bitmap_bytes = (n_null + 7) // 8
            bitmap_code = f"{self._bitmap_bytes}s"
        self._has_bitmap = n_null > 0
        fixed: list[tuple[str, int, Any]] = []
        var: list[tuple[str, int, Callable[[Any], bytes], bool]] = []
        codes = []
        for f in self._fields:
            code = _ARROW_TYPES[f["type"]][1]
            bit = bits.get(f["name"], 0)
            if code is not None:
                default = False if code == "?" else 0.0 if code in "fd" else 0
                fixed.append((f["name"], bit, default))
                codes.append(code)
        for f in self._fields:
            if _ARROW_TYPES[f["type"]][1] is None:
                is_str = f["type"] in _STRING_TYPES
                var.append(
                    (f["name"], bits.get(f["name"], 0), str.encode if is_str else _as_bytes, is_str)
                )
        self._fixed = fixed
        self._var = var
        self._bools = [f["name"] for f in self._fields if f["type"] == "bool"]
        self._struct = struct.Struct(">" + bitmap_code + "".join(codes) + "I" * len(var))
        self._head = self._struct.size
        self._n = len(names)

    def config(self) -> dict[str, Any]:
        return {"fields": [dict(f) for f in self._fields]}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ArrowRecordSerializer:
        fields = config.get("fields")
        try:
            if set(config) != {"fields"} or not isinstance(fields, list):
                raise KeyError("fields")
            schema = pa.schema(
                [
                    pa.field(f["name"], _ARROW_TYPES[f["type"]][0], nullable=f["nullable"])
                    for f in fields
                ]
            )
        except (KeyError, TypeError) as exc:
            raise SerializationError(
                f"arrow-record serializer config must hold 'fields' with name, type (one of "
                f"{', '.join(_ARROW_TYPES)}) and nullable, got {dict(config)!r} ({exc!r}); the "
                "snapshot metadata is malformed"
            ) from None
        return cls(schema)

    def _resolve_config(self, previous: Mapping[str, Any]) -> Compatibility:
        old_fields = previous.get("fields")
        if not isinstance(old_fields, list):
            return Compatibility.INCOMPATIBLE
        if old_fields == [dict(f) for f in self._fields]:
            return Compatibility.COMPATIBLE_AS_IS
        mine = {f["name"]: f for f in self._fields}
        seen = set()
        for old in old_fields:
            if not isinstance(old, Mapping) or old.get("name") not in mine:
                return Compatibility.INCOMPATIBLE  # a removed field loses data
            new = mine[old["name"]]
            seen.add(old["name"])
            old_type = old.get("type")
            if old_type != new["type"] and new["type"] not in _WIDENINGS.get(str(old_type), ()):
                return Compatibility.INCOMPATIBLE
            if old.get("nullable") and not new["nullable"]:
                return Compatibility.INCOMPATIBLE  # old nulls could not be written
        for name, new in mine.items():
            if name not in seen and not new["nullable"]:
                return Compatibility.INCOMPATIBLE  # an added field needs a value for old records
        return Compatibility.COMPATIBLE_AFTER_MIGRATION

    def serialize(self, value: Any) -> bytes:
        try:
            vals: list[Any] = [0] if self._has_bitmap else []
            nulls = 0
            missing = 0
            get = value.get
            for name, bit, default in self._fixed:
                v = get(name)
                if v is None:
                    if not bit:
                        raise _NullInRequired
                    nulls |= bit
                    v = default
                    if name not in value:
                        missing += 1
                vals.append(v)
            parts: list[bytes] = []
            for name, bit, encode, _ in self._var:
                v = get(name)
                if v is None:
                    if not bit:
                        raise _NullInRequired
                    nulls |= bit
                    data = b""
                    if name not in value:
                        missing += 1
                else:
                    data = encode(v)
                vals.append(len(data))
                parts.append(data)
            for name in self._bools:
                v = get(name)
                if v is not None and v is not True and v is not False:
                    raise TypeError(name)
            # Present schema fields are n - missing, so any surplus is a key outside the schema.
            if len(value) + missing != self._n:
                self._check_keys(value)
            if self._has_bitmap:
                vals[0] = nulls.to_bytes(self._bitmap_bytes, "big") if self._bitmap_bytes else nulls
            head = self._struct.pack(*vals)
        except (
            _NullInRequired,
            TypeError,
            AttributeError,
            struct.error,
            OverflowError,
            UnicodeEncodeError,
        ):
            raise self._diagnose(value) from None
        return head + b"".join(parts) if parts else head

    def _check_keys(self, record: Mapping[str, Any]) -> None:
        unknown = [k for k in record if k not in self._name_set]
        if unknown:
            raise SerializationError(
                f"arrow-record serializer: record has fields {unknown!r} that are not in the "
                f"schema {self._names}; drop them or evolve the schema (add nullable fields)"
            )

    def _diagnose(self, record: Any) -> SerializationError:
        if not isinstance(record, Mapping):
            return _cannot_encode(
                "arrow-record", record, f"pass a dict of field -> value with fields {self._names}"
            )
        for f in self._fields:
            name, type_name, nullable = f["name"], f["type"], f["nullable"]
            v = record.get(name)
            what = f"field {name!r} ({type_name}{'' if nullable else ', not null'})"
            if v is None:
                if not nullable:
                    return SerializationError(
                        f"arrow-record serializer: {what} is missing or None; give it a value or "
                        "make the field nullable"
                    )
                continue
            code = _ARROW_TYPES[type_name][1]
            try:
                if code is None:
                    (str.encode if type_name in _STRING_TYPES else _as_bytes)(v)
                elif code == "?":
                    if v is not True and v is not False:
                        raise TypeError("bool field needs True or False")
                else:
                    struct.pack(">" + code, v)
            except (TypeError, struct.error, OverflowError, UnicodeEncodeError) as exc:
                return _cannot_encode(
                    "arrow-record",
                    v,
                    f"{what} cannot hold it ({exc}); convert the value or change the field type",
                )
        try:
            self._check_keys(record)
        except SerializationError as exc:
            return exc
        return _cannot_encode("arrow-record", record, f"it does not match the schema {self._names}")

    def deserialize(self, data: bytes) -> dict[str, Any]:
        if type(data) is not bytes:
            data = bytes(data)
        try:
            vals = self._struct.unpack_from(data, 0)
        except (struct.error, TypeError):
            raise _corrupt(
                "arrow-record", data, f"shorter than the {self._head}-byte header"
            ) from None
        out: dict[str, Any] = dict.fromkeys(self._names)
        i = 0
        nulls = 0
        if self._has_bitmap:
            nulls = vals[0]
            if self._bitmap_bytes:
                nulls = int.from_bytes(nulls, "big")
            i = 1
        for name, bit, _ in self._fixed:
            if not nulls & bit:
                out[name] = vals[i]
            i += 1
        pos = self._head
        try:
            for name, bit, _, is_str in self._var:
                nxt = pos + vals[i]
                i += 1
                if not nulls & bit:
                    out[name] = data[pos:nxt].decode() if is_str else data[pos:nxt]
                pos = nxt
        except UnicodeDecodeError as exc:
            raise _corrupt("arrow-record", data, f"a string field is not UTF-8 ({exc})") from None
        if pos != len(data):
            raise _corrupt("arrow-record", data, f"the lengths in the header add up to {pos} bytes")
        return out


# --- lookup ---

_BY_TYPE: dict[type, Callable[[], TypeSerializer]] = {
    str: StrSerializer,
    int: IntSerializer,
    float: FloatSerializer,
    bytes: BytesSerializer,
    bool: BoolSerializer,
    dict: JsonSerializer,
    list: JsonSerializer,
}


def get_serializer(spec: Any) -> TypeSerializer:
    """The serializer for ``spec``.

    ``spec`` is a TypeSerializer (returned as is), a Python type (str, int, float, bytes, bool; dict
    and list -> json), a registered name ("str", "int", "float", "bytes", "bool", "json", "pickle",
    or a user serializer's name), a tuple of specs (-> TupleSerializer) or a pyarrow.Schema
    (-> ArrowRecordSerializer). Pickle is never chosen for a type: ask for it by name.
    """
    if isinstance(spec, TypeSerializer):
        return spec
    if isinstance(spec, type):
        factory = _BY_TYPE.get(spec)
        if factory is not None:
            return factory()
        raise UnknownSerializer(
            f"no serializer for Python type {spec.__qualname__}: types with a serializer are "
            f"{', '.join(t.__name__ for t in _BY_TYPE)}; otherwise pass a TypeSerializer instance "
            f"or a registered name ({', '.join(sorted(_REGISTRY))}), e.g. 'pickle' explicitly"
        )
    if isinstance(spec, str):
        versions = _REGISTRY.get(spec)
        if versions is None:
            raise UnknownSerializer(
                f"no serializer named {spec!r}: registered names are "
                f"{', '.join(sorted(_REGISTRY))}; register_serializer() a class for it"
            )
        cls = versions[max(versions)]
        try:
            return cls()
        except (TypeError, SerializationError):
            raise UnknownSerializer(
                f"serializer {spec!r} needs arguments and cannot be built from its name; pass an "
                f"instance, e.g. {cls.__name__}(...)"
            ) from None
    if isinstance(spec, tuple) and spec:
        return TupleSerializer(*spec)
    if isinstance(spec, pa.Schema):
        return ArrowRecordSerializer(spec)
    raise UnknownSerializer(
        f"cannot make a serializer from {_describe(spec)}: pass a TypeSerializer, a Python type "
        f"(str, int, float, bytes, bool, dict, list), a tuple of those, a pyarrow.Schema or a "
        f"registered name ({', '.join(sorted(_REGISTRY))})"
    )


def serialize_all(serializer: TypeSerializer, values: Iterable[Any]) -> list[bytes]:
    """Serialize many values (a convenience for snapshot writers)."""
    write = serializer.serialize
    return [write(v) for v in values]


def deserialize_all(serializer: TypeSerializer, blobs: Sequence[bytes]) -> list[Any]:
    """Deserialize many values."""
    read = serializer.deserialize
    return [read(b) for b in blobs]
