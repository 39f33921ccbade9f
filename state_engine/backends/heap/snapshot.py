"""Heap incremental checkpoints: delta files of changed keys on a canonical base.

Each change-tracking heap backend owns one :class:`DeltaSnapshotStrategy`, which keeps the chain
of the backend's last confirmed checkpoint: its base files and its deltas, all under ``shared/`` so
later checkpoints reference them. A checkpoint writes either a new base (no chain yet, the chain
holds ``full_every`` deltas, or the checkpoint is not incremental) from a full view, or one delta
from an incremental view: the map entries changed on their own, the values written, every other
changed (state, key, namespace) as a CLEAR followed by PUTs of its complete current rows (see
:mod:`state_engine.checkpoint.delta` and ``HeapStateView.delta_columns``).

Checkpoints may overlap (``max_concurrent_checkpoints``): each delta builds on the last
*confirmed* chain and holds every change not confirmed yet, so it does not depend on a checkpoint
still in flight. While one in flight writes a new base, the next extends the old chain instead of
writing the whole state a second time.

The backend forgets changes only when the checkpoint completed: the result's ``on_complete`` runs
on the task thread (``CheckpointManager.notify_checkpoint_complete``), confirms the view and makes
the written chain the one to continue. The changes of a failed or cancelled checkpoint are carried
into the next delta.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from state_engine.checkpoint.canonical import (
    DEFAULT_BATCH_ROWS,
    KEYED_SCHEMA,
    WrittenFiles,
    arrow_array,
)
from state_engine.checkpoint.delta import DELTA_SCHEMA, DeltaWriter
from state_engine.checkpoint.metadata import SnapshotFile
from state_engine.checkpoint.strategies import (
    SHARED_PREFIX,
    Capture,
    SubtaskResult,
    WriteContext,
)
from state_engine.errors import CheckpointError
from state_engine.faults import crash_point
from state_engine.snapshot_enums import SnapshotFormat

if TYPE_CHECKING:
    from state_engine.backends.heap.backend import HeapKeyedStateBackend, HeapStateView


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
        backend: HeapKeyedStateBackend,
        view: HeapStateView,
        chain: Chain | None,
        strategy: DeltaSnapshotStrategy,
        ctx: WriteContext,
        prev: DeltaCapture | None = None,
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
        self.index: int  # the chain index it writes; 0: a base
        if prev is not None:
            self.index = prev.index + 1
        else:
            self.index = 0 if chain is None else chain.next_index
        self.new_chain: Chain | None = None  # set by result()
        self.failed = False  # set when its checkpoint failed
        self.states = {n: m.to_dict() for n, m in view.states.items()}

    @property
    def forkable(self) -> bool:
        return self.view.fork_safe

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
                for batch in _base_batches(self.view, ctx):
                    writer.write_batch(batch)
            return writer.finish()
        with self._writer(ctx, shared, self.index, on_open=opened, writer=DeltaWriter) as delta:
            for batch in _delta_batches(self.view, ctx):
                delta.write_batch(batch)
        return delta.finish()

    def result(self, ctx: WriteContext, written: WrittenFiles) -> SubtaskResult:
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
        return SubtaskResult(
            self.operator_uid,
            self.subtask_index,
            self.key_group_range,
            new.files,
            written.key_group_stats,
            written.bytes,
            files_reused=len(new.files) - len(written.files),
            on_complete=functools.partial(self.strategy.confirm, new, self.view_id),
        )

    def release(self) -> None:
        self.view.release()


def _base_batches(view: HeapStateView, ctx: WriteContext) -> Iterator[pa.RecordBatch]:
    """The view's entries as canonical record batches (see ``HeapStateView.entry_columns``)."""
    for cols in view.entry_columns(DEFAULT_BATCH_ROWS):
        arrays = [
            arrow_array(np.asarray(cols["key_group"], dtype=np.int32)),
            *(arrow_array(cols[f.name], f.type) for f in KEYED_SCHEMA if f.name != "key_group"),
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=KEYED_SCHEMA)
        ctx.check()


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

    def __init__(self, backend: HeapKeyedStateBackend) -> None:
        self.backend = backend
        self.chain: Chain | None = None
        #: the view of the newest capture that writes a new base (0: none yet)
        self._base_view = 0
        #: the newest capture (its checkpoint may be in flight)
        self._pending: DeltaCapture | None = None

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> DeltaCapture:
        chain = self.chain
        confirmed = self.backend.confirmed_view_id
        # With ctx.chain_in_flight, a delta continues the chain of the newest checkpoint still
        # in flight (if that one continues a completed checkpoint): it holds only the changes
        # since, and fails if that one fails. Otherwise it continues the last confirmed chain
        # with every change not confirmed yet, whatever happens to those in flight.
        prev = self._pending if ctx.incremental and ctx.chain_in_flight else None
        if prev is not None and (
            prev.view_id <= confirmed
            or prev.settled
            or (prev.prev is not None and prev.prev.view_id > confirmed)
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
            # confirmed view is newer and the next capture writes it.
            base_in_flight = self._base_view > confirmed
            if (
                not ctx.incremental
                or chain is None
                or (len(chain.deltas) >= ctx.full_every and not base_in_flight)
            ):
                chain = None
            view = self.backend.snapshot_view(incremental=chain is not None)
            capture = DeltaCapture(
                operator_uid, subtask_index, self.backend, view, chain, self, ctx
            )
        if capture.index == 0:
            self._base_view = view.view_id
        self._pending = capture
        return capture

    def confirm(self, chain: Chain, view_id: int) -> None:
        """On the task thread: the checkpoint that wrote ``chain`` completed; it is the new base
        and the backend forgets the changes up to its view."""
        if not self.backend.closed:
            self.backend.confirm_view(view_id)
        self.chain = chain
