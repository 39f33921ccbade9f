"""PyFlink keyed state: what the Java side stores for a Python ``KeyedProcessFunction``.

The layout (``docs/flink-format.md §5.7``): Java states named ``python-state-NAME``, value and list
states both Java lists of Python-coder bytes, keys ``Row.of(key)``, and the Python types stored
nowhere. So :class:`PyFlinkTypes` says per state how to read it (``"value:LONG"``,
``"list:LONG"``, ``"map:STRING:LONG"``); without a hint a payload is read as strings, pickles or
longs, whichever consumes it exactly. Pickles are loaded by an unpickler that refuses every global
(only built-in containers and scalars come back): a snapshot must never run code in the reader.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import replace
from typing import Any

from state_engine.errors import FlinkStateError
from state_engine.flink.keyed_state import Entry

STATE_PREFIX = "python-state-"

#: fixed-width PyFlink field coders: format and size
_FIXED = {
    "LONG": (">q", 8),
    "BIG_INT": (">q", 8),
    "INT": (">i", 4),
    "SHORT": (">h", 2),
    "BYTE": (">b", 1),
    "BOOLEAN": (">?", 1),
    "DOUBLE": (">d", 8),
    "FLOAT": (">f", 4),
}
_TYPES = (*_FIXED, "STRING", "PICKLED", "BYTES", "AUTO")
_KINDS = ("value", "list", "map")


class PyFlinkTypes:
    """Per Python state name, its kind and coder type(s), from ``NAME=KIND[:TYPE[:TYPE]]``."""

    def __init__(self, specs: dict[str, str] | None = None) -> None:
        self.specs: dict[str, tuple[str, tuple[str, ...]]] = {}
        for name, spec in (specs or {}).items():
            parts = [p.strip() for p in spec.split(":")]
            kind, types = parts[0].lower(), tuple(p.upper() for p in parts[1:])
            if kind not in _KINDS or any(t not in _TYPES for t in types):
                raise FlinkStateError(
                    f"PyFlink type {name}={spec!r}: give KIND[:TYPE[:TYPE]] with KIND one of "
                    f"{', '.join(_KINDS)} and TYPE one of {', '.join(_TYPES)} "
                    "(e.g. total=value:LONG, merchants=map:STRING:LONG)"
                )
            self.specs[name] = (kind, types)

    @classmethod
    def parse(cls, items: list[str] | None) -> PyFlinkTypes:
        specs = {}
        for item in items or []:
            name, sep, spec = item.partition("=")
            if not sep:
                raise FlinkStateError(
                    f"PyFlink type {item!r}: give NAME=KIND[:TYPE], e.g. total=value:LONG"
                )
            specs[name.strip()] = spec
        return cls(specs)

    def of(self, name: str) -> tuple[str | None, tuple[str, ...]]:
        kind, types = self.specs.get(name, (None, ()))
        return kind, types


def is_pyflink_entry(e: Entry) -> bool:
    return e.state.startswith(STATE_PREFIX)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _one(data: bytes, pos: int, type_: str) -> tuple[Any, int]:
    if type_ in _FIXED:
        fmt, size = _FIXED[type_]
        if pos + size > len(data):
            raise ValueError(f"{size} bytes for a {type_}")
        return struct.unpack_from(fmt, data, pos)[0], pos + size
    if pos + 4 > len(data):
        raise ValueError("a 4-byte length")
    (n,) = struct.unpack_from(">i", data, pos)
    if n < 0 or pos + 4 + n > len(data):
        raise ValueError(f"{n} bytes")
    raw = data[pos + 4 : pos + 4 + n]
    end = pos + 4 + n
    if type_ == "STRING":
        return raw.decode("utf-8"), end
    if type_ == "PICKLED":
        if not raw.startswith(b"\x80"):
            raise ValueError("a pickle")
        return _NoGlobals(io.BytesIO(raw)).load(), end
    return raw, end


def _all(data: bytes, type_: str) -> list[Any]:
    out, pos = [], 0
    while pos < len(data):
        v, pos = _one(data, pos, type_)
        out.append(v)
    return out


def decode_values(data: bytes, types: tuple[str, ...] = (), where: str = "") -> list[Any]:
    """Every Python value in one payload (several when PyFlink batched appends)."""
    t = types[0] if types else "AUTO"
    if t != "AUTO":
        try:
            return _all(data, t)
        except (ValueError, UnicodeDecodeError, pickle.UnpicklingError, EOFError) as exc:
            raise FlinkStateError(
                f"{where}: {len(data)}-byte PyFlink payload is not {t} values ({exc}); fix the "
                "--pyflink-type hint or read with --raw"
            ) from None
    for guess in ("STRING", "PICKLED", "LONG"):
        try:
            return _all(data, guess)
        except (ValueError, UnicodeDecodeError, pickle.UnpicklingError, EOFError, Exception):
            continue
    return [data]


def pyflink_entry(e: Entry, types: PyFlinkTypes | None = None) -> Entry:
    """``e`` as PyFlink sees it: the Python state name and decoded Python values."""
    name = e.state[len(STATE_PREFIX) :]
    kind, coder = (types or PyFlinkTypes()).of(name)
    where = f"PyFlink state {name!r}"
    if e.user_key is not None or kind == "map":
        uk = e.user_key
        if isinstance(uk, bytes | bytearray):
            keys = decode_values(bytes(uk), coder[:1], where + " map key")
            uk = keys[0] if len(keys) == 1 else tuple(keys)
        value = e.value
        if isinstance(value, bytes | bytearray):
            vals = decode_values(bytes(value), coder[1:2], where + " map value")
            value = vals[0] if len(vals) == 1 else vals
        return replace(e, state=name, user_key=uk, value=value)
    if isinstance(e.value, list):
        values: list[Any] = []
        for element in e.value:
            if isinstance(element, bytes | bytearray):
                values.extend(decode_values(bytes(element), coder[:1], where))
            else:
                values.append(element)
        if kind == "value":
            if len(values) != 1:
                raise FlinkStateError(
                    f"{where} of key {e.key!r}: a value state holds one value, found "
                    f"{len(values)}; is it a list state? (--pyflink-type {name}=list:...)"
                )
            return replace(e, state=name, value=values[0])
        return replace(e, state=name, value=values)
    return replace(e, state=name)
