"""Restore: which snapshot, whether it may be restored, and what each new subtask reads.

At the same max parallelism a new subtask owns one key-group range; it reads

- canonical files: only the files and row groups whose index overlaps its range;
- delta chains: the base and delta row groups of its range, folded;
- native files, through the factory's ``restore_native`` (the backend package whose format they
  are knows how): RocksDB's opens the DB of the old subtask that overlaps it most, with the
  foreign key groups cut out (as Flink does), and inserts the rows of the range from the other
  overlapping DBs; the heap's opens every overlapping DB aside and reads its rows (the bridge).

Operator state goes through :func:`~state_engine.backends.operator_state.redistribute` by its mode.
Nothing is written to the catalog before the snapshot's ``_metadata``, files and serializers
check out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.operator_state import (
    OperatorStateBackend,
    OperatorStateMeta,
    group_by_subtask,
)
from state_engine.catalog.records import SnapshotRecord
from state_engine.checkpoint.commit import register
from state_engine.checkpoint.state import (
    NativeRestoreFactory,
    RestoredState,
    StateBackendFactory,
    SubtaskState,
)
from state_engine.errors import (
    IncompatibleSerializer,
    InvalidParallelism,
    InvalidSnapshotRequest,
    InvalidStateDescriptor,
    SerializationError,
    SnapshotNotRestorable,
    StatekeeperError,
    UnknownSerializer,
)
from state_engine.keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from state_engine.serde import (
    SerializerSnapshot,
    TypeSerializer,
    check_compatibility,
    get_serializer,
    serializer_from_snapshot,
)
from state_engine.snapshot.canonical import (
    as_table,
    read_key_groups,
    read_operator_state,
    state_columns,
)
from state_engine.snapshot.delta import read_folded_table
from state_engine.snapshot.metadata import (
    NATIVE_KINDS,
    OPERATOR_STATE_PREFIX,
    FileKind,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
    verify,
)
from state_engine.snapshot.native import BackendSpec, NativeSource
from state_engine.snapshot.registry import SharedStateRegistry
from state_engine.snapshot.storage import CheckpointStorage, ReadStats, SnapshotDir
from state_engine.snapshot_enums import SnapshotKind, SnapshotStatus
from state_engine.state.descriptors import StateKind
from state_engine.state.meta import StateMetaInfo

if TYPE_CHECKING:
    from state_engine.catalog.repository import Catalog


class RestoreContext(Protocol):
    """What a restore needs of the checkpoint manager it restores for."""

    catalog: Catalog
    storage: CheckpointStorage
    job: str
    max_parallelism: int
    registry: SharedStateRegistry
    verify_checksums: bool


def resolve_snapshot(
    manager: RestoreContext, snapshot: int | str | SnapshotRecord
) -> tuple[SnapshotRecord | None, SnapshotDir]:
    """The catalog record (None for a directory the catalog does not know) and its directory."""
    cat = manager.catalog
    if isinstance(snapshot, SnapshotRecord):
        snapshot = snapshot.id
    if snapshot == "latest":
        record = cat.latest_snapshot(manager.job)
        if record is None:
            raise SnapshotNotRestorable(
                f"job {manager.job!r} has no COMPLETED checkpoint or savepoint in the catalog; "
                "start it without state, or restore a savepoint by its directory URL"
            )
    elif isinstance(snapshot, int) and not isinstance(snapshot, bool):
        record = cat.get_snapshot(snapshot)
    elif isinstance(snapshot, str) and snapshot:
        snap = manager.storage.snapshot(snapshot)
        url = snap.url.rstrip("/")
        for r in cat.list_snapshots(manager.job):
            if r.location.rstrip("/") == url:
                return _check_status(r), _dir_of(manager, r)
        return None, snap
    else:
        raise InvalidSnapshotRequest(
            f"restore of job {manager.job!r} takes 'latest', a catalog snapshot id or a "
            f"snapshot directory URL, not {snapshot!r}"
        )
    return _check_status(record), _dir_of(manager, record)


def _check_status(record: SnapshotRecord) -> SnapshotRecord:
    if record.status is not SnapshotStatus.COMPLETED:
        fix = {
            SnapshotStatus.PENDING: "it is still being written (or its writer died): wait for "
            "it, or restore an earlier COMPLETED one",
            SnapshotStatus.FAILED: "it never completed: restore an earlier COMPLETED one",
        }.get(record.status, "its files may be gone: restore a COMPLETED one")
        raise SnapshotNotRestorable(
            f"snapshot {record.id} ({record.kind.lower()} {record.checkpoint_id} of job "
            f"{record.job!r} at {record.location}) is {record.status}, not COMPLETED; {fix} "
            f"(`statectl snapshots {record.job}` lists them)"
        )
    return record


def _dir_of(manager: RestoreContext, record: SnapshotRecord) -> SnapshotDir:
    snap = manager.storage.snapshot(record.location)
    if record.kind is SnapshotKind.SAVEPOINT:
        snap = snap.self_contained()
    return snap


def _key_serializer(op: OperatorSnapshot, given: Any, where: str) -> TypeSerializer:
    assert op.key_serializer is not None
    what = f"the key of operator {op.operator_id!r} in snapshot {where}"
    try:
        written = SerializerSnapshot.from_dict(op.key_serializer)
        if given is None:
            return serializer_from_snapshot(written)
        current = get_serializer(given)
        check_compatibility(written, current, what)
        return current
    except (UnknownSerializer, SerializationError) as exc:
        raise IncompatibleSerializer(f"{what}: {exc}") from exc


def _state_metas(
    op: OperatorSnapshot, where: str
) -> tuple[dict[str, StateMetaInfo], dict[str, OperatorStateMeta]]:
    keyed: dict[str, StateMetaInfo] = {}
    operator: dict[str, OperatorStateMeta] = {}
    for name, m in op.states.items():
        try:
            if name.startswith(OPERATOR_STATE_PREFIX):
                om = OperatorStateMeta.from_dict(m)
                for s in om.serializers.values():
                    serializer_from_snapshot(s)
                operator[om.name] = om
            else:
                keyed[name] = StateMetaInfo.from_dict(m)
        except (UnknownSerializer, IncompatibleSerializer, SerializationError) as exc:
            raise IncompatibleSerializer(
                f"state {name!r} of operator {op.operator_id!r} in snapshot {where} cannot be "
                f"read by this code: {exc}"
            ) from exc
        except (InvalidStateDescriptor, StatekeeperError) as exc:
            raise IncompatibleSerializer(
                f"state {name!r} of operator {op.operator_id!r} in snapshot {where} has "
                f"unreadable meta info: {exc}"
            ) from exc
    return keyed, operator


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore_snapshot` gives the checkpoint manager: the restored state, the
    snapshot's shared files, and per (operator uid, new subtask index) whose key-group range is
    exactly one old subtask's, that subtask's keyed files (which a CLAIM restore continues)."""

    restored: RestoredState
    shared_files: list[SnapshotFile]
    unchanged_subtask_files: dict[tuple[str, int], list[SnapshotFile]]
    #: per (operator uid, new subtask index) restored from a delta chain: the folded rows
    folded: dict[tuple[str, int], pa.Table] = field(default_factory=dict)


