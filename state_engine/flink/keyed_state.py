"""Keyed state inside Flink snapshots: backend header, canonical savepoint streams, heap files.

:func:`read_proxy_header` reads the ``KeyedBackendSerializationProxy`` (``docs/flink-format.md
§5.1``), :func:`canonical_entries` the canonical stream (§5.2), :func:`heap_entries` hashmap
checkpoints and native savepoints (§5.4); :class:`StateDecoder` turns RocksDB-shaped records
(§5.3; also what :mod:`rocksdb_state` reads) into :class:`Entry` objects, and :func:`entry_rows`
into ``statectl state show`` rows (columns and their meaning: §7.1). Snapshots taken with
compression are decompressed on the way (:mod:`snappy`).
"""

from __future__ import annotations

import base64
import bisect
import functools
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from state_engine.errors import FlinkStateError, UnsupportedFlinkSerializer
from state_engine.flink.serializers import (
    _I32_FROM,
    _I64_FROM,
    Buf,
    FlinkSerializer,
    ListSerializer,
    MapSerializer,
    TtlValue,
    read_serializer_snapshot,
)
from state_engine.flink.snappy import read_framed
from state_engine.snapshot_enums import SnapshotStatus

if TYPE_CHECKING:
    from state_engine.flink.metadata import FlinkSnapshotMetadata, OperatorState

PROXY_VERSION = 6
END_OF_KEY_GROUP_MARK = 0xFFFF
META_DATA_FOLLOWS_FLAG = 0x80
LIST_DELIMITER = 0x2C  # ',' of RocksDB's StringAppendTESTOperator / ListDelimitedSerializer

#: ``StateMetaInfoSnapshot.BackendStateType`` as written: the enum *ordinal*
BACKEND_STATE_TYPES = ("KEY_VALUE", "OPERATOR", "BROADCAST", "PRIORITY_QUEUE", "KEY_VALUE_V2")

_SURROGATE = re.compile("[\ud800-\udfff]")

COLUMNS = ("operator", "key_group", "state", "key", "namespace", "user_key", "value", "expires_at")


@dataclass
class StateInfo:
    """One registered state of the keyed backend header."""

    state_id: int
    name: str
    backend_type: str
    kind: str  # VALUE, LIST, MAP, REDUCING, AGGREGATING; "" for timers
    options: dict[str, str]
    serializers: dict[str, FlinkSerializer]

    @property
    def is_timers(self) -> bool:
        return self.backend_type == "PRIORITY_QUEUE"

    @property
    def value_serializer(self) -> FlinkSerializer:
        return self.serializers["VALUE_SERIALIZER"]

    @property
    def namespace_serializer(self) -> FlinkSerializer | None:
        return self.serializers.get("NAMESPACE_SERIALIZER")


@dataclass
class ProxyHeader:
    version: int
    compression: bool
    key_serializer: FlinkSerializer
    states: list[StateInfo]
    end: int  # byte offset just after the header

    def state(self, state_id: int, where: str) -> StateInfo:
        if not 0 <= state_id < len(self.states):
            raise FlinkStateError(
                f"{where}: state id {state_id} is not in the header's {len(self.states)} states "
                "(the data does not belong to this header; re-copy the snapshot)"
            )
        return self.states[state_id]

    def by_name(self) -> dict[str, StateInfo]:
        return {s.name: s for s in self.states}


