"""The rewrite's data path: records read from a source handle at their new key groups, output
parts written as canonical key-group files, ``_metadata`` written last (no catalog, no Spark)."""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from state_engine.errors import FlinkStateError
from state_engine.flink import metadata as md
from state_engine.flink.keyed_state import (
    END_OF_KEY_GROUP_MARK,
    LIST_DELIMITER,
    META_DATA_FOLLOWS_FLAG,
    ProxyHeader,
    operator_label,
)
from state_engine.flink.metadata import FlinkSnapshotMetadata
from state_engine.flink.metadata.parser import HEADER_MAGIC_NUMBER
from state_engine.flink.rewrite import fast
from state_engine.flink.rewrite.keys import key_hasher, new_key_group
from state_engine.flink.rewrite.options import RewriteOptions, RewriteRefused
from state_engine.flink.rewrite.plan import OperatorPlan, ReadTask, RewritePlan, plan_rewrite
from state_engine.flink.rewrite.source import handle_header, source_records
from state_engine.flink.serializers import Buf, ListSerializer, TtlSerializer
from state_engine.flink.snappy import read_framed
from state_engine.keygroups import compute_operator_index_for_key_group
from state_engine.snapshot.storage import FileStore

__all__ = ["SCHEMA", "PartWritten", "read_records", "rewrite_local", "write_metadata", "write_part"]