def restore_snapshot(
    manager: RestoreContext,
    snapshot: int | str | SnapshotRecord,
    *,
    parallelism: int,
    factory: StateBackendFactory,
    key_serializer: Any = None,
    clock: Any = None,
    subtask_indexes: Sequence[int] | None = None,
) -> RestoreResult:
    record, snap = resolve_snapshot(manager, snapshot)
    meta = read_metadata(snap)
    if record is None and meta.kind is not SnapshotKind.SAVEPOINT:
        raise SnapshotNotRestorable(
            f"{snap.url} is a checkpoint the catalog of job {manager.job!r} does not know; "
            "checkpoints reference shared files and restore through the catalog that recorded "
            "them: restore it from there, or take a savepoint"
        )
    if record is None:
        snap = snap.self_contained()
    verify(snap, meta, deep=manager.verify_checksums)
    where = snap.url
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise InvalidParallelism(
            f"restore parallelism {parallelism!r} for snapshot {where} must be an int >= 1"
        )
    if parallelism > meta.max_parallelism:
        raise InvalidParallelism(
            f"parallelism {parallelism} exceeds max parallelism {meta.max_parallelism} of "
            f"snapshot {where}; restore at {meta.max_parallelism} or less, or rescale the "
            "savepoint to a higher max parallelism offline (the rescale job)"
        )
    if meta.max_parallelism != manager.max_parallelism:
        raise InvalidParallelism(
            f"snapshot {where} has max parallelism {meta.max_parallelism}, but job "
            f"{manager.job!r} runs with {manager.max_parallelism}; max parallelism is fixed for "
            "a job's life: rescale the savepoint offline (the rescale job) first"
        )
    plans = []
    for op in meta.operators:
        given = (
            key_serializer.get(op.operator_id)
            if isinstance(key_serializer, Mapping)
            else (key_serializer)
        )
        key_ser = _key_serializer(op, given, where) if op.key_serializer is not None else None
        keyed, operator = _state_metas(op, where)
        plans.append((op, key_ser, keyed, operator))
    wanted = list(range(parallelism)) if subtask_indexes is None else list(subtask_indexes)
    if any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < parallelism for i in wanted
    ):
        raise InvalidParallelism(
            f"subtask indexes {wanted} for restoring snapshot {where} must lie in "
            f"0..{parallelism - 1} (parallelism {parallelism})"
        )
    if record is None:
        record = register_savepoint(manager, snap, meta)
    subtasks = [SubtaskState(i) for i in wanted]
    stats = [ReadStats() for _ in wanted]
    folded: dict[tuple[str, int], pa.Table] = {}
    try:
        for op, key_ser, keyed, operator in plans:
            if operator or op.operator_state_files:
                rows = read_operator_state(snap, meta, operator=op.operator_id)
                groups = group_by_subtask(rows, meta.parallelism)
                backends = OperatorStateBackend.restore_rescaled(groups, operator, parallelism)
                for st in subtasks:
                    st.operator[op.operator_id] = backends[st.subtask_index]
            if key_ser is None:
                continue
            for st, st_stats in zip(subtasks, stats, strict=True):
                rng = compute_key_group_range_for_operator_index(
                    meta.max_parallelism, parallelism, st.subtask_index
                )
                st.keyed[op.operator_id], folded_rows = _restore_keyed(
                    manager,
                    snap,
                    meta,
                    op,
                    rng,
                    st.subtask_index,
                    factory,
                    key_ser,
                    keyed,
                    clock,
                    st_stats,
                )
                if folded_rows is not None:
                    folded[(op.operator_id, st.subtask_index)] = folded_rows
    except BaseException:
        for st in subtasks:
            for b in st.keyed.values():
                with contextlib.suppress(Exception):
                    b.close()
        raise
    restored = RestoredState(record, record.checkpoint_id, subtasks, stats, snap.url)
    return RestoreResult(
        restored,
        [f for f in meta.files if f.shared],
        _unchanged_subtask_files(meta, parallelism, wanted),
        folded,
    )