def read_proxy_header(data: bytes, where: str, pos: int = 0) -> ProxyHeader:
    """``KeyedBackendSerializationProxy`` at ``pos`` of ``data`` (a keyed file or a meta handle)."""
    buf = Buf(data, pos, where=where)
    version = buf.i32()
    if version != PROXY_VERSION:
        raise FlinkStateError(
            f"{where}: keyed backend header version {version} at byte {pos}; Flink 2.x writes "
            f"version {PROXY_VERSION} and this reader knows only that"
        )
    compression = buf.boolean()
    try:
        key_ser = read_serializer_snapshot(buf)
    except UnsupportedFlinkSerializer as exc:
        raise UnsupportedFlinkSerializer(f"{where}: key serializer: {exc}") from None
    n = buf.i16()
    states: list[StateInfo] = []
    for state_id in range(n):
        name = buf.utf()
        type_ordinal = buf.i32()
        if not 0 <= type_ordinal < len(BACKEND_STATE_TYPES):
            raise buf.fail(f"a backend state type ordinal 0..4 for state {name!r}", buf.pos - 4)
        options = {}
        for _ in range(buf.i32()):
            k = buf.utf()
            options[k] = buf.utf()
        serializers: dict[str, FlinkSerializer] = {}
        for _ in range(buf.i32()):
            role = buf.utf()
            try:
                serializers[role] = read_serializer_snapshot(buf)
            except UnsupportedFlinkSerializer as exc:
                raise UnsupportedFlinkSerializer(f"{where}: state {name!r} {role}: {exc}") from None
        states.append(
            StateInfo(
                state_id,
                name,
                BACKEND_STATE_TYPES[type_ordinal],
                options.get("KEYED_STATE_TYPE", ""),
                options,
                serializers,
            )
        )
    return ProxyHeader(version, compression, key_ser, states, buf.pos)


# --- entries ---


@dataclass(slots=True)
class Entry:
    """One decoded piece of keyed state (a MAP entry, a whole list, a value)."""

    key_group: int
    state: str
    key: Any
    namespace: Any
    user_key: Any = None
    value: Any = None
    expires_at: int | None = None


def _unwrap_ttl(value: Any) -> tuple[Any, int | None]:
    if isinstance(value, TtlValue):
        return value.value, value.timestamp
    return value, None


def _unwrap_list(values: list[Any]) -> tuple[list[Any], int | None]:
    out, latest = [], None
    for v in values:
        user, ts = _unwrap_ttl(v)
        out.append(user)
        if ts is not None and (latest is None or ts > latest):
            latest = ts
    return out, latest


