"""RocksDB-shaped records ``(state name, key, value)`` of one source keyed handle, whatever its
format (canonical savepoint, hashmap checkpoint or native savepoint, RocksDB checkpoint or native
savepoint), and the byte extents of its ``KeyedBackendSerializationProxy`` header."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from state_engine.errors import FlinkStateError
from state_engine.flink import metadata as md
from state_engine.flink.keyed_state import (
    LIST_DELIMITER,
    PROXY_VERSION,
    ProxyHeader,
    StateInfo,
    canonical_records,
    read_proxy_header,
)
from state_engine.flink.metadata import KeyedStateHandle
from state_engine.flink.rewrite.fast import read_key_groups
from state_engine.flink.serializers import (
    Buf,
    ListSerializer,
    MapSerializer,
    read_serializer_snapshot,
)
from state_engine.flink.snappy import read_framed
from state_engine.keygroups import KeyGroupRange

__all__ = ["HeaderBytes", "header_bytes", "handle_header", "source_records"]


@dataclass(frozen=True)
class HeaderBytes:
    """A proxy header cut into the pieces a new header is built from: the key serializer
    snapshot and each state's meta info, as written."""

    key_serializer: bytes
    states: tuple[tuple[str, bytes], ...]

    def build(self, names: list[str]) -> bytes:
        """A version-6 header without compression holding the states ``names`` in that order."""
        by_name = dict(self.states)
        out = bytearray(PROXY_VERSION.to_bytes(4, "big"))
        out += b"\x00"
        out += self.key_serializer
        out += len(names).to_bytes(2, "big")
        for name in names:
            out += by_name[name]
        return bytes(out)


def header_bytes(data: bytes, where: str) -> HeaderBytes:
    """Cut the proxy header at the start of ``data`` into its pieces (same walk as
    :func:`~state_engine.flink.keyed_state.read_proxy_header`, which has already accepted it)."""
    buf = Buf(data, 0, where=where)
    buf.i32()
    buf.boolean()
    start = buf.pos
    read_serializer_snapshot(buf)
    key_ser = data[start : buf.pos]
    states = []
    for _ in range(buf.i16()):
        start = buf.pos
        name = buf.utf()
        buf.i32()
        for _ in range(buf.i32()):
            buf.utf()
            buf.utf()
        for _ in range(buf.i32()):
            buf.utf()
            read_serializer_snapshot(buf)
        states.append((name, data[start : buf.pos]))
    return HeaderBytes(key_ser, tuple(states))


def handle_header(kh: KeyedStateHandle, where: str) -> tuple[ProxyHeader, HeaderBytes]:
    """The header of a keyed handle (its file's start, or a RocksDB handle's meta data)."""
    if kh.type == md.INCREMENTAL:
        if kh.meta is None:
            raise FlinkStateError(f"{where}: RocksDB handle without its meta data")
        data = kh.meta.read_bytes()
    elif kh.type in (md.KEY_GROUPS, md.SAVEPOINT_KEY_GROUPS) and kh.delegate is not None:
        data = _head(kh)
    else:
        raise FlinkStateError(
            f"{where}: a {kh.type} keyed handle (changelog state backend) cannot be rewritten; "
            "take a canonical savepoint of the job and rewrite that"
        )
    return read_proxy_header(data, where), header_bytes(data, where)


def _head(kh: KeyedStateHandle) -> bytes:
    # the header ends before the first key group's data; offsets of empty key groups are 0
    assert kh.delegate is not None
    first = min((o for o in kh.offsets if o), default=0)
    if first and kh.delegate.type != md.INLINE and kh.delegate.location is not None:
        from state_engine.snapshot.storage import open_url

        with open_url(kh.delegate.location) as f:
            if kh.delegate.type == md.SEGMENT:
                f.seek(kh.delegate.start_pos)
            head: bytes = f.read(first)
            return head
    return kh.delegate.read_bytes()


