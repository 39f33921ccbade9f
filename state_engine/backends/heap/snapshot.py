"""Heap incremental checkpoints: delta files of changed keys on a canonical base.

Each change-tracking heap backend owns one :class:`DeltaSnapshotStrategy`, which keeps the chain
of the backend's last confirmed checkpoint: its base files and its deltas, all under ``shared/`` so
later checkpoints reference them. A checkpoint writes either a new base (no chain yet, the chain
holds ``full_every`` deltas, or the checkpoint is not incremental) from a full view, or one delta
from an incremental view: the map entries changed on their own, the values written, every other
changed (state, key, namespace) as a CLEAR followed by PUTs of its complete current rows (see
:mod:`state_engine.snapshot.delta` and ``HeapStateView.delta_columns``).

Checkpoints may overlap (``max_concurrent_checkpoints``): each delta builds on the last
*confirmed* chain and holds every change not confirmed yet, so it does not depend on a checkpoint
still in flight. While one in flight writes a new base, the next extends the old chain instead of
writing the whole state a second time.

After a restore in CLAIM mode the strategy continues the restored chain. When the restore folded
that chain (a chain with deltas), it keeps the folded rows: the first checkpoint then writes them
as a new base, as they are (no walk over the heap, no serializing), plus one delta of what changed
since the restore. The restored chain is compacted once, cheaply, instead of growing to
``full_every`` deltas and then being rewritten from the heap.

The backend forgets changes only when the checkpoint completed: the result's ``on_complete`` runs
on the task thread (``CheckpointManager.notify_checkpoint_complete``), confirms the view and makes
the written chain the one to continue. The changes of a failed or cancelled checkpoint are carried
into the next delta.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from state_engine.errors import CheckpointError
from state_engine.faults import crash_point
from state_engine.snapshot.canonical import (
    DEFAULT_BATCH_ROWS,
    KeyGroupStats,
    WrittenFiles,
    arrow_array,
)
from state_engine.snapshot.delta import DELTA_SCHEMA, DeltaWriter
from state_engine.snapshot.metadata import FileKind, SnapshotFile
from state_engine.snapshot.storage import SHARED_PREFIX
from state_engine.snapshot.strategy import (
    Capture,
    SnapshotSource,
    SubtaskResult,
    WriteContext,
)
from state_engine.snapshot_enums import SnapshotFormat

if TYPE_CHECKING:
    from state_engine.backends.heap.view import HeapStateView
    from state_engine.state.meta import StateMetaInfo


#: restored rows above this size are not kept for the first checkpoint's base (the heap holds
#: the state already; a second copy in Arrow must stay small next to it)
RESTORED_BASE_MAX_BYTES = 256 << 20


class ChangeTrackingBackend(SnapshotSource, Protocol):
    """What the delta strategy uses of its heap backend (one with ``track_changes``)."""

    @property
    def confirmed_view_id(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def snapshot_view(self, incremental: bool = False, since: int = 0) -> HeapStateView: ...

    def registered_states(self) -> Mapping[str, StateMetaInfo]: ...

    def confirm_view(self, view_id: int) -> None: ...

    def forget_changes(self) -> None: ...


@dataclass(frozen=True)
class Chain:
    """The files a subtask's last confirmed checkpoint consists of: base, then deltas."""

    base: tuple[SnapshotFile, ...]
    deltas: tuple[tuple[SnapshotFile, ...], ...]

    @property
    def files(self) -> list[SnapshotFile]:
        return [*self.base, *(f for d in self.deltas for f in d)]

    @property
    def next_index(self) -> int:
        """The chain index of a delta on this chain (an empty delta writes no file, so indexes
        may skip one; they only increase)."""
        return (self.deltas[-1][0].chain_index or 0) + 1 if self.deltas else 1


