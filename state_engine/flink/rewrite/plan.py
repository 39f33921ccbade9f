"""The plan of a rewrite: what every operator becomes, which source handles are read in which
tasks, and which output parts are written; every refusal that depends on the snapshot is here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from state_engine.errors import FlinkStateError
from state_engine.flink import metadata as md
from state_engine.flink.metadata import FlinkSnapshotMetadata
from state_engine.flink.metadata.parser import MASTER_STATE_MAGIC
from state_engine.flink.rewrite.ids import operator_id_of_uid
from state_engine.flink.rewrite.keys import key_hasher
from state_engine.flink.rewrite.options import RewriteOptions, RewriteRefused
from state_engine.flink.rewrite.source import HeaderBytes, handle_header
from state_engine.flink.serializers import ListSerializer, MapSerializer, TtlSerializer
from state_engine.keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot.storage import open_url

__all__ = ["OperatorPlan", "OutputPart", "ReadTask", "RewritePlan", "plan_rewrite"]


#: source bytes per read task of a canonical or heap handle (its key groups cut into sub-ranges)
TASK_BYTES = 32 << 20


def _sub_ranges(kh: md.KeyedStateHandle) -> list[KeyGroupRange]:
    """The handle's key groups cut into contiguous sub-ranges of about :data:`TASK_BYTES` of
    the file each (a key group is never split)."""
    first = kh.key_groups.start
    offsets = kh.offsets
    if len(offsets) != len(kh.key_groups):
        return [kh.key_groups]
    out: list[KeyGroupRange] = []
    lo, base = 0, 0
    for k, off in enumerate(offsets):
        if not off:
            continue
        if not base:
            base = off
        elif off - base >= TASK_BYTES:
            out.append(KeyGroupRange(first + lo, first + k - 1))
            lo, base = k, off
    out.append(KeyGroupRange(first + lo, kh.key_groups.end))
    return out


@dataclass(frozen=True)
class ReadTask:
    """One source keyed handle (operator ``op``, subtask, which of its keyed handles), and the
    key groups of it this task reads (the whole range for a RocksDB handle)."""

    op: int
    subtask: int
    handle: int
    key_groups: KeyGroupRange


@dataclass(frozen=True)
class OutputPart:
    """One output canonical key-group file: subtask ``subtask`` of operator ``op`` (index into
    ``meta.operators``) over ``key_groups`` (its canonical range at the new parallelism)."""

    op: int
    subtask: int
    key_groups: KeyGroupRange
    file_name: str


@dataclass(frozen=True)
class OperatorPlan:
    """What one operator becomes.

    ``header``: the output ``KeyedBackendSerializationProxy`` bytes (the kept states' meta info
    copied from the source byte for byte, compression off); ``state_ids``: source state name ->
    output state id; ``ttl``: output state id -> TTL ms (TTL cleanup); ``key_kind``: how the
    key's Java hashCode is computed ("" when keys are not re-hashed)."""

    uid: str
    operator_id: str
    parallelism: int
    max_parallelism: int
    dropped: bool = False
    header: bytes = b""
    state_ids: dict[str, int] = field(default_factory=dict)
    state_names: tuple[str, ...] = ()
    timer_ids: frozenset[int] = frozenset()
    ttl: dict[int, int] = field(default_factory=dict)
    ttl_kinds: dict[int, str] = field(default_factory=dict)
    key_kind: Any = None