#: The columns of :func:`read_records`: ``part`` (index into ``plan.outputs``), ``key_group``
#: (new), ``state`` (output state id), ``key`` (the RocksDB-shaped key without its key-group
#: prefix), ``value``.
SCHEMA = pa.schema(
    [
        ("part", pa.int32()),
        ("key_group", pa.int32()),
        ("state", pa.int16()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


@dataclass(frozen=True)
class PartWritten:
    """One output part as written: its file (in the output directory), size and the offset of
    every key group of its range (0: no data)."""

    part: int
    file_name: str
    size: int
    offsets: tuple[int, ...]


_BATCH_ROWS = 1 << 15
#: records of a key group turned into columns (and output bytes) at a time
_SLICE_ROWS = 1 << 13
_I64_MAX = (1 << 63) - 1


def _expired(ts: int, ttl: int, at: int) -> bool:
    # TtlUtils.expired: the expiration time (overflow capped at Long.MAX_VALUE) <= now
    return min(ts + ttl, _I64_MAX) <= at


def _handle(plan: RewritePlan, task: ReadTask) -> md.KeyedStateHandle:
    op = plan.meta.operators[task.op]
    for st in op.subtasks:
        if st.index == task.subtask:
            kh = st.keyed_handles[task.handle]
            return kh
    raise FlinkStateError(f"operator {operator_label(op)} has no subtask {task.subtask}")


def _list_survivors(value: bytes, element: TtlSerializer, ttl: int, at: int, where: str) -> bytes:
    """The elements of a RocksDB list value (``elem , elem ...``) not expired at ``at``."""
    buf = Buf(value, where=where)
    kept: list[bytes] = []
    while buf.pos < buf.end:
        start = buf.pos
        ts = buf.i64()
        assert element.value is not None
        element.value.read(buf)
        if not _expired(ts, ttl, at):
            kept.append(value[start : buf.pos])
        if buf.pos < buf.end and buf.u8() != LIST_DELIMITER:
            raise buf.fail("the list delimiter ',' (0x2C)", buf.pos - 1)
    return bytes([LIST_DELIMITER]).join(kept)


def read_records(plan: RewritePlan, task: ReadTask, fs: Any = None) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` as :data:`SCHEMA` batches: keys re-assigned to their new key
    groups, TTL-expired entries and list elements and dropped states left out. ``fs`` is unused
    (handles carry their own locations); kept for the job's call."""
    src = plan.meta.operators[task.op]
    op: OperatorPlan = plan.operators[task.op]
    kh = _handle(plan, task)
    where = f"{plan.meta.metadata_path} operator {operator_label(src)} subtask {task.subtask}"
    header, _ = handle_header(kh, where)
    old_max, new_max = src.max_parallelism, op.max_parallelism
    old_p = 1 if old_max <= 128 else 2
    rehash = old_max != new_max
    hasher = key_hasher(header.key_serializer) if rehash else None
    if rehash and hasher is None:
        raise RewriteRefused(
            f"{where}: keys of serializer {header.key_serializer.java_class} cannot be re-hashed"
        )
    first_part = next(i for i, o in enumerate(plan.outputs) if o.op == task.op)
    parallelism = op.parallelism
    # key group -> part index (the canonical ranges at the new parallelism)
    part_of = [
        first_part + compute_operator_index_for_key_group(new_max, parallelism, kg)
        for kg in range(new_max)
    ]
    list_elements = {
        sid: header.by_name()[name].value_serializer
        for name, sid in op.state_ids.items()
        if op.ttl_kinds.get(sid) == "list"
    }
    if _vectorised(kh, header):
        yield from _fast_records(plan, task, kh, header, part_of, list_elements, where)
        return
    at = plan.at
    parts: list[int] = []
    groups: list[int] = []
    states: list[int] = []
    keys: list[bytes] = []
    values: list[bytes] = []
    for name, key, value in source_records(kh, header, old_max, task.key_groups, where):
        sid = op.state_ids.get(name)
        if sid is None:
            continue
        ttl = op.ttl.get(sid)
        if ttl is not None:
            kind = op.ttl_kinds[sid]
            if kind == "value":
                if _expired(struct.unpack_from(">q", value, 0)[0], ttl, at):
                    continue
            elif kind == "map":
                if value[0] == 0 and _expired(struct.unpack_from(">q", value, 1)[0], ttl, at):
                    continue
            else:
                ser = list_elements[sid]
                assert isinstance(ser, ListSerializer) and isinstance(ser.element, TtlSerializer)
                value = _list_survivors(value, ser.element, ttl, at, where)
                if not value:
                    continue
        if hasher is not None:
            buf = Buf(key, old_p + (8 if sid in op.timer_ids else 0), where=where)
            kg = new_key_group(hasher(buf), new_max)
        else:
            kg = key[0] if old_p == 1 else (key[0] << 8) | key[1]
        parts.append(part_of[kg])
        groups.append(kg)
        states.append(sid)
        keys.append(key[old_p:])
        values.append(value)
        if len(keys) >= _BATCH_ROWS:
            yield _batch(parts, groups, states, keys, values)
            parts, groups, states, keys, values = [], [], [], [], []
    if keys:
        yield _batch(parts, groups, states, keys, values)


def _vectorised(kh: md.KeyedStateHandle, header: ProxyHeader) -> bool:
    """Whether :func:`_fast_records` reads ``kh`` (a canonical handle)."""
    return (
        kh.type == md.SAVEPOINT_KEY_GROUPS
        and kh.delegate is not None
        and len(kh.offsets) == len(kh.key_groups)
    )


def _fast_records(
    plan: RewritePlan,
    task: ReadTask,
    kh: md.KeyedStateHandle,
    header: ProxyHeader,
    part_of: list[int],
    list_elements: dict[int, Any],
    where: str,
) -> Iterator[pa.RecordBatch]:
    """:func:`read_records` of a canonical handle: key group by key group (only its bytes read,
    then decompressed if the savepoint is), each framed once, its columns built with numpy."""
    src = plan.meta.operators[task.op]
    op: OperatorPlan = plan.operators[task.op]
    old_max, new_max = src.max_parallelism, op.max_parallelism
    old_p = 1 if old_max <= 128 else 2
    rehash = old_max != new_max
    hasher = key_hasher(header.key_serializer) if rehash else None
    kind = str(getattr(header.key_serializer, "kind", ""))
    names = [s.name for s in header.states]
    out_sid = np.array([op.state_ids.get(n, -1) for n in names], dtype=np.int64)
    timers = np.zeros(len(names), dtype=bool)
    for k, n in enumerate(names):
        timers[k] = op.state_ids.get(n, -1) in op.timer_ids
    parts_of = np.array(part_of, dtype=np.int32)
    at = plan.at
    for kg_at, data in fast.read_key_groups(kh, task.key_groups):
        here = f"{where} key group {kg_at}"
        if header.compression:  # each key group is a snappy framed stream of its own
            data, _ = read_framed(data, 0, len(data), here)
        framed = fast.frame_group(data, here)
        if framed[0].size and int(framed[0].max()) >= len(names):
            header.state(int(framed[0].max()), here)  # raises: no such state
        arr = np.frombuffer(data, dtype=np.uint8)
        # the columns built _SLICE_ROWS records at a time: a task's working memory beyond the
        # key group's bytes and framing stays the same however large a key group grows
        for lo in range(0, len(framed[0]), _SLICE_ROWS):
            sids, ks, vs, ve = (a[lo : lo + _SLICE_ROWS] for a in framed)
            kl = vs - 4 - ks
            first = arr[ks].astype(np.int64) & ~META_DATA_FOLLOWS_FLAG & 0xFF
            old_kg = first if old_p == 1 else (first << 8) | arr[ks + 1]
            sid = out_sid[sids]
            keep = (sid >= 0) & (old_kg >= task.key_groups.start) & (old_kg <= task.key_groups.end)
            keep &= kl >= old_p
            values: list[bytes] | None = None
            for state, ttl in op.ttl.items():
                rows = sid == state
                if not rows.any():
                    continue
                ttl_kind = op.ttl_kinds[state]
                if ttl_kind in ("value", "map"):
                    off = 0 if ttl_kind == "value" else 1
                    fits = ve - vs >= off + 8
                    start = np.where(fits, vs + off, 0)
                    ts = arr[start[:, None] + np.arange(8)].copy().view(">i8").ravel()
                    expired = fits & (ts.astype(np.int64) <= at - ttl)
                    if ttl_kind == "map":
                        expired &= arr[np.minimum(vs, len(arr) - 1)] == 0
                    keep &= ~(rows & expired)
                else:
                    ser = list_elements[state]
                    assert isinstance(ser, ListSerializer) and isinstance(
                        ser.element, TtlSerializer
                    )
                    if values is None:
                        values = [data[a:b] for a, b in zip(vs.tolist(), ve.tolist(), strict=True)]
                    for i in np.flatnonzero(rows & keep).tolist():
                        kept = _list_survivors(values[i], ser.element, ttl, at, here)
                        values[i] = kept
                        if not kept:
                            keep[i] = False
            idx = np.flatnonzero(keep)
            if not idx.size:
                continue
            ks, kl, vs, ve, sid = ks[idx], kl[idx], vs[idx], ve[idx], sid[idx]
            if hasher is not None:
                start = ks + old_p + 8 * timers[sids[idx]]
                codes, ok = fast.scalar_codes(kind, arr, start, ks + kl)
                for i in np.flatnonzero(~ok).tolist():
                    a, b = int(ks[i]), int(ks[i] + kl[i])
                    codes[i] = hasher(Buf(data[a:b], int(start[i]) - a, where=here))
                groups = fast.new_groups(codes, new_max)
            else:
                groups = old_kg[idx].astype(np.int32)
            key = fast.gather(arr, ks + old_p, kl - old_p)
            if values is None:
                value = fast.gather(arr, vs, ve - vs)
            else:
                value = pa.array([values[i] for i in idx.tolist()], pa.binary())
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(parts_of[groups], pa.int32()),
                    pa.array(groups, pa.int32()),
                    pa.array(sid.astype(np.int16), pa.int16()),
                    key,
                    value,
                ],
                schema=SCHEMA,
            )
            yield batch


def _batch(
    parts: list[int], groups: list[int], states: list[int], keys: list[bytes], values: list[bytes]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(parts, pa.int32()),
            pa.array(groups, pa.int32()),
            pa.array(states, pa.int16()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        schema=SCHEMA,
    )


def _store(fs: Any, out_dir: str) -> tuple[FileStore, str]:
    if isinstance(fs, FileStore):
        return fs, fs.path_of(out_dir)
    return FileStore.at(out_dir)


_LEN = struct.Struct(">i")
_U16 = struct.Struct(">H")


def write_part(
    plan: RewritePlan, part: int, batches: Iterable[pa.RecordBatch], fs: Any, out_dir: str
) -> PartWritten:
    """Write output part ``part`` from ``batches`` sorted by (key_group, state, key): one
    canonical key-group file (docs/flink-format.md §5.2), one key group in memory at a time."""
    out = plan.outputs[part]
    op = plan.operators[out.op]
    store, root = _store(fs, out_dir)
    prefix_len = 1 if op.max_parallelism <= 128 else 2
    kgr = out.key_groups
    offsets = [0] * len(kgr)
    store.makedirs(root)
    path = posixpath.join(root, out.file_name)
    pos = 0
    with store.open_write(path) as f:
        f.write(op.header)
        pos = len(op.header)
        current_kg = -1
        group: list[pa.RecordBatch] = []

        def flush() -> None:
            nonlocal pos
            if not group:
                return
            offsets[current_kg - kgr.start] = pos
            rows = pa.Table.from_batches(group)  # no copy: each slice is combined on its own
            group.clear()
            sid = rows.column("state").to_numpy().astype(np.int64)
            n = len(sid)
            for lo in range(0, n, _SLICE_ROWS):
                hi = min(lo + _SLICE_ROWS, n)
                piece = rows.slice(lo, hi - lo).combine_chunks()
                chunk = fast.assemble_group(
                    current_kg,
                    prefix_len,
                    sid[lo:hi],
                    piece.column("key").chunk(0),
                    piece.column("value").chunk(0),
                    head=lo == 0,
                    following=int(sid[hi]) if hi < n else END_OF_KEY_GROUP_MARK,
                )
                f.write(chunk)
                pos += len(chunk)

        for batch in batches:
            if not batch.num_rows:
                continue
            parts = batch.column("part").to_numpy()
            kgs = batch.column("key_group").to_numpy().astype(np.int64)
            bad = (parts != part) | (kgs < kgr.start) | (kgs > kgr.end)
            if bad.any():
                i = int(bad.argmax())
                raise FlinkStateError(
                    f"record of key group {int(kgs[i])} (part {int(parts[i])}) sent to part "
                    f"{part} over {kgr}"
                )
            if int(kgs[0]) < current_kg or (np.diff(kgs) < 0).any():
                raise FlinkStateError(f"part {part}: records not sorted by key group")
            cuts = [0, *(np.flatnonzero(np.diff(kgs)) + 1).tolist(), len(kgs)]
            for lo, hi in zip(cuts, cuts[1:], strict=False):
                kg = int(kgs[lo])
                if kg != current_kg:
                    flush()
                    current_kg = kg
                group.append(batch.slice(lo, hi - lo))
        flush()
    return PartWritten(part, out.file_name, pos, tuple(offsets))


# --- _metadata ---


def _utf(text: str) -> bytes:
    from state_engine.flink.rewrite.javautf import encode_modified_utf8

    raw = encode_modified_utf8(text)
    return _U16.pack(len(raw)) + raw


def _inline(name: str, data: bytes) -> bytes:
    return b"\x01" + _utf(name) + _LEN.pack(len(data)) + data


def _relative(name: str, size: int) -> bytes:
    return b"\x06" + _utf(name) + struct.pack(">q", size)


class _Copier:
    """Copies the operator and coordinator state streams into the new directory."""

    def __init__(self, store: FileStore, root: str) -> None:
        self.store, self.root = store, root

    def stream(self, handle: md.StreamHandle | None, name: str) -> bytes:
        """The handle as written into the new ``_metadata``: inline as it was, or its bytes
        copied into the directory as ``name`` (a retry writes the same name)."""
        if handle is None:
            return b"\x00"
        data = handle.read_bytes()
        if handle.type == md.INLINE:
            return _inline(handle.name, data)
        with self.store.open_write(posixpath.join(self.root, name)) as f:
            f.write(data)
        return _relative(name, len(data))


def _operator_handle(h: md.OperatorStateHandle, copier: _Copier, name: str) -> bytes:
    out = bytearray(b"\x04")
    out += _LEN.pack(len(h.states))
    for entry in h.states:
        out += _utf(entry.name)
        out += bytes([("SPLIT_DISTRIBUTE", "UNION", "BROADCAST").index(entry.mode)])
        out += _LEN.pack(len(entry.offsets))
        out += struct.pack(f">{len(entry.offsets)}q", *entry.offsets)
    out += copier.stream(h.delegate, name)
    return bytes(out)


def write_metadata(plan: RewritePlan, parts: Sequence[PartWritten], fs: Any, out_dir: str) -> str:
    """Copy operator and coordinator state into ``out_dir`` and write ``_metadata`` last (in the
    source's metadata version; relative handles; canonical savepoint properties); returns its
    path."""
    store, root = _store(fs, out_dir)
    store.makedirs(root)
    by_part = {p.part: p for p in parts}
    if sorted(by_part) != list(range(len(plan.outputs))):
        missing = sorted(set(range(len(plan.outputs))) - set(by_part))
        raise FlinkStateError(f"output parts {missing} were not written: _metadata not written")
    copier = _Copier(store, root)
    meta = plan.meta
    out = bytearray()
    out += struct.pack(">ii", HEADER_MAGIC_NUMBER, plan.version)
    out += struct.pack(">q", meta.checkpoint_id)
    out += plan.master_states
    out += _LEN.pack(len(meta.operators))
    for i, (src, op) in enumerate(zip(meta.operators, plan.operators, strict=True)):
        if plan.version >= 5:
            out += _utf(src.name)
            out += _utf(op.uid)
        out += bytes.fromhex(op.operator_id)
        out += struct.pack(">ii", op.parallelism, op.max_parallelism)
        coordinator = src.coordinator_state
        if coordinator is None:
            out += b"\x00"
        else:
            # Flink reads coordinator state back only from bytes inside _metadata
            out += _inline(coordinator.name, coordinator.read_bytes())
        if src.fully_finished:
            out += _LEN.pack(-1)
            continue
        my_parts = {plan.outputs[p].subtask: p for p in by_part if plan.outputs[p].op == i}
        subtasks = {st.index: st for st in src.subtasks}
        # a keyed operator: one subtask state per new subtask (none beyond its parallelism)
        indexes = sorted({*my_parts, *(k for k in subtasks if k < op.parallelism)})
        out += _LEN.pack(len(indexes))
        for index in indexes:
            st = subtasks.get(index)
            if st is not None and st.finished:
                out += _LEN.pack(-index - 1)
                continue
            out += _LEN.pack(index)
            handles = (st.managed_operator_state, st.raw_operator_state) if st else (None, None)
            for role, oh in zip(("managed", "raw"), handles, strict=True):
                if oh is None:
                    out += _LEN.pack(0)
                else:
                    out += _LEN.pack(1)
                    out += _operator_handle(oh, copier, f"op-{op.operator_id}-{index}-{role}")
            if index in my_parts:
                pw = by_part[my_parts[index]]
                kgr = plan.outputs[pw.part].key_groups
                out += b"\x07"
                out += struct.pack(">ii", kgr.start, len(kgr))
                out += struct.pack(f">{len(pw.offsets)}q", *pw.offsets)
                out += _relative(pw.file_name, pw.size)
            else:
                out += b"\x00"
            out += b"\x00"  # raw keyed state
            out += _LEN.pack(0) + _LEN.pack(0)  # no channel state
    out += plan.properties
    path = posixpath.join(root, "_metadata")
    with store.open_write(path) as f:
        f.write(bytes(out))
    return store.url_of(path) if not store.is_local else path


def rewrite_local(
    meta: FlinkSnapshotMetadata, options: RewriteOptions, fs: Any, out_dir: str
) -> dict[str, Any]:
    """The whole rewrite in this process (tests, small snapshots); returns the plan's report
    with ``output_location`` (None when no rewrite is needed)."""
    plan = plan_rewrite(meta, options)
    report = plan.report()
    if not plan.needs_rewrite:
        report["output_location"] = None
        return report
    by_part: dict[int, list[pa.RecordBatch]] = {i: [] for i in range(len(plan.outputs))}
    for task in plan.read_tasks:
        for batch in read_records(plan, task, fs):
            parts = batch.column("part").to_numpy()
            for p in np.unique(parts).tolist():
                by_part[p].append(batch.filter(pa.array(parts == p)))
    written = []
    records = 0
    for p, batches in by_part.items():
        table = pa.Table.from_batches(batches, schema=SCHEMA).sort_by(
            [("key_group", "ascending"), ("state", "ascending"), ("key", "ascending")]
        )
        records += table.num_rows
        written.append(write_part(plan, p, table.to_batches(), fs, out_dir))
    report["output_location"] = posixpath.dirname(write_metadata(plan, written, fs, out_dir))
    report["records"] = records
    return report