def _unchanged_subtask_files(
    meta: SnapshotMetadata, parallelism: int, wanted: Sequence[int]
) -> dict[tuple[str, int], list[SnapshotFile]]:
    """The keyed files of each old subtask whose key-group range a new subtask has unchanged."""
    out: dict[tuple[str, int], list[SnapshotFile]] = {}
    for op in meta.operators:
        if op.key_serializer is None:
            continue
        by_range = {s.key_group_range: s for s in op.subtasks}
        for i in wanted:
            rng = compute_key_group_range_for_operator_index(meta.max_parallelism, parallelism, i)
            old = by_range.get((rng.start, rng.end))
            if old is not None:
                out[(op.operator_id, i)] = [meta.file(p) for p in old.files]
    return out


def register_savepoint(
    manager: RestoreContext, snap: SnapshotDir, meta: SnapshotMetadata
) -> SnapshotRecord:
    """Record a savepoint directory the catalog does not know (e.g. relocated) as COMPLETED."""
    return register(manager.catalog, manager.job, snap, meta, trigger="relocated")


def _overlap(st: SubtaskSnapshot, rng: KeyGroupRange) -> KeyGroupRange:
    return KeyGroupRange.of(*st.key_group_range).intersection(rng)


def _restore_keyed(
    manager: RestoreContext,
    snap: SnapshotDir,
    meta: SnapshotMetadata,
    op: OperatorSnapshot,
    rng: KeyGroupRange,
    index: int,
    factory: StateBackendFactory,
    key_ser: TypeSerializer,
    keyed: dict[str, StateMetaInfo],
    clock: Any,
    stats: ReadStats,
) -> tuple[KeyedStateBackend, pa.Table | None]:
    """The keyed backend of new subtask ``index`` (key groups ``rng``), and the rows a delta
    chain folded to (None for other formats)."""
    spec = BackendSpec(op.operator_id, index, key_ser, meta.max_parallelism, rng, clock)
    overlapping = [s for s in op.subtasks if not _overlap(s, rng).is_empty]
    kinds = {s.index: {meta.file(p).kind for p in s.files} for s in overlapping}
    native = [s for s in overlapping if kinds[s.index] & NATIVE_KINDS]
    rest = [s for s in overlapping if not kinds[s.index] & NATIVE_KINDS]
    if native:
        # a native format is read by the backend package that has one: its factory knows how
        if not isinstance(factory, NativeRestoreFactory):
            raise InvalidSnapshotRequest(
                f"snapshot {snap.url} holds native files of operator {op.operator_id!r}, which "
                f"{type(factory).__name__} cannot restore: restore with RocksDBBackendFactory "
                "or HeapBackendFactory (which reads them as rows)"
            )
        sources = [NativeSource(snap, meta, s, stats, manager.registry) for s in native]
        backend = factory.restore_native(spec, sources)
    else:
        backend = factory.create(*spec)
    folded = None
    try:
        canonical_files: list[SnapshotFile] = []
        # A delta snapshot is folded whole: read_folded_table reads every subtask's base (a
        # subtask that changed nothing since the base has no delta file, only its base) with
        # every chain. Its subtasks' base files are not read again on their own: list states
        # would come back doubled.
        delta = any(FileKind.DELTA in kinds[s.index] for s in rest)
        if not delta:
            canonical_files.extend(
                meta.file(p) for s in rest for p in s.files if meta.file(p).kind is FileKind.KEYED
            )
        # a rescaled snapshot lists a file that straddles two subtasks' ranges under both
        canonical_files = list(dict.fromkeys(canonical_files))
        if canonical_files:
            batches = read_key_groups(
                snap, meta, (rng.start, rng.end), files=canonical_files, stats=stats
            )
            # batch by batch: a RocksDB backend restores state larger than memory
            columns = (c for b in batches for c in state_columns(as_table([b])))
            backend.restore_columns(columns, keyed)
        if delta:
            folded = read_folded_table(
                snap, meta, (rng.start, rng.end), operator=op.operator_id, stats=stats
            )
            # the fold keeps chain order within a key group: list elements need position order
            lists = [name for name, m in keyed.items() if m.kind is StateKind.LIST]
            backend.restore_columns(state_columns(folded, lists), keyed)
        if not canonical_files and not delta:
            backend.restore_entries((), keyed)
    except BaseException:
        backend.close()
        raise
    return backend, folded