class DeltaCapture(Capture[WrittenFiles]):
    def __init__(
        self,
        operator_uid: str,
        subtask_index: int,
        backend: ChangeTrackingBackend,
        view: HeapStateView,
        chain: Chain | None,
        strategy: DeltaSnapshotStrategy,
        ctx: WriteContext,
        prev: DeltaCapture | None = None,
        base_rows: pa.Table | None = None,
    ) -> None:
        super().__init__(operator_uid, subtask_index, backend)
        self.view = view
        # read now: in a forked snapshot the view is released before the result is built
        self.view_id = view.view_id
        self.chain = chain  # None (and no prev): this checkpoint writes a new base
        self.strategy = strategy
        self.ctx = ctx
        #: the capture of a checkpoint still in flight whose chain this delta continues (its
        #: view holds only the changes after that one's); its chain is known once it wrote
        self.prev = prev
        #: canonical rows written as a new base under this capture's delta (the state a claimed
        #: restore folded; the view then holds the changes since): the chain is compacted
        self.base_rows = base_rows
        self.index: int  # the chain index it writes; 0: a base
        if prev is not None:
            self.index = prev.index + 1
        elif base_rows is not None:
            self.index = 1
        else:
            self.index = 0 if chain is None else chain.next_index
        self._base_files: tuple[SnapshotFile, ...] = ()  # the files of base_rows, once written
        self.new_chain: Chain | None = None  # set by result()
        self.failed = False  # set when its checkpoint failed
        self.states = {n: m.to_dict() for n, m in view.states.items()}

    @property
    def forkable(self) -> bool:
        return self.view.fork_safe

    @property
    def writes_base(self) -> bool:
        return self.index == 0 or self.base_rows is not None

    def prepare(self, ctx: WriteContext) -> None:
        prev = self.prev
        if prev is not None and not prev.settled:
            return  # forked at the barrier while prev writes: checked once written (still_valid)
        if not self.still_valid(ctx):
            # the chain's files were released meanwhile (its checkpoint was subsumed before this
            # one started writing), or the checkpoint it continues failed: the view still holds
            # the full state, so write a new base
            self.chain, self.prev, self.index = None, None, 0

    @property
    def settled(self) -> bool:
        """Its checkpoint wrote its files or failed (or was cancelled)."""
        return self.new_chain is not None or self.failed or self.ctx.cancelled.is_set()

    def _base_chain(self) -> Chain | None:
        if self.base_rows is not None:
            return Chain(self._base_files, ())
        return self.prev.new_chain if self.prev is not None else self.chain

    def still_valid(self, ctx: WriteContext) -> bool:
        if self.prev is not None and (self.prev.failed or self.prev.new_chain is None):
            return False  # the checkpoint this delta continues failed
        chain = self._base_chain()
        return chain is None or all(ctx.registry.lookup(f.path) is not None for f in chain.files)

    def abandon(self) -> None:
        self.failed = True

    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> WrittenFiles:
        shared = SHARED_PREFIX.rstrip("/")
        if self.index == 0:
            with self._writer(ctx, shared, on_open=opened) as writer:
                for columns in self.view.entry_columns(DEFAULT_BATCH_ROWS):
                    writer.write_columns(columns)
                    ctx.check()
            return writer.finish()
        base = None
        if self.base_rows is not None:
            with self._writer(ctx, shared, on_open=opened) as writer:
                for batch in self.base_rows.to_batches(DEFAULT_BATCH_ROWS):
                    writer.write_batch(batch)
                    ctx.check()
            base = writer.finish()
        with self._writer(ctx, shared, self.index, on_open=opened, writer=DeltaWriter) as delta:
            for batch in _delta_batches(self.view, ctx):
                delta.write_batch(batch)
        written = delta.finish()
        return written if base is None else _both(base, written)

    def result(self, ctx: WriteContext, written: WrittenFiles) -> SubtaskResult:
        if self.base_rows is not None:
            self._base_files = tuple(f for f in written.files if f.kind is FileKind.KEYED)
            written = WrittenFiles(
                tuple(f for f in written.files if f.kind is not FileKind.KEYED),
                written.key_group_stats,
            )
        if self.index == 0:
            new = Chain(written.files, ())
        else:
            chain = self._base_chain()
            if chain is None:
                raise CheckpointError(
                    f"checkpoint {ctx.checkpoint_id}: the checkpoint whose chain subtask "
                    f"{self.subtask_index}'s delta continues failed; the next one covers its "
                    "changes"
                )
            deltas = chain.deltas + ((written.files,) if written.files else ())
            new = Chain(chain.base, deltas)
        self.new_chain = new
        crash_point("checkpoint.delta.after_write")
        fresh = len(written.files) + len(self._base_files)
        return SubtaskResult(
            self.operator_uid,
            self.subtask_index,
            self.key_group_range,
            new.files,
            written.key_group_stats,
            written.bytes + sum(f.size for f in self._base_files),
            files_reused=len(new.files) - fresh,
            on_complete=functools.partial(
                self.strategy.confirm, new, self.view_id, self.states if self.writes_base else None
            ),
        )

    def release(self) -> None:
        self.view.release()


