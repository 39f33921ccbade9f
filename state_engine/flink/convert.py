"""A Flink snapshot as a Statekeeper canonical savepoint (``statectl maintain savepoint`` on Flink).

Keys keep the key group Flink's bytes carry, and the key hash is Flink's ``hashCode`` of the key,
checked against that key group (a mismatch stops the conversion); keys and values are
re-serialized with Statekeeper serializers. The type mapping, TTL handling (the duration is not in
a Flink snapshot: pass it per state, ``ttl={"lastSeen": 3_600_000}``), what is skipped (operator
state, timers) and why a converted PyFlink savepoint keeps Flink's Row hash:
``docs/flink-format.md §7.3``.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from state_engine.errors import FlinkConversionError, UnsupportedFlinkSerializer
from state_engine.flink.keyed_state import ProxyHeader, operator_label, read_proxy_header
from state_engine.flink.pyflink import PyFlinkTypes, is_pyflink_entry, pyflink_entry
from state_engine.flink.serializers import (
    FlinkSerializer,
    ListSerializer,
    MapSerializer,
    RowSerializer,
    TtlSerializer,
    _Scalar,
)
from state_engine.flink.snapshot_state import snapshot_entries
from state_engine.hashing import java_long_hash, java_string_hash, murmur_hash
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.serde import (
    BoolSerializer,
    BytesSerializer,
    FloatSerializer,
    IntSerializer,
    JsonSerializer,
    StrSerializer,
    TypeSerializer,
)
from state_engine.snapshot.canonical import CanonicalWriter, KeyGroupStats
from state_engine.snapshot.metadata import (
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
)
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus
from state_engine.state.meta import StateEntry, StateMetaInfo
from state_engine.state.namespace import VOID_NAMESPACE, NamespaceSerializer

if TYPE_CHECKING:
    from state_engine.flink.metadata import FlinkSnapshotMetadata, OperatorState

_POSITION = struct.Struct(">I")
_PY_TYPES: dict[str, type[TypeSerializer]] = {
    "LONG": IntSerializer,
    "BIG_INT": IntSerializer,
    "INT": IntSerializer,
    "SHORT": IntSerializer,
    "BYTE": IntSerializer,
    "BOOLEAN": BoolSerializer,
    "DOUBLE": FloatSerializer,
    "FLOAT": FloatSerializer,
    "STRING": StrSerializer,
    "BYTES": BytesSerializer,
}


@dataclass
class _StatePlan:
    name: str
    kind: str
    value: TypeSerializer
    user_key: TypeSerializer | None = None
    ttl_ms: int | None = None

    def meta(self) -> dict[str, Any]:
        from state_engine.state.descriptors import StateKind
        from state_engine.state.ttl import StateTtlConfig

        serializers: dict[str, TypeSerializer] = {
            "value": self.value,
            "namespace": NamespaceSerializer(),
        }
        if self.user_key is not None:
            serializers["user_key"] = self.user_key
        ttl = StateTtlConfig(ttl_ms=self.ttl_ms) if self.ttl_ms else None
        return StateMetaInfo(self.name, StateKind(self.kind), serializers, ttl).to_dict()


@dataclass
class Conversion:
    """What :func:`write_canonical` wrote: the savepoint's metadata and per-key-group stats."""

    metadata: SnapshotMetadata
    key_group_stats: dict[str, dict[int, KeyGroupStats]]
    rows: int
    skipped: dict[str, list[str]] = field(default_factory=dict)


def _scalar(ser: FlinkSerializer) -> TypeSerializer:
    if isinstance(ser, RowSerializer) and len(ser.fields) == 1:
        return _scalar(ser.fields[0])
    if isinstance(ser, TtlSerializer) and ser.value is not None:
        return _scalar(ser.value)
    if isinstance(ser, _Scalar):
        kind = ser.kind
        if kind in ("string", "char"):
            return StrSerializer()
        if kind in ("long", "int", "short", "byte"):
            return IntSerializer()
        if kind in ("double", "float"):
            return FloatSerializer()
        if kind == "boolean":
            return BoolSerializer()
        if kind == "bytes":
            return BytesSerializer()
    return JsonSerializer()