class StateDecoder:
    """Decodes RocksDB-shaped records (canonical stream, RocksDB SSTs) of one keyed backend."""

    def __init__(self, header: ProxyHeader, max_parallelism: int, where: str) -> None:
        self.header = header
        self.where = where
        self.prefix = 1 if max_parallelism <= 128 else 2
        self.key_ser = header.key_serializer
        self._string_void = getattr(self.key_ser, "kind", "") == "string"
        # per state: what decode() needs, computed once (decode runs once per record)
        self._plans: dict[str, tuple[Any, ...]] = {}

    def _plan(self, state: StateInfo) -> tuple[Any, ...]:
        plan = self._plans.get(state.name)
        if plan is None:
            ns_ser = state.namespace_serializer
            ambiguous = self.key_ser.length is None and ns_ser is not None and ns_ser.length is None
            ser = state.value_serializer
            if state.kind == "MAP" and isinstance(ser, MapSerializer):
                mode = 1
            elif state.kind == "LIST" and isinstance(ser, ListSerializer):
                mode = 2
            else:
                mode = 0
            plan = (
                f"{self.where} state {state.name!r} key",
                f"{self.where} state {state.name!r} value",
                ns_ser,
                ambiguous,
                mode,
                ser,
            )
            self._plans[state.name] = plan
        return plan

    def _fast_key(self, key: bytes) -> tuple[Any, int] | None:
        """An ASCII String key of < 127 chars followed by VoidNamespace: (key, end), no Buf."""
        p = self.prefix
        n = key[p] - 1 if len(key) > p else -1
        if n < 0 or n >= 0x7F or len(key) < p + 2 + n or key[p + 1 + n] != 0:
            return None
        text = key[p + 1 : p + 1 + n]
        if not text.isascii():
            return None
        return text.decode("ascii"), p + 2 + n

    def key_parts(self, state: StateInfo, key: bytes) -> tuple[int, Any, Any, bytes, Buf]:
        """Key group, key, namespace, the key's own bytes, and a cursor at the user key."""
        where_key, _, ns_ser, ambiguous, _, _ = self._plan(state)
        p = self.prefix
        if len(key) <= p:
            raise FlinkStateError(
                f"{where_key}: a {len(key)}-byte key cannot hold the {p}-byte key-group prefix "
                "and a key (the data is corrupt; re-copy the snapshot)"
            )
        kg = key[0] if p == 1 else (key[0] << 8) | key[1]
        buf = Buf(key, p, where=where_key)
        k = self.key_ser.read(buf)
        key_end = buf.pos
        if ambiguous:
            _skip_variable_int_bytes(buf, key_end - p)
        ns_start = buf.pos
        ns = ns_ser.read(buf) if ns_ser is not None else None
        if ambiguous:
            _skip_variable_int_bytes(buf, buf.pos - ns_start)
        return kg, k, ns, key[p:key_end], buf

    def decode(self, state: StateInfo, key: bytes, value: bytes) -> Entry:
        _, where, ns_ser, _, mode, ser = self._plan(state)
        fast = (
            self._fast_key(key)
            if self._string_void and ns_ser is not None and ns_ser.length == 0
            else None
        )
        if fast is not None:
            k, end = fast
            kg = key[0] if self.prefix == 1 else (key[0] << 8) | key[1]
            if (
                mode == 0
                and end == len(key)
                and len(value) == 8
                and getattr(ser, "kind", "") == "long"  # the common Long value
            ):
                return Entry(kg, state.name, k, None, None, _I64_FROM(value, 0)[0], None)
            ns = None
            buf = Buf(key, end, where=where)
        else:
            kg, k, ns, _key_bytes, buf = self.key_parts(state, key)
        if mode == 1:
            user_key = ser.key.read(buf)
            if len(value) == 9 and value[0] == 0 and getattr(ser.value, "kind", "") == "long":
                entry = Entry(kg, state.name, k, ns, user_key, _I64_FROM(value, 1)[0], None)
                if buf.pos != buf.end:
                    _expect_end(buf)
                return entry
            vb = Buf(value, 0, where=where)
            if vb.boolean():
                v, ts = None, None
            else:
                v = ser.value.read(vb)
                v, ts = (v.value, v.timestamp) if type(v) is TtlValue else (v, None)
            if vb.pos != vb.end:
                _expect_end(vb)
            entry = Entry(kg, state.name, k, ns, user_key, v, ts)
        elif mode == 2:
            longs = _long_list(value) if getattr(ser.element, "kind", "") == "long" else None
            if longs is not None:
                values, ts = longs, None
            else:
                values, ts = _unwrap_list(read_delimited_list(value, ser.element, where))
            entry = Entry(kg, state.name, k, ns, None, values, ts)
        else:
            vb = Buf(value, 0, where=where)
            v = ser.read(vb)
            v, ts = (v.value, v.timestamp) if type(v) is TtlValue else (v, None)
            if vb.pos != vb.end:
                _expect_end(vb)
            entry = Entry(kg, state.name, k, ns, None, v, ts)
        if buf.pos != buf.end:
            _expect_end(buf)
        return entry


@functools.lru_cache(maxsize=256)
def _long_list_format(count: int) -> struct.Struct:
    # "q" per element, "x" skips each ',' delimiter between them
    return struct.Struct(">" + "qx" * (count - 1) + "q")


def _long_list(value: bytes) -> list[int] | None:
    """A RocksDB list of Longs (``elem , elem ...``) in one unpack; None if not that shape."""
    n = len(value)
    if n == 0 or (n + 1) % 9:
        return None
    count = (n + 1) // 9
    if value[8::9] != b"," * (count - 1):
        return None
    return list(_long_list_format(count).unpack(value))


def _expect_end(buf: Buf) -> None:
    if buf.pos != buf.end:
        raise buf.fail(f"the end of the record ({buf.end - buf.pos} byte(s) left over)")


def _skip_variable_int_bytes(buf: Buf, length: int) -> None:
    # CompositeKeySerializationUtils.writeVariableIntBytes: the length's bytes low->high, at
    # least one, until the rest is 0; the reader knows the length from what it just read
    while True:
        buf.u8()
        length >>= 8
        if length == 0:
            return