def _written_alike(
    written: Mapping[str, dict[str, Any]] | None, now: Mapping[str, dict[str, Any]]
) -> bool:
    """Whether rows written with the states ``written`` (as in ``_metadata``) and rows written
    now read alike: no state's meta changed (states added since are no conflict)."""
    return written is None or all(now.get(n, m) == m for n, m in written.items())


def _both(base: WrittenFiles, delta: WrittenFiles) -> WrittenFiles:
    """A new base and the delta on it as one write; key-group statistics are what both wrote."""
    stats = dict(base.key_group_stats)
    for kg, st in delta.key_group_stats.items():
        had = stats.get(kg)
        stats[kg] = st if had is None else KeyGroupStats(had.rows + st.rows, had.bytes + st.bytes)
    return WrittenFiles(base.files + delta.files, stats)


def _delta_batches(view: HeapStateView, ctx: WriteContext) -> Iterator[pa.RecordBatch]:
    """The view's changes as delta record batches (see ``HeapStateView.delta_columns``); ``seq``
    numbers the rows in order."""
    seq = 0
    for cols in view.delta_columns(DEFAULT_BATCH_ROWS):
        n = len(cols["op"])
        arrays = [
            arrow_array(np.asarray(cols["key_group"], dtype=np.int32)),
            *(
                arrow_array(cols[f.name], f.type)
                for f in DELTA_SCHEMA
                if f.name not in ("key_group", "op", "seq")
            ),
            arrow_array(np.asarray(cols["op"], dtype=np.int8)),
            arrow_array(np.arange(seq + 1, seq + n + 1, dtype=np.int64)),
        ]
        seq += n
        yield pa.RecordBatch.from_arrays(arrays, schema=DELTA_SCHEMA)
        ctx.check()