@dataclass(frozen=True)
class RewritePlan:
    """A checked rewrite (picklable: sent to Spark tasks)."""

    meta: FlinkSnapshotMetadata
    options: RewriteOptions
    at: int
    operators: tuple[OperatorPlan, ...]
    read_tasks: tuple[ReadTask, ...]
    outputs: tuple[OutputPart, ...]
    needs_rewrite: bool
    version: int
    properties: bytes
    master_states: bytes
    notes: tuple[str, ...] = ()

    def report(self) -> dict[str, Any]:
        """What the rewrite changes: max parallelism per operator, dropped states and operators,
        uid changes, TTL cleanup, parts; ``needs_rewrite`` False says a restore needs no copy."""
        ops = []
        for i, (src, op) in enumerate(zip(self.meta.operators, self.operators, strict=True)):
            ops.append(
                {
                    "index": i,
                    "uid": op.uid,
                    "operator_id": op.operator_id,
                    "old_uid": src.uid,
                    "old_operator_id": src.operator_id,
                    "parallelism": op.parallelism,
                    "old_parallelism": src.parallelism,
                    "max_parallelism": op.max_parallelism,
                    "old_max_parallelism": src.max_parallelism,
                    "keyed_states": list(op.state_names),
                    "state_dropped": op.dropped,
                }
            )
        return {
            "needs_rewrite": self.needs_rewrite,
            "source": self.meta.directory,
            "source_format": f"{self.meta.kind}/{self.meta.format}",
            "metadata_version": self.version,
            "max_parallelism_changed": [
                o["uid"] or o["operator_id"]
                for o in ops
                if o["max_parallelism"] != o["old_max_parallelism"]
            ],
            "uid_changes": {
                (o["old_uid"] or o["old_operator_id"]): o["uid"]
                for o in ops
                if o["operator_id"] != o["old_operator_id"]
            },
            "dropped_operators": [o["uid"] or o["operator_id"] for o in ops if o["state_dropped"]],
            "dropped_states": list(self.options.drop_states),
            "ttl": dict(self.options.ttl),
            "at": self.at,
            "parts": len(self.outputs),
            "read_tasks": len(self.read_tasks),
            "operators": ops,
            "notes": list(self.notes),
        }


def _where(meta: FlinkSnapshotMetadata, op: md.OperatorState) -> str:
    return f"{meta.metadata_path} operator {op.uid or op.operator_id}"


def _find(meta: FlinkSnapshotMetadata, uid_or_id: str) -> int | None:
    for i, op in enumerate(meta.operators):
        if uid_or_id in (op.uid, op.operator_id):
            return i
    return None


def _operators_text(meta: FlinkSnapshotMetadata) -> str:
    return ", ".join(op.uid or op.operator_id for op in meta.operators)


def _ttl_kind(kind: str, ser: Any) -> str | None:
    if kind == "MAP" and isinstance(ser, MapSerializer):
        return "map" if isinstance(ser.value, TtlSerializer) else None
    if kind == "LIST" and isinstance(ser, ListSerializer):
        return "list" if isinstance(ser.element, TtlSerializer) else None
    return "value" if isinstance(ser, TtlSerializer) else None


def _metadata_parts(meta: FlinkSnapshotMetadata) -> tuple[bytes, bytes]:
    """The master states (count and bytes, as written) and the properties bytes of the source."""
    with open_url(meta.metadata_path) as f:
        data: bytes = bytes(f.read())
    pos = 16
    n = int.from_bytes(data[pos : pos + 4], "big", signed=True)
    end = pos + 4
    for _ in range(n):
        assert int.from_bytes(data[end : end + 4], "big") == MASTER_STATE_MAGIC
        length = int.from_bytes(data[end + 4 : end + 8], "big")
        end += 8 + length
    masters = data[pos:end]
    props = b""
    if meta.version >= 4:
        at = data.rfind(b"\xac\xed\x00\x05")
        props = data[at:] if at >= 0 else b""
    return masters, props


def canonical_properties(meta: FlinkSnapshotMetadata, source_props: bytes) -> bytes:
    """``CheckpointProperties`` of a canonical savepoint: the source's own when it is one, else
    the bytes Flink 2.3 writes for every canonical savepoint."""
    if meta.kind == "savepoint" and meta.format == "canonical" and source_props:
        return source_props
    from state_engine.flink.rewrite.constants import CANONICAL_SAVEPOINT_PROPERTIES

    return CANONICAL_SAVEPOINT_PROPERTIES