def _key_hash(ser: FlinkSerializer, key: Any) -> int:
    """Flink's ``hashCode()`` of a key as its key serializer decodes it."""
    if isinstance(ser, RowSerializer):
        # Row.hashCode (RowUtils.deepHashCodeRow): 31 * kind + Arrays-style hash of the fields,
        # with the kind INSERT (0) the one a keyBy writes
        h = 1
        for f_ser, f in zip(ser.fields, key, strict=True):
            h = (31 * h + (0 if f is None else _key_hash(f_ser, f))) & 0xFFFFFFFF
        h = (31 + h) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    if isinstance(ser, _Scalar):
        if ser.kind in ("string",):
            return java_string_hash(key)
        if ser.kind == "long":
            return java_long_hash(key)
        if ser.kind in ("int", "short", "byte"):
            return int(key)
        if ser.kind == "char":
            return ord(key)
    raise FlinkConversionError(
        f"keys of serializer {ser.describe()} have no Java hashCode rule here; only String, "
        "Long, Integer, Short, Byte, Character and Row keys of those convert"
    )


def _plans(
    header: ProxyHeader,
    ttl: dict[str, int],
    py: PyFlinkTypes,
    skipped: dict[str, list[str]],
) -> dict[str, _StatePlan]:
    plans: dict[str, _StatePlan] = {}
    for st in header.states:
        if st.is_timers:
            skipped.setdefault("timers", []).append(st.name)
            continue
        ser = st.value_serializer
        name = st.name
        if name.startswith("python-state-"):
            name = name[len("python-state-") :]
            kind, types = py.of(name)
            t = [_PY_TYPES.get(x, JsonSerializer)() for x in types] or [JsonSerializer()]
            if st.kind == "MAP":
                key_ser = t[0] if types else JsonSerializer()
                val_ser = t[1] if len(t) > 1 else JsonSerializer()
                plans[st.name] = _StatePlan(name, "MAP", val_ser, key_ser, ttl.get(name))
            else:
                plans[st.name] = _StatePlan(
                    name, "VALUE" if kind == "value" else "LIST", t[0], None, ttl.get(name)
                )
            continue
        is_ttl = False
        if st.kind == "MAP" and isinstance(ser, MapSerializer):
            assert ser.key is not None and ser.value is not None
            is_ttl = isinstance(ser.value, TtlSerializer)
            plan = _StatePlan(name, "MAP", _scalar(ser.value), _scalar(ser.key))
        elif st.kind == "LIST" and isinstance(ser, ListSerializer):
            assert ser.element is not None
            is_ttl = isinstance(ser.element, TtlSerializer)
            plan = _StatePlan(name, "LIST", _scalar(ser.element))
        else:
            is_ttl = isinstance(ser, TtlSerializer)
            kind = st.kind if st.kind in ("VALUE", "REDUCING", "AGGREGATING") else "VALUE"
            plan = _StatePlan(name, kind, _scalar(ser))
        if is_ttl:
            plan.ttl_ms = ttl.get(name)
            if plan.ttl_ms is None:
                skipped.setdefault("ttl_without_duration", []).append(name)
        plans[st.name] = plan
    return plans


def _header_of(op: OperatorState) -> ProxyHeader:
    from state_engine.flink import metadata as md

    for st in op.subtasks:
        for kh in st.keyed_handles:
            if kh.type == md.INCREMENTAL and kh.meta is not None:
                return read_proxy_header(kh.meta.read_bytes(), f"operator {op.uid} meta data")
            if kh.delegate is not None:
                return read_proxy_header(kh.delegate.read_bytes(), f"operator {op.uid} state")
    raise FlinkConversionError(f"operator {operator_label(op)} has no keyed state to convert")