def read_delimited_list(value: bytes, element: FlinkSerializer, where: str) -> list[Any]:
    """RocksDB list value: elements joined by ``,`` (``ListDelimitedSerializer``), no count."""
    buf = Buf(value, where=where)
    out = []
    while buf.pos < buf.end:
        out.append(element.read(buf))
        if buf.pos < buf.end:
            d = buf.u8()
            if d != LIST_DELIMITER:
                raise buf.fail("the list delimiter ',' (0x2C)", buf.pos - 1)
    return out


# --- canonical savepoint stream ---


def canonical_records(
    data: bytes, offsets: list[int], where: str, compressed: bool = False
) -> Iterator[tuple[int, bytes, bytes]]:
    """``(state id, key, value)`` of every non-empty key group (offset 0 = no data).

    ``compressed``: each key group is its own snappy framed stream, up to the next key group.
    """
    starts = sorted(o for o in offsets if o)
    for off in offsets:
        if off == 0:
            continue
        if off >= len(data):
            raise FlinkStateError(
                f"{where}: key-group offset {off} is past the end of the {len(data)}-byte file "
                "(the file is truncated; re-copy the snapshot)"
            )
        if compressed:
            i = bisect.bisect_right(starts, off)
            end = starts[i] if i < len(starts) else len(data)
            plain, _ = read_framed(data, off, end, where)
            buf = Buf(plain, 0, where=f"{where} key group at byte {off} (decompressed)")
        else:
            buf = Buf(data, off, where=where)
        state_id = buf.i16()
        raw, pos, end = buf.data, buf.pos, buf.end
        while True:
            # inlined Buf.i32/take: this loop runs once per record
            if pos + 4 > end:
                buf.pos = pos
                buf.i32()  # raises the truncation error with the offset
            (n,) = _I32_FROM(raw, pos)
            if n < 0 or pos + 4 + n + 4 > end:
                buf.pos = pos
                buf.take(buf.i32())
                buf.i32()
            key = raw[pos + 4 : pos + 4 + n]
            pos += 4 + n
            (n,) = _I32_FROM(raw, pos)
            if n < 0 or pos + 4 + n > end:
                buf.pos = pos
                buf.take(buf.i32())
            value = raw[pos + 4 : pos + 4 + n]
            pos += 4 + n
            buf.pos = pos
            if key and key[0] & META_DATA_FOLLOWS_FLAG:
                key = bytes([key[0] & ~META_DATA_FOLLOWS_FLAG & 0xFF]) + key[1:]
                yield state_id, key, value
                mark = buf.u16()
                pos = buf.pos
                if mark == END_OF_KEY_GROUP_MARK:
                    break
                state_id = mark
            else:
                yield state_id, key, value


def canonical_entries(
    data: bytes, offsets: list[int], max_parallelism: int, where: str
) -> Iterator[Entry]:
    header = read_proxy_header(data, where)
    decoder = StateDecoder(header, max_parallelism, where)
    states = header.states
    for state_id, key, value in canonical_records(data, offsets, where, header.compression):
        state = states[state_id] if 0 <= state_id < len(states) else header.state(state_id, where)
        if state.is_timers:
            continue
        yield decoder.decode(state, key, value)


# --- heap (hashmap) snapshots ---


def heap_entries(
    data: bytes, offsets: list[int], start_key_group: int, where: str
) -> Iterator[Entry]:
    """Every entry of a hashmap checkpoint / native savepoint file (one per subtask).

    With compression each state section of a key group is its own snappy framed stream (the key
    group id before them is not compressed).
    """
    header = read_proxy_header(data, where)
    for i, off in enumerate(offsets):
        buf = Buf(data, off, where=where)
        kg = buf.i32()
        if kg != start_key_group + i:
            raise buf.fail(f"key group {start_key_group + i} at its offset, found {kg}", off)
        end = offsets[i + 1] if i + 1 < len(offsets) else len(data)
        for _ in range(len(header.states)):
            if header.compression:
                plain, buf.pos = read_framed(data, buf.pos, end, where)
                section = Buf(plain, 0, where=f"{where} key group {kg} (decompressed)")
                yield from _heap_section(header, section, kg, where)
            else:
                yield from _heap_section(header, buf, kg, where)