def source_records(
    kh: KeyedStateHandle,
    header: ProxyHeader,
    max_parallelism: int,
    key_groups: KeyGroupRange,
    where: str,
) -> Iterator[tuple[str, bytes, bytes]]:
    """``(state name, key, value)`` of every record of ``kh`` in ``key_groups``, RocksDB-shaped
    (§5.3 of docs/flink-format.md) with the source's key-group prefix; timers included."""
    if kh.type == md.INCREMENTAL:
        from state_engine.flink.rocksdb_state import raw_records

        names = {s.name for s in header.states}
        for cf, key, value in raw_records(kh, max_parallelism, where):
            if cf in names and _kg(key, max_parallelism) in key_groups:
                yield cf, key, value
        return
    if kh.type == md.KEY_GROUPS:
        yield from _heap_records(kh, header, max_parallelism, key_groups, where)
        return
    assert kh.delegate is not None
    data = kh.delegate.read_bytes()
    lo, hi = key_groups.start - kh.key_groups.start, key_groups.end - kh.key_groups.start + 1
    if kh.type == md.SAVEPOINT_KEY_GROUPS:
        offsets = [0] * len(kh.offsets)
        offsets[lo:hi] = kh.offsets[lo:hi]
        # later key groups bound a compressed key group's frame: keep them as bounds only
        if header.compression:
            offsets = list(kh.offsets)
        states = header.states
        for sid, key, value in canonical_records(data, offsets, where, header.compression):
            if _kg(key, max_parallelism) in key_groups:
                yield (
                    states[sid].name if 0 <= sid < len(states) else header.state(sid, where).name,
                    key,
                    value,
                )
        return
    raise FlinkStateError(f"{where}: a keyed handle of type {kh.type} holds no records to rewrite")


def _kg(key: bytes, max_parallelism: int) -> int:
    return key[0] if max_parallelism <= 128 else (key[0] << 8) | key[1]


def _variable_int_bytes(n: int) -> bytes:
    # CompositeKeySerializationUtils.writeVariableIntBytes
    out = bytearray()
    while True:
        out.append(n & 0xFF)
        n >>= 8
        if n == 0:
            return bytes(out)


def _heap_records(
    kh: KeyedStateHandle,
    header: ProxyHeader,
    max_parallelism: int,
    key_groups: KeyGroupRange,
    where: str,
) -> Iterator[tuple[str, bytes, bytes]]:
    """The records of a heap (hashmap) handle's key groups in ``key_groups``, each key group's
    bytes read on its own (a heap handle of any size is never held whole)."""
    two = max_parallelism > 128
    for kg, data in read_key_groups(kh, key_groups):
        here = f"{where} key group {kg}"
        buf = Buf(data, 0, where=here)
        if buf.i32() != kg:
            raise buf.fail(f"key group {kg} at its offset")
        end = len(data)
        prefix = bytes([kg >> 8, kg & 0xFF]) if two else bytes([kg])
        for _ in range(len(header.states)):
            if header.compression:
                plain, buf.pos = read_framed(data, buf.pos, end, here)
                section = Buf(plain, 0, where=f"{here} (decompressed)")
                yield from _heap_section(header, section, prefix, where)
            else:
                yield from _heap_section(header, buf, prefix, where)


def _heap_section(
    header: ProxyHeader, buf: Buf, prefix: bytes, where: str
) -> Iterator[tuple[str, bytes, bytes]]:
    state: StateInfo = header.state(buf.i16(), where)
    n = buf.i32()
    data = buf.data
    if state.is_timers:
        ser = state.value_serializer
        for _ in range(n):
            start = buf.pos
            ser.read(buf)
            yield state.name, prefix + data[start : buf.pos], b""
        return
    key_ser = header.key_serializer
    ns_ser = state.namespace_serializer
    ser = state.value_serializer
    ambiguous = key_ser.length is None and ns_ser is not None and ns_ser.length is None
    for _ in range(n):
        start = buf.pos
        if ns_ser is not None:
            ns_ser.read(buf)
        ns = data[start : buf.pos]
        start = buf.pos
        key_ser.read(buf)
        key = data[start : buf.pos]
        composite = prefix + key
        if ambiguous:
            composite += _variable_int_bytes(len(key))
        composite += ns
        if ambiguous:
            composite += _variable_int_bytes(len(ns))
        if state.kind == "MAP" and isinstance(ser, MapSerializer):
            assert ser.key is not None and ser.value is not None
            for _ in range(buf.i32()):
                start = buf.pos
                ser.key.read(buf)
                user_key = data[start : buf.pos]
                start = buf.pos
                if not buf.boolean():
                    ser.value.read(buf)
                yield state.name, composite + user_key, data[start : buf.pos]
        elif state.kind == "LIST" and isinstance(ser, ListSerializer):
            assert ser.element is not None
            parts = []
            for _ in range(buf.i32()):
                start = buf.pos
                ser.element.read(buf)
                parts.append(data[start : buf.pos])
            if parts:
                yield state.name, composite, bytes([LIST_DELIMITER]).join(parts)
        else:
            start = buf.pos
            ser.read(buf)
            yield state.name, composite, data[start : buf.pos]