def write_canonical(
    meta: FlinkSnapshotMetadata,
    snap: SnapshotDir,
    *,
    job: str,
    checkpoint_id: int,
    ttl: dict[str, int] | None = None,
    pyflink_types: PyFlinkTypes | None = None,
    row_group_bytes: int = 256 << 10,
) -> Conversion:
    """Write the keyed state of ``meta`` as canonical files into ``snap`` (not ``_metadata``).

    On any error every file written so far is removed.
    """
    ttl = dict(ttl or {})
    py = pyflink_types or PyFlinkTypes()
    skipped: dict[str, list[str]] = {}
    max_p = meta.max_parallelism
    ns_bytes = NamespaceSerializer().serialize(VOID_NAMESPACE)
    operators: list[OperatorSnapshot] = []
    files: list[SnapshotFile] = []
    stats: dict[str, dict[int, KeyGroupStats]] = {}
    total = 0
    writers: list[CanonicalWriter] = []
    try:
        for op in meta.operators:
            label = operator_label(op)
            if not op.has_keyed_state:
                if any(st.managed_operator_state or st.raw_operator_state for st in op.subtasks):
                    skipped.setdefault("operator_state", []).append(label)
                continue
            if op.max_parallelism != max_p:
                raise FlinkConversionError(
                    f"operator {label} has max parallelism {op.max_parallelism}, others "
                    f"{max_p}: a Statekeeper savepoint has one max parallelism"
                )
            header = _header_of(op)
            plans = _plans(header, ttl, py, skipped)
            key_flink = header.key_serializer
            key_ser = _scalar(key_flink)
            rows: dict[int, list[StateEntry]] = defaultdict(list)
            hashes: dict[bytes, int] = {}
            # canonical files decoded a whole state at a time (Arrow columns); the rows are
            # sorted by key group and state below, a state's in stream order either way
            for _op, subtask, e in snapshot_entries(meta, op.uid or op.operator_id, by_state=True):
                plan = plans.get(e.state)
                if plan is None:
                    continue
                if is_pyflink_entry(e):
                    e = pyflink_entry(e, py)
                key = e.key[0] if isinstance(e.key, tuple) and len(e.key) == 1 else e.key
                key_bytes = key_ser.serialize(key)
                h = hashes.get(key_bytes)
                if h is None:
                    h = _key_hash(key_flink, e.key)
                    if murmur_hash(h) % max_p != e.key_group:
                        raise FlinkConversionError(
                            f"operator {label}: key {key!r} is in key group {e.key_group} in "
                            f"Flink's bytes but its hash {h} gives "
                            f"{murmur_hash(h) % max_p}; the key type's hash rule is not "
                            "Flink's, so the savepoint would restore keys to the wrong place"
                        )
                    hashes[key_bytes] = h
                expires = (
                    e.expires_at + plan.ttl_ms
                    if plan.ttl_ms is not None and e.expires_at is not None
                    else None
                )
                out = rows[subtask]
                if plan.kind == "LIST":
                    values = e.value if isinstance(e.value, list) else [e.value]
                    for i, v in enumerate(values):
                        out.append(
                            StateEntry(
                                e.key_group, h, key_bytes, ns_bytes, plan.name,
                                _POSITION.pack(i), plan.value.serialize(v), expires,
                            )
                        )  # fmt: skip
                elif plan.kind == "MAP":
                    assert plan.user_key is not None
                    out.append(
                        StateEntry(
                            e.key_group, h, key_bytes, ns_bytes, plan.name,
                            plan.user_key.serialize(e.user_key), plan.value.serialize(e.value),
                            expires,
                        )
                    )  # fmt: skip
                else:
                    out.append(
                        StateEntry(
                            e.key_group, h, key_bytes, ns_bytes, plan.name, None,
                            plan.value.serialize(e.value), expires,
                        )
                    )  # fmt: skip
            subtasks = []
            op_stats = stats.setdefault(label, {})
            for index in range(op.parallelism):
                kgr = compute_key_group_range_for_operator_index(max_p, op.parallelism, index)
                first, last = kgr.start, kgr.end
                mine = sorted(rows.get(index, []), key=lambda r: (r.key_group, r.state))
                w = CanonicalWriter(
                    snap,
                    subtask=index,
                    max_parallelism=max_p,
                    key_group_range=(first, last),
                    file_prefix=f"keyed-{label}-{index}",
                    row_group_bytes=row_group_bytes,
                )
                writers.append(w)
                w.write(mine)
                written = w.finish()
                files.extend(written.files)
                op_stats.update(written.key_group_stats)
                total += len(mine)
                subtasks.append(SubtaskSnapshot(index, (first, last), written.paths))
            operators.append(
                OperatorSnapshot(
                    operator_id=label,
                    key_serializer=key_ser.snapshot().to_dict(),
                    states={p.name: p.meta() for p in plans.values()},
                    subtasks=tuple(subtasks),
                )
            )
    except UnsupportedFlinkSerializer as exc:
        _abort(snap, writers, files)
        raise FlinkConversionError(f"cannot convert {meta.metadata_path}: {exc}") from None
    except BaseException:
        _abort(snap, writers, files)
        raise
    if not operators:
        raise FlinkConversionError(
            f"{meta.metadata_path} holds no keyed state: there is nothing to convert"
        )
    parallelism = max(op.parallelism for op in meta.operators if op.has_keyed_state)
    converted = SnapshotMetadata(
        job=job,
        checkpoint_id=checkpoint_id,
        kind=SnapshotKind.SAVEPOINT,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=max_p,
        parallelism=parallelism,
        operators=tuple(operators),
        files=tuple(files),
    )
    return Conversion(converted, stats, total, skipped)


