"""Heap incremental checkpoints: delta files of changed keys on a canonical base.

Per (operator, subtask) the manager keeps the chain of the last confirmed checkpoint: its base
files and its deltas, all under ``shared/`` so later checkpoints reference them. A checkpoint
writes either a new base (no chain yet, the chain holds ``full_every`` deltas or deltas as large
as its base, or the backend was replaced) from a full view, or one delta from an incremental
view: every changed (state, key, namespace) as a CLEAR followed by PUTs of its complete current
rows (see :mod:`delta`).

The backend forgets changes only on ``confirm_view``, which runs on the task thread
(``notify_checkpoint_complete``) after the checkpoint completed; the changes of a failed or
cancelled checkpoint are carried into the next delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from state_engine.backends.base import KeyedStateBackend, KeyedStateView
from state_engine.checkpoint.canonical import WrittenFiles
from state_engine.checkpoint.delta import CLEAR, PUT, DeltaWriter
from state_engine.checkpoint.metadata import SnapshotFile
from state_engine.checkpoint.strategies import (
    SHARED_PREFIX,
    Capture,
    SnapshotStrategy,
    SubtaskResult,
    WriteContext,
)
from state_engine.faults import crash_point
from state_engine.snapshot_enums import SnapshotFormat

if TYPE_CHECKING:
    from state_engine.checkpoint.manager import CheckpointManager


@dataclass(frozen=True)
class Chain:
    """The files a subtask's last confirmed checkpoint consists of: base, then deltas."""

    backend_id: int
    base: tuple[SnapshotFile, ...]
    deltas: tuple[tuple[SnapshotFile, ...], ...]

    @property
    def files(self) -> list[SnapshotFile]:
        return [*self.base, *(f for d in self.deltas for f in d)]


class DeltaCapture(Capture):
    def __init__(
        self,
        operator_uid: str,
        subtask_index: int,
        backend: KeyedStateBackend,
        view: KeyedStateView,
        chain: Chain | None,
    ) -> None:
        super().__init__(operator_uid, subtask_index, backend)
        self.view = view
        self.chain = chain  # None: this checkpoint writes a new base
        self.view_id: int = view.view_id  # type: ignore[attr-defined]
        self.states = {n: m.to_dict() for n, m in view.states.items()}

    @property
    def forkable(self) -> bool:  # type: ignore[override]
        return self.view.fork_safe

    def prepare(self, ctx: WriteContext) -> None:
        if not self.still_valid(ctx):
            # the chain's files were released meanwhile (its checkpoint was subsumed before this
            # one started writing): the view still holds the full state, so write a new base
            self.chain = None

    def still_valid(self, ctx: WriteContext) -> bool:
        return self.chain is None or all(
            ctx.registry.lookup(f.path) is not None for f in self.chain.files
        )

    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> WrittenFiles:
        shared = SHARED_PREFIX.rstrip("/")
        if self.chain is None:
            with self._writer(ctx, shared, on_open=opened) as writer:
                writer.write(ctx.guarded(self.view.iter_entries()))
            return writer.finish()
        index = len(self.chain.deltas) + 1
        with self._writer(ctx, shared, index, on_open=opened, writer=DeltaWriter) as delta:
            delta.write(ctx.guarded(_delta_rows(self.view)))
        return delta.finish()

    def result(self, ctx: WriteContext, written: WrittenFiles) -> SubtaskResult:
        chain = self.chain
        if chain is None:
            new = Chain(id(self.backend), written.files, ())
        else:
            deltas = chain.deltas + ((written.files,) if written.files else ())
            new = Chain(chain.backend_id, chain.base, deltas)
        crash_point("checkpoint.delta.after_write")
        result = SubtaskResult(
            self.operator_uid,
            self.subtask_index,
            self.key_group_range,
            new.files,
            written.key_group_stats,
            written.bytes,
            files_reused=len(new.files) - len(written.files),
        )
        result.chain = [new, self.backend, self.view_id]  # type: ignore[assignment]
        return result

    def release(self) -> None:
        self.view.release()


def _delta_rows(view: KeyedStateView) -> Iterator[tuple[Any, ...]]:
    seq = 0
    for ck in view.changed():  # type: ignore[attr-defined]
        seq += 1
        head = (ck.key_group, ck.key_hash, ck.key, ck.namespace, ck.state)
        yield (*head, None, b"", None, CLEAR, seq)
        for r in ck.rows:
            seq += 1
            yield (*r, PUT, seq)


class DeltaSnapshotStrategy(SnapshotStrategy):
    format = SnapshotFormat.DELTA

    def __init__(self, manager: CheckpointManager, checkpoint_id: int, incremental: bool) -> None:
        self.manager = manager
        self.checkpoint_id = checkpoint_id
        self.incremental = incremental

    def capture(
        self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend
    ) -> DeltaCapture:
        tracking = bool(getattr(backend, "track_changes", False))
        chain: Chain | None = self.manager._chains.get((operator_uid, subtask_index))
        if (
            not self.incremental
            or not tracking
            or chain is None
            or chain.backend_id != id(backend)
            or len(chain.deltas) >= self.manager.full_every
        ):
            chain = None
        view = backend.snapshot_view(incremental=chain is not None)  # type: ignore[call-arg]
        return DeltaCapture(operator_uid, subtask_index, backend, view, chain)


def confirm(manager: CheckpointManager, result: SubtaskResult) -> None:
    """On the task thread: the checkpoint of ``result`` completed; its chain is the new base."""
    chain, backend, view_id = result.chain  # type: ignore[misc]
    if getattr(backend, "track_changes", False) and not getattr(backend, "_closed", False):
        backend.confirm_view(view_id)
    manager._chains[(result.operator_uid, result.subtask_index)] = chain