class DeltaSnapshotStrategy:
    """The delta strategy of one change-tracking heap backend, and the chain it continues (the
    last confirmed checkpoint's files; None until one completed)."""

    format = SnapshotFormat.DELTA

    def __init__(self, backend: ChangeTrackingBackend) -> None:
        self.backend = backend
        self.chain: Chain | None = None
        #: the view of the newest capture that writes a new base (0: none yet)
        self._base_view = 0
        #: the newest capture (its checkpoint may be in flight)
        self._pending: DeltaCapture | None = None
        #: the rows a claimed restore folded the chain to: the next checkpoint writes them as a
        #: new base (until one completes)
        self._restored: pa.Table | None = None
        self._compacting: DeltaCapture | None = None  # the newest capture writing them
        #: the states (as in _metadata) the chain's files were written with; a delta must not
        #: continue rows of a state whose serializers changed since (None: no chain yet)
        self._chain_states: dict[str, dict[str, Any]] | None = None

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> DeltaCapture:
        chain = self.chain
        confirmed = self.backend.confirmed_view_id
        # With ctx.chain_in_flight, a delta continues the chain of the newest checkpoint still
        # in flight (if that one continues a completed checkpoint): it holds only the changes
        # since, and fails if that one fails. Otherwise it continues the last confirmed chain
        # with every change not confirmed yet, whatever happens to those in flight.
        prev = self._pending if ctx.incremental and ctx.chain_in_flight else None
        states = {n: m.to_dict() for n, m in self.backend.registered_states().items()}
        if prev is not None and (
            prev.view_id <= confirmed
            or prev.settled
            or (prev.prev is not None and prev.prev.view_id > confirmed)
            or not _written_alike(prev.states, states)
        ):
            prev = None
        if prev is not None and prev.index < ctx.full_every:
            view = self.backend.snapshot_view(incremental=True, since=prev.view_id)
            capture = DeltaCapture(
                operator_uid, subtask_index, self.backend, view, None, self, ctx, prev
            )
        else:
            # A chain at full_every deltas gets a new base, unless a checkpoint still in flight
            # (newer than the last confirmed view) writes one: this one extends the chain
            # meanwhile rather than write the whole state twice. If that base fails, the next
            # confirmed view is newer and the next capture writes it. After a claimed restore,
            # the restored rows are the new base until a checkpoint completes (_compaction).
            # A state registered since with serializers that read the chain's rows only after
            # migrating them (a restore's value serializer change) starts a new base too.
            base_in_flight = self._base_view > confirmed
            alike = _written_alike(self._chain_states, states)
            if not alike:
                self._restored = None
            rows = self._compaction(ctx, chain)
            if rows is None and (
                not ctx.incremental
                or chain is None
                or not alike
                or (len(chain.deltas) >= ctx.full_every and not base_in_flight)
            ):
                chain = None
            view = self.backend.snapshot_view(incremental=chain is not None)
            capture = DeltaCapture(
                operator_uid, subtask_index, self.backend, view, chain, self, ctx, None, rows
            )
        if capture.writes_base:
            self._base_view = view.view_id
        if capture.base_rows is not None:
            self._compacting = capture
        self._pending = capture
        return capture

    def _compaction(self, ctx: WriteContext, chain: Chain | None) -> pa.Table | None:
        """The restored rows to write as this capture's new base, or None."""
        rows = self._restored
        if rows is None or not ctx.incremental or chain is None:
            return None
        last = self._compacting
        if last is not None and not last.failed and not last.ctx.cancelled.is_set():
            return None  # a checkpoint in flight writes them: this one extends the chain
        return rows

    def claim(self, files: Sequence[SnapshotFile], rows: pa.Table | None = None) -> bool:
        """Continue the chain of a restored checkpoint the job claimed: ``files`` are one old
        subtask's base and deltas, and the backend was restored from exactly them, so the
        changes the restore recorded are dropped and the next delta holds only what changes
        from here. Files of another format (canonical, RocksDB) leave the strategy as it was.

        ``rows``: the canonical rows the restore folded those files to. When the chain has
        deltas and no state has TTL (whose expired rows a base written from the heap would
        drop), the next checkpoint writes them as its new base (see the module doc)."""
        base = tuple(f for f in files if f.kind is FileKind.KEYED)
        deltas = [f for f in files if f.kind is FileKind.DELTA]
        if (
            not base
            or len(base) + len(deltas) != len(files)
            or not all(f.shared for f in files)
            or any(f.chain_index is None for f in deltas)
        ):
            return False
        by_index: dict[int, list[SnapshotFile]] = {}
        for f in deltas:
            by_index.setdefault(f.chain_index or 0, []).append(f)
        self.chain = Chain(base, tuple(tuple(by_index[i]) for i in sorted(by_index)))
        self.backend.forget_changes()
        self._restored = self._compacting = None
        states = self.backend.registered_states()
        self._chain_states = {n: m.to_dict() for n, m in states.items()}
        if (
            rows is not None
            and deltas
            and rows.nbytes <= RESTORED_BASE_MAX_BYTES
            and all(m.ttl is None for m in states.values())
        ):
            self._restored = rows
        return True

    def confirm(
        self, chain: Chain, view_id: int, base_states: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """On the task thread: the checkpoint that wrote ``chain`` completed; it is the new base
        and the backend forgets the changes up to its view. ``base_states``: the states its
        new base was written with (None: it continued the chain's base)."""
        if not self.backend.closed:
            self.backend.confirm_view(view_id)
        self.chain = chain
        if base_states is not None:
            self._chain_states = base_states
        self._restored = self._compacting = None  # the state moved on from the restored rows