def _abort(snap: SnapshotDir, writers: list[CanonicalWriter], files: list[SnapshotFile]) -> None:
    for w in writers:
        w.abort()  # removes what an unfinished writer wrote; finished files go below
    for f in files:
        snap.remove_file(f.path)


def run(
    catalog: Any,
    snapshot: int,
    *,
    savepoint_dir: str | None = None,
    ttl: dict[str, int] | None = None,
    pyflink_types: PyFlinkTypes | None = None,
    run_id: str | None = None,
    dag_id: str | None = None,
    airflow_run_id: str | None = None,
    task_id: str | None = None,
    settings: Any = None,
    **_ignored: Any,
) -> dict[str, Any]:
    """Convert catalog snapshot ``snapshot`` of a Flink job into a registered canonical SAVEPOINT.

    The savepoint is a snapshot of the same catalog job (format CANONICAL, a new checkpoint id),
    written under the job's Statekeeper savepoint directory or ``savepoint_dir``; it is PENDING
    until its ``_metadata`` is written, and on failure it is FAILED with its files removed. The
    same ``run_id`` again returns the earlier result instead of converting twice.
    """
    import uuid

    from state_engine.flink.keyed_state import catalog_flink_metadata
    from state_engine.maintenance.output import previous_output
    from state_engine.maintenance.run import run_tag

    meta = catalog_flink_metadata(catalog, snapshot)
    if meta is None:
        raise FlinkConversionError(
            f"snapshot {snapshot} is not a snapshot of a Flink job; use statectl maintain "
            "savepoint for Statekeeper snapshots"
        )
    record = catalog.get_snapshot(snapshot)
    run_id = run_id or f"savepoint-{uuid.uuid4().hex}"
    tag = run_tag(run_id)
    params = {"snapshot": snapshot, "savepoint_dir": savepoint_dir, "ttl": ttl or {}}
    airflow = {"dag_id": dag_id, "airflow_run_id": airflow_run_id, "task_id": task_id}
    started = catalog.start_run(
        run_id, "savepoint", job=record.job, params=params, input_snapshot_id=snapshot, **airflow
    )
    if started.status == "SUCCEEDED":  # this run already converted: its savepoint exists
        done = previous_output(catalog, record.job, tag)
        if done is not None:
            return {"run_id": run_id, **_report(record, done, None, recovered=True)}
    try:
        report = _convert(catalog, record, meta, tag, savepoint_dir, ttl, pyflink_types, settings)
    except BaseException as exc:
        catalog.fail_run(run_id, str(exc)[:2000])
        raise
    catalog.finish_run(
        run_id,
        stats={
            "origin": "flink",
            "skipped": report["skipped"],
            "recovered": report["recovered"],
            "trigger": tag,
        },
        output_snapshot_id=report["output_snapshot_id"],
        rows_out=report["rows_out"],
        bytes_out=report["bytes_out"],
    )
    return {"run_id": run_id, "trigger": tag, **report}