def _heap_section(header: ProxyHeader, buf: Buf, kg: int, where: str) -> Iterator[Entry]:
    key_ser = header.key_serializer
    state = header.state(buf.i16(), where)
    n = buf.i32()
    if state.is_timers:
        ser = state.value_serializer
        for _ in range(n):
            ser.read(buf)
        return
    ns_ser = state.namespace_serializer
    ser = state.value_serializer
    for _ in range(n):
        ns = ns_ser.read(buf) if ns_ser is not None else None
        key = key_ser.read(buf)
        value = ser.read(buf)
        if state.kind == "MAP" and isinstance(value, dict):
            for uk, uv in value.items():
                user, ts = _unwrap_ttl(uv)
                yield Entry(kg, state.name, key, ns, uk, user, ts)
        elif state.kind == "LIST" and isinstance(value, list):
            values, ts = _unwrap_list(value)
            yield Entry(kg, state.name, key, ns, None, values, ts)
        else:
            user, ts = _unwrap_ttl(value)
            yield Entry(kg, state.name, key, ns, None, user, ts)


# --- rows ---


def as_text(value: Any) -> str | None:
    """A key or user key as text: strings as is, integers as digits, one-field rows unwrapped."""
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    return as_json(value)


def as_json(value: Any) -> str:
    """The JSON text of a decoded value (bytes as base64 strings)."""
    text = json.dumps(value, default=_json_default, ensure_ascii=False, separators=(", ", ": "))
    return _printable(text)


def _printable(text: str) -> str:
    # Java strings may hold lone UTF-16 surrogates, which no UTF-8 output can print: shown as
    # U+FFFD (display only; a conversion refuses them with the str serializer's error)
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, TtlValue):
        return value.value
    return repr(value)


def entry_row(operator: str, e: Entry) -> dict[str, Any]:
    value = e.value
    if isinstance(value, dict):
        value = {as_text(k): v for k, v in value.items()}
    return {
        "operator": operator,
        "key_group": e.key_group,
        "state": e.state,
        "key": as_text(e.key),
        "namespace": as_text(e.namespace),
        "user_key": as_text(e.user_key),
        "value": as_json(value),
        "expires_at": e.expires_at,
    }


# --- whole snapshots ---


def operator_label(op: OperatorState) -> str:
    """How rows name an operator: its uid when the job set one, else the OperatorID hex."""
    return op.uid or op.operator_id


def entry_rows(operator: str, e: Entry) -> list[dict[str, Any]]:
    return [entry_row(operator, e)]


def catalog_flink_metadata(catalog: Any, snapshot_id: int) -> FlinkSnapshotMetadata | None:
    """The ``_metadata`` of catalog snapshot ``snapshot_id`` if its job came from Flink, else None.

    A Flink snapshot must be COMPLETED (its directory still there); the catalog is only read.
    """
    from state_engine.errors import InvalidJobParams
    from state_engine.flink.metadata import read_metadata

    snap = catalog.get_snapshot(snapshot_id)
    job = catalog.get_job(snap.job_id)
    if getattr(job, "origin", "statekeeper") != "flink":
        return None
    if snap.status is not SnapshotStatus.COMPLETED:
        raise InvalidJobParams(
            f"snapshot {snapshot_id} of Flink job {job.name!r} is {snap.status}, not COMPLETED: "
            "only completed snapshots can be read (statectl snapshots NAME lists them)"
        )
    if not _is_flink_metadata(snap.location):
        return None  # a Statekeeper snapshot of the job, e.g. a converted savepoint
    job_dir = job.location if job.location and snap.location.startswith(job.location) else None
    return read_metadata(snap.location, job_dir=job_dir)


def _is_flink_metadata(location: str) -> bool:
    from state_engine.flink.metadata import HEADER_MAGIC_NUMBER, metadata_file
    from state_engine.snapshot.storage import open_url

    try:
        with open_url(metadata_file(location)) as f:
            head = f.read(4)
    except (FileNotFoundError, IsADirectoryError):
        return True  # let the Flink reader name what is missing
    return len(head) < 4 or int.from_bytes(head, "big") == HEADER_MAGIC_NUMBER