def plan_rewrite(meta: FlinkSnapshotMetadata, options: RewriteOptions) -> RewritePlan:
    """Check ``options`` against ``meta`` and plan the rewrite; :class:`RewriteRefused` names
    what does not fit. Reads only the source's ``_metadata`` and its keyed-state headers."""
    new_max = options.max_parallelism
    if new_max is not None and not 1 <= new_max <= UPPER_BOUND_MAX_PARALLELISM:
        raise RewriteRefused(
            f"max parallelism {new_max} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}: "
            "give --max-parallelism in that range"
        )
    if options.parallelism is not None and options.parallelism < 1:
        raise RewriteRefused(f"parallelism {options.parallelism} is below 1: give 1 or more")
    if options.parallelism is not None and new_max is not None and options.parallelism > new_max:
        raise RewriteRefused(
            f"max parallelism {new_max} is below the parallelism {options.parallelism}: give a "
            "--max-parallelism of at least the parallelism"
        )
    keyed = [i for i, op in enumerate(meta.operators) if op.has_keyed_state]
    renames: dict[int, str] = {}
    for old, new in options.uids.items():
        i = _find(meta, old)
        if i is None:
            raise RewriteRefused(
                f"operator uid {old!r} is not in snapshot {meta.directory} (operators: "
                f"{_operators_text(meta)}): name one of them"
            )
        if not new:
            raise RewriteRefused(f"new uid for {old!r} is empty: give a non-empty uid")
        other = _find(meta, new)
        if other is not None and other != i:
            raise RewriteRefused(
                f"new uid {new!r} of {old!r} is already an operator of the snapshot: pick another"
            )
        renames[i] = new
    dropped_ops: set[int] = set()
    for name in options.drop_operators:
        i = _find(meta, name)
        if i is None:
            raise RewriteRefused(
                f"operator uid {name!r} to drop is not in snapshot {meta.directory} (operators: "
                f"{_operators_text(meta)}): name one of them"
            )
        dropped_ops.add(i)
    # the keyed headers: per keyed operator, its states by name (first handle that has each)
    headers: dict[int, tuple[Any, HeaderBytes, list[str]]] = {}
    for i in keyed:
        op = meta.operators[i]
        where = _where(meta, op)
        first_header = None
        pieces: dict[str, bytes] = {}
        infos: dict[str, Any] = {}
        order: list[str] = []
        key_ser_bytes = b""
        for st in op.subtasks:
            if st.raw_keyed_state is not None:
                raise RewriteRefused(
                    f"{where} subtask {st.index} has raw keyed state, which is not rewritten: "
                    "take a savepoint of a job without raw keyed state"
                )
            kh = st.managed_keyed_state
            if kh is None:
                continue
            try:
                header, hb = handle_header(kh, f"{where} subtask {st.index}")
            except FlinkStateError as exc:
                raise RewriteRefused(str(exc)) from None
            if first_header is None:
                first_header, key_ser_bytes = header, hb.key_serializer
            for (name, raw), info in zip(hb.states, header.states, strict=True):
                if name not in pieces:
                    pieces[name], infos[name] = raw, info
                    order.append(name)
        if first_header is not None:
            headers[i] = (
                (first_header, infos),
                HeaderBytes(key_ser_bytes, tuple(pieces.items())),
                order,
            )
    drop_by_op: dict[int, set[str]] = {i: set() for i in range(len(meta.operators))}
    for spec in options.drop_states:
        uid, _, state = spec.rpartition("/")
        targets = [
            i
            for i in headers
            if not uid or uid in (meta.operators[i].uid, meta.operators[i].operator_id)
        ]
        hits = [i for i in targets if state in headers[i][2]]
        if not hits:
            raise RewriteRefused(
                f"state {spec!r} to drop is in no keyed operator of snapshot {meta.directory} "
                f"(states: {_states_text(meta, headers)}): name an existing state"
            )
        for i in hits:
            drop_by_op[i].add(state)
    ttl_hits: dict[str, int] = {}
    for state, ms in options.ttl.items():
        if ms is None or int(ms) < 0:
            raise RewriteRefused(f"--ttl {state}={ms}: the TTL must be a number of ms >= 0")
        found = False
        for i, ((_, infos), _, _order) in headers.items():
            if state not in infos:
                continue
            found = True
            info = infos[state]
            if _ttl_kind(info.kind, info.value_serializer) is None:
                label = meta.operators[i].uid or meta.operators[i].operator_id
                raise RewriteRefused(
                    f"state {state!r} of operator {label} has no TTL serializer "
                    f"({info.value_serializer.describe()}): its entries carry no last-access "
                    "time; give --ttl only for states declared with a StateTtlConfig"
                )
            ttl_hits[state] = ttl_hits.get(state, 0) + 1
        if not found:
            raise RewriteRefused(
                f"--ttl state {state!r} is not a keyed state of snapshot {meta.directory} "
                f"(states: {_states_text(meta, headers)}): name an existing state"
            )
    at = int(time.time() * 1000) if options.at is None else int(options.at)
    plans: list[OperatorPlan] = []
    outputs: list[OutputPart] = []
    tasks: list[ReadTask] = []
    changed_max = False
    for i, op in enumerate(meta.operators):
        uid = renames.get(i, op.uid)
        op_id = operator_id_of_uid(uid) if i in renames else op.operator_id
        max_p = new_max if new_max is not None else op.max_parallelism
        if max_p != op.max_parallelism:
            changed_max = True
        is_keyed = i in headers
        parallelism = op.parallelism
        if is_keyed and options.parallelism is not None:
            parallelism = options.parallelism
        if parallelism > max_p:
            raise RewriteRefused(
                f"max parallelism {max_p} is below the parallelism {parallelism} of operator "
                f"{op.uid or op.operator_id}: give a --max-parallelism of at least {parallelism} "
                "or a lower --parallelism"
            )
        if is_keyed and parallelism < op.parallelism:
            for st in op.subtasks:
                if st.index >= parallelism and (
                    st.managed_operator_state is not None or st.raw_operator_state is not None
                ):
                    raise RewriteRefused(
                        f"operator {op.uid or op.operator_id} has operator state on subtask "
                        f"{st.index}, beyond the new parallelism {parallelism}: keep its "
                        "parallelism (Flink redistributes operator state at restore)"
                    )
        if not is_keyed or i in dropped_ops:
            plans.append(OperatorPlan(uid, op_id, parallelism, max_p, dropped=i in dropped_ops))
            continue
        (header, infos), hb, order = headers[i]
        if max_p != op.max_parallelism and key_hasher(header.key_serializer) is None:
            raise RewriteRefused(
                f"operator {op.uid or op.operator_id}: keys of serializer "
                f"{header.key_serializer.java_class} have no Java hashCode this writer reproduces "
                "(String, Long, Integer, Short, Byte, Character, Boolean, Double, Float, Row, "
                "BinaryRowData keys), so they cannot move to new key groups: keep the max "
                "parallelism"
            )
        kept = [n for n in order if n not in drop_by_op[i]]
        ids = {n: k for k, n in enumerate(kept)}
        ttl = {ids[n]: int(options.ttl[n]) for n in kept if n in options.ttl}
        ttl_kinds = {
            ids[n]: str(_ttl_kind(infos[n].kind, infos[n].value_serializer))
            for n in kept
            if n in options.ttl
        }
        timers = frozenset(ids[n] for n in kept if infos[n].is_timers)
        plans.append(
            OperatorPlan(
                uid,
                op_id,
                parallelism,
                max_p,
                header=hb.build(kept),
                state_ids=ids,
                state_names=tuple(kept),
                timer_ids=timers,
                ttl=ttl,
                ttl_kinds=ttl_kinds,
                key_kind=None,
            )
        )
        for s in range(parallelism):
            kgr = compute_key_group_range_for_operator_index(max_p, parallelism, s)
            outputs.append(OutputPart(i, s, kgr, f"{op_id}-{s:05d}"))
        for st in op.subtasks:
            kh = st.managed_keyed_state
            if kh is not None:
                split = kh.type in (md.SAVEPOINT_KEY_GROUPS, md.KEY_GROUPS)
                for kgr in _sub_ranges(kh) if split else (kh.key_groups,):
                    tasks.append(ReadTask(i, st.index, 0, kgr))
    for op in meta.operators:
        for st in op.subtasks:
            if st.input_channel_state or st.output_channel_state:
                raise RewriteRefused(
                    f"operator {op.uid or op.operator_id} subtask {st.index} has in-flight data "
                    "(an unaligned checkpoint): Flink would replay it, a rewrite cannot; take an "
                    "aligned checkpoint or a savepoint"
                )
    canonical = meta.kind == "savepoint" and meta.format == "canonical"
    notes: list[str] = []
    changes = bool(changed_max or options.ttl or options.drop_states or dropped_ops or renames)
    needs = changes or not canonical
    if not needs:
        p = options.parallelism or meta.parallelism
        notes.append(
            f"Flink restores {meta.directory} at any parallelism up to its max parallelism "
            f"{meta.max_parallelism} with no rewrite: flink run -s {meta.directory} -p {p} ..."
        )
    masters, props = _metadata_parts(meta)
    return RewritePlan(
        meta,
        options,
        at,
        tuple(plans),
        tuple(tasks) if needs else (),
        tuple(outputs) if needs else (),
        needs,
        meta.version,
        canonical_properties(meta, props) if meta.version >= 4 else b"",
        masters,
        tuple(notes),
    )


def _states_text(meta: FlinkSnapshotMetadata, headers: dict[int, Any]) -> str:
    names = sorted(
        {n for _, _, order in headers.values() for n in order if not n.startswith("_timer_state/")}
    )
    return ", ".join(names) or "none"
