"""How a keyed backend's state becomes snapshot files: the strategy protocol, what its two
phases write with, and the canonical strategy every backend has.

A strategy (Flink's ``SnapshotStrategy``) has two phases: ``capture`` runs on the task thread at the
barrier and only fixes a consistent view; :meth:`Capture.write_files` writes the files while
processing continues (on the checkpoint thread, or for heap views on local storage in a child
forked at the barrier, see ``checkpoint/forked.py``); :meth:`Capture.result` then describes them
for ``_metadata`` and the catalog. A backend's own formats live in its package (the heap delta
strategy, RocksDB's native one); ``snapshot_strategy(format)`` of a backend names the one a format
asks for. This layer knows backends only through the protocols below.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from state_engine.errors import SnapshotCancelled
from state_engine.keygroups import KeyGroupRange
from state_engine.serde import TypeSerializer
from state_engine.snapshot.canonical import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_ROW_GROUP_BYTES,
    CanonicalWriter,
    KeyGroupStats,
    WrittenFiles,
)
from state_engine.snapshot.metadata import SnapshotFile
from state_engine.snapshot.registry import SharedStateRegistry
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat
from state_engine.state.meta import StateMetaInfo

if TYPE_CHECKING:
    import pyarrow as pa

#: what a capture's ``write_files`` returns and its ``result`` reads
W = TypeVar("W")


class SnapshotSource(Protocol):
    """What a capture reads of the keyed backend it snapshots (every keyed backend has it)."""

    key_group_range: KeyGroupRange
    max_parallelism: int
    key_serializer: TypeSerializer


class StateView(Protocol):
    """A point-in-time view of a backend's keyed state, as a canonical snapshot reads it
    (``KeyedStateView`` of the backends)."""

    #: Plain Python objects only: a forked child may read the view.
    fork_safe: bool

    @property
    def states(self) -> Mapping[str, StateMetaInfo]: ...

    def entry_columns(self, batch_rows: int) -> Iterator[dict[str, list[Any]]]: ...

    def release(self) -> None: ...


class ViewSource(SnapshotSource, Protocol):
    """A backend that fixes a :class:`StateView` of its state (every keyed backend can)."""

    def snapshot_view(self) -> StateView: ...


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

    def __init__(self, operator_uid: str, subtask_index: int, backend: SnapshotSource) -> None:
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


class SnapshotStrategy(Protocol):
    """How one backend's keyed state becomes snapshot files; each strategy object belongs to one
    backend.

    :meth:`capture` runs on the task thread at the barrier and only fixes a consistent view; the
    returned capture's ``write_files`` then writes the files asynchronously (checkpoint thread or
    a forked child) and its ``result`` describes them for ``_metadata`` and the catalog, with an
    optional ``on_complete`` the manager calls on the task thread once the snapshot completed.
    """

    @property
    def format(self) -> SnapshotFormat:
        """The format its files are recorded as in ``_metadata``."""

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> Capture[Any]:
        """Fix the view of the strategy's backend (task thread, short)."""


@runtime_checkable
class ClaimingStrategy(SnapshotStrategy, Protocol):
    """A :class:`SnapshotStrategy` whose next checkpoint can build on a restored one.

    After a restore in CLAIM mode (the job owns the restored checkpoint, as after a failover in
    Flink), a subtask whose key-group range did not change holds exactly the state one old subtask
    wrote. An incremental strategy then continues from that subtask's files instead of writing
    the whole state again at the first checkpoint.
    """

    def claim(self, files: Sequence[SnapshotFile], rows: pa.Table | None = None) -> bool:
        """Continue from ``files`` (the old subtask's, as in ``_metadata``); False: they are not
        this strategy's format, and the next checkpoint starts over. ``rows``: the canonical
        rows the restore read from them, when it built them as one table (a folded chain)."""


class CanonicalCapture(Capture[WrittenFiles]):
    def __init__(
        self,
        operator_uid: str,
        subtask_index: int,
        backend: SnapshotSource,
        view: StateView,
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

    def __init__(self, backend: ViewSource) -> None:
        self.backend = backend

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> CanonicalCapture:
        view = self.backend.snapshot_view()
        return CanonicalCapture(operator_uid, subtask_index, self.backend, view)
