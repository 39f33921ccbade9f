"""What every snapshot strategy writes with, and the canonical strategy every backend has.

A strategy (the :class:`~state_engine.backends.base.SnapshotStrategy` protocol, as Flink's
``SnapshotStrategy``) has two phases: ``capture`` runs on the task thread at the barrier and only
fixes a consistent view; :meth:`Capture.write_files` writes the files while processing continues
(on the checkpoint thread, or for heap views on local storage in a child forked at the barrier,
see :mod:`forked`); :meth:`Capture.result` then describes them for ``_metadata`` and the catalog.

Here: the backend-independent parts (:class:`WriteContext`, :class:`SubtaskResult`, the
:class:`Capture` base) and :class:`CanonicalSnapshotStrategy`, a full canonical Parquet of any
backend's view. A backend's own formats live in its package: the heap delta strategy in
``backends/heap/snapshot.py``, RocksDB's native incremental one in ``backends/rocksdb/snapshot.py``;
``KeyedStateBackend.snapshot_strategy`` names the one a format asks for.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from state_engine.checkpoint.canonical import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_ROW_GROUP_BYTES,
    CanonicalWriter,
    KeyGroupStats,
    WrittenFiles,
)
from state_engine.checkpoint.metadata import SnapshotFile
from state_engine.checkpoint.registry import SharedStateRegistry
from state_engine.checkpoint.storage import SHARED_DIR, SnapshotDir
from state_engine.errors import SnapshotCancelled
from state_engine.snapshot_enums import SnapshotFormat

if TYPE_CHECKING:
    from state_engine.backends.base import KeyedStateBackend, KeyedStateView

#: where a snapshot's shared files sit, relative to its directory
SHARED_PREFIX = f"../{SHARED_DIR}/"
#: what a capture's ``write_files`` returns and its ``result`` reads
W = TypeVar("W")


@dataclass
class WriteContext:
    """Where and how the asynchronous phase writes one snapshot."""

    snapshot: SnapshotDir
    checkpoint_id: int
    savepoint: bool
    incremental: bool
    cancelled: threading.Event
    registry: SharedStateRegistry
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    #: incremental strategies start a new base after this many increments
    full_every: int = 8
    #: an increment may continue the chain of a checkpoint still in flight (which it then
    #: depends on) rather than the last completed one's; see ``backends/heap/snapshot.py``
    chain_in_flight: bool = False
    #: files this snapshot created (relative paths), removed again if it fails or is cancelled
    created: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise SnapshotCancelled(
                f"snapshot {self.snapshot.url} (checkpoint {self.checkpoint_id}) was cancelled "
                "before it completed; nothing of it is kept: trigger a new one"
            )


@dataclass
class SubtaskResult:
    """What one keyed backend's snapshot consists of."""

    operator_uid: str
    subtask_index: int
    key_group_range: tuple[int, int]
    files: list[SnapshotFile]
    key_group_stats: dict[int, KeyGroupStats]
    bytes_written: int
    files_reused: int = 0
    #: called on the task thread once the snapshot completed (heap delta: the backend forgets
    #: the confirmed changes and the strategy continues the chain from these files)
    on_complete: Callable[[], None] | None = None


class Capture(ABC, Generic[W]):
    """The synchronous part of one backend's snapshot: a fixed view, released after writing."""

    def __init__(self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend) -> None:
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.backend = backend
        r = backend.key_group_range
        self.key_group_range = (r.start, r.end)
        self.max_parallelism = backend.max_parallelism
        self.key_serializer = backend.key_serializer.snapshot().to_dict()
        self.states: dict[str, dict[str, Any]] = {}

    @property
    def forkable(self) -> bool:
        """``write_files`` only reads a fork-safe view and writes files: it may run in a forked
        child."""
        return False

    def prepare(self, ctx: WriteContext) -> None:  # noqa: B027 - most captures need none
        """Asynchronous phase, before any file is written (in this process)."""

    @abstractmethod
    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> W:
        """Write the files, reporting each path to ``opened`` before creating it; returns
        what :meth:`result` needs (picklable when :attr:`forkable`)."""

    @abstractmethod
    def result(self, ctx: WriteContext, written: W) -> SubtaskResult:
        """What the snapshot consists of, from what :meth:`write_files` returned."""

    def still_valid(self, ctx: WriteContext) -> bool:
        """After a forked write: whether what the files build on still exists."""
        return True

    @abstractmethod
    def release(self) -> None: ...

    def abandon(self) -> None:  # noqa: B027 - most captures need nothing
        """Its snapshot failed or was cancelled (called on the checkpoint thread, or on the
        task thread when the synchronous phase itself failed)."""

    def _writer(
        self,
        ctx: WriteContext,
        directory: str = "",
        chain_index: int | None = None,
        on_open: Callable[[str], None] | None = None,
        writer: type[CanonicalWriter] = CanonicalWriter,
    ) -> CanonicalWriter:
        return writer(
            ctx.snapshot,
            subtask=self.subtask_index,
            max_parallelism=self.max_parallelism,
            key_group_range=self.key_group_range,
            directory=directory,
            row_group_bytes=ctx.row_group_bytes,
            chain_index=chain_index,
            on_open=on_open,
        )


class CanonicalCapture(Capture[WrittenFiles]):
    def __init__(
        self,
        operator_uid: str,
        subtask_index: int,
        backend: KeyedStateBackend,
        view: KeyedStateView,
        directory: str = "",
    ) -> None:
        super().__init__(operator_uid, subtask_index, backend)
        self.view = view
        self.directory = directory
        self.states = {n: m.to_dict() for n, m in view.states.items()}

    @property
    def forkable(self) -> bool:
        return self.view.fork_safe

    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> WrittenFiles:
        with self._writer(ctx, self.directory, on_open=opened) as writer:
            for columns in self.view.entry_columns(DEFAULT_BATCH_ROWS):
                writer.write_columns(columns)
                ctx.check()
        return writer.finish()

    def result(self, ctx: WriteContext, written: WrittenFiles) -> SubtaskResult:
        return SubtaskResult(
            self.operator_uid,
            self.subtask_index,
            self.key_group_range,
            list(written.files),
            written.key_group_stats,
            written.bytes,
        )

    def release(self) -> None:
        self.view.release()


class CanonicalSnapshotStrategy:
    """A full canonical snapshot of any backend's view (the default for every format a backend
    has no strategy of its own for)."""

    format = SnapshotFormat.CANONICAL

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> CanonicalCapture:
        view = self.backend.snapshot_view()
        return CanonicalCapture(operator_uid, subtask_index, self.backend, view)