def _convert(
    catalog: Any,
    record: Any,
    meta: FlinkSnapshotMetadata,
    tag: str,
    savepoint_dir: str | None,
    ttl: dict[str, int] | None,
    pyflink_types: PyFlinkTypes | None,
    settings: Any,
) -> dict[str, Any]:
    from state_engine.catalog import KeyGroupStatRow
    from state_engine.maintenance.output import output_snapshot

    with output_snapshot(
        catalog,
        record.job,
        tag=tag,
        settings=settings,
        kind=SnapshotKind.SAVEPOINT,
        parallelism=max(1, meta.parallelism),
        max_parallelism=meta.max_parallelism,
        savepoint_dir=savepoint_dir,
        parent_id=record.id,
    ) as out:
        if out.recovered:
            return _report(record, out.record, None, recovered=True)
        conv = write_canonical(
            meta,
            out.snapshot,
            job=record.job,
            checkpoint_id=out.record.checkpoint_id,
            ttl=ttl,
            pyflink_types=pyflink_types,
        )
        catalog.record_key_group_stats(
            out.record.id,
            [
                KeyGroupStatRow(op, kg, s.rows, s.bytes)
                for op, per_kg in conv.key_group_stats.items()
                for kg, s in sorted(per_kg.items())
            ],
        )
        done = out.commit(conv.metadata, [])
    return _report(record, done, conv, recovered=False)


def _report(source: Any, done: Any, conv: Conversion | None, *, recovered: bool) -> dict[str, Any]:
    return {
        "input_snapshot_id": source.id,
        "input_checkpoint_id": source.checkpoint_id,
        "output_snapshot_id": done.id,
        "output_checkpoint_id": done.checkpoint_id,
        "output_location": done.location,
        "rows_out": conv.rows if conv is not None else done.entries,
        "bytes_out": done.bytes,
        "skipped": conv.skipped if conv is not None else {},
        "recovered": recovered,
    }


def parse_ttl(items: list[str] | None) -> dict[str, int]:
    """``["lastSeen=3600000", ...]`` (the ``--ttl`` option) as ``{state: ms}``."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, ms = item.partition("=")
        try:
            value = int(ms)
        except ValueError:
            value = 0
        if not sep or not name or value <= 0:
            raise FlinkConversionError(
                f"--ttl {item!r}: give STATE=MS with a positive number of milliseconds, e.g. "
                "lastSeen=3600000 for the 1 h TTL the Flink job configured"
            )
        out[name.strip()] = value
    return out


def latest_flink_snapshot(catalog: Any, job: str) -> int | None:
    """The newest COMPLETED snapshot of ``job`` written by Flink (not a converted one).

    None when ``job`` is not a Flink job; an error when it is one without a Flink snapshot.
    """
    from state_engine.flink.keyed_state import catalog_flink_metadata

    record = catalog.get_job(job)
    if getattr(record, "origin", "statekeeper") != "flink":
        return None
    for snap in catalog.list_snapshots(job, status=SnapshotStatus.COMPLETED):
        if catalog_flink_metadata(catalog, snap.id) is not None:
            return int(snap.id)
    raise FlinkConversionError(
        f"Flink job {job!r} has no COMPLETED Flink snapshot to convert; import its directories "
        "with statectl flink import"
    )
