"""Snapshot strategies: the synchronous capture and the asynchronous write of one keyed backend.

As in Flink's ``SnapshotStrategy``: :meth:`SnapshotStrategy.capture` runs on the task thread and
only fixes a consistent view (heap: copy-on-write view; RocksDB: a hard-linked local checkpoint);
:meth:`Capture.write_files` writes the files while processing continues: on the checkpoint
thread, or for heap views on local storage in a child forked at the barrier (see :mod:`forked`);
:meth:`Capture.result` then describes them for ``_metadata`` and the catalog.

- :class:`CanonicalSnapshotStrategy`: full canonical Parquet of the view (any backend).
- :class:`NativeSnapshotStrategy`: the RocksDB files. Incremental checkpoints upload each SST once
  into ``shared/`` under a content name and reference it afterwards; private files (MANIFEST,
  OPTIONS, CURRENT, ...) are written per checkpoint. Savepoints copy every file into their own
  directory (self-contained).
- :class:`DeltaSnapshotStrategy`: heap incremental, the changed keys since the last confirmed
  view on top of a canonical base (both under ``shared/``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import uuid
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state_engine.backends.base import KeyedStateBackend, KeyedStateView
from state_engine.checkpoint.canonical import (
    DEFAULT_ROW_GROUP_BYTES,
    CanonicalWriter,
    KeyGroupStats,
    WrittenFiles,
)
from state_engine.checkpoint.metadata import FileKind, SnapshotFile
from state_engine.checkpoint.registry import SharedStateRegistry
from state_engine.checkpoint.storage import (
    SHARED_DIR,
    SnapshotDir,
    SnapshotFileWriter,
    format_checksum,
)
from state_engine.errors import SnapshotCancelled, SnapshotFileExists
from state_engine.faults import crash_point
from state_engine.keygroups import key_group_prefix_length
from state_engine.snapshot_enums import SnapshotFormat

_CHUNK = 1 << 20
_CANCEL_EVERY = 4096
SHARED_PREFIX = f"../{SHARED_DIR}/"
_META_KEYS = (b"\x00meta:", b"\x00list-seq")


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
    #: files this snapshot created (relative paths), removed again if it fails or is cancelled
    created: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise SnapshotCancelled(
                f"snapshot {self.snapshot.url} (checkpoint {self.checkpoint_id}) was cancelled "
                "before it completed; nothing of it is kept: trigger a new one"
            )

    def guarded(self, rows: Iterable[Any]) -> Iterator[Any]:
        """``rows``, checking for cancellation every few thousand rows (taken a chunk at a
        time: a per-row Python step here cost as much as producing the row)."""
        it = iter(rows)
        while chunk := list(itertools.islice(it, _CANCEL_EVERY)):
            yield from chunk
            self.check()


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
    #: heap delta: the chain this subtask's files form (base files, then deltas), to continue
    chain: list[SnapshotFile] | None = None


class Capture(ABC):
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

    #: ``write_files`` only reads a fork-safe view and writes files: it may run in a forked child
    forkable: bool = False

    def prepare(self, ctx: WriteContext) -> None:  # noqa: B027 - most captures need none
        """Asynchronous phase, before any file is written (in this process)."""

    @abstractmethod
    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> Any:
        """Write the files, reporting each path to ``opened`` before creating it; returns
        what :meth:`result` needs (picklable when :attr:`forkable`)."""

    @abstractmethod
    def result(self, ctx: WriteContext, written: Any) -> SubtaskResult:
        """What the snapshot consists of, from what :meth:`write_files` returned."""

    def still_valid(self, ctx: WriteContext) -> bool:
        """After a forked write: whether what the files build on still exists."""
        return True

    @abstractmethod
    def release(self) -> None: ...

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


class SnapshotStrategy(ABC):
    format: str

    @abstractmethod
    def capture(
        self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend
    ) -> Capture: ...


# --- canonical ---


class CanonicalCapture(Capture):
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
    def forkable(self) -> bool:  # type: ignore[override]
        return self.view.fork_safe

    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> WrittenFiles:
        with self._writer(ctx, self.directory, on_open=opened) as writer:
            writer.write(ctx.guarded(self.view.iter_entries()))
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


class CanonicalSnapshotStrategy(SnapshotStrategy):
    format = SnapshotFormat.CANONICAL

    def capture(
        self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend
    ) -> CanonicalCapture:
        return CanonicalCapture(operator_uid, subtask_index, backend, backend.snapshot_view())


# --- native RocksDB ---


def file_checksum(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return format_checksum(crc)


def shared_sst_name(local_name: str, size: int, checksum: str) -> str:
    """The content name of an SST in ``shared/``: never uploaded twice, never two contents."""
    return f"sst-{checksum.partition(':')[2]}-{size}-{local_name}"


def local_name_of(path: str) -> str:
    """The file name a native file had in its DB directory."""
    base = path.rsplit("/", 1)[-1]
    if path.startswith(SHARED_PREFIX) and base.startswith("sst-"):
        # sst-<crc>-<size>[-<unique>]-<name>: RocksDB file names hold no '-'.
        return base.rsplit("-", 1)[1]
    return base


def copy_into(
    ctx: WriteContext, source: Path, relative_path: str, kind: FileKind
) -> tuple[SnapshotFile, bool]:
    """Copy a local file into the snapshot exclusively; (file, True) if it was written now.

    A shared content-named file that this snapshot already wrote with the same size and checksum
    (an identical SST of another subtask) is reused rather than written twice. One that exists
    but that neither this snapshot nor the registry knows (left by a failed checkpoint) is never
    reused: an orphan cleanup may be deleting it right now, so the copy goes to a fresh name.
    """
    try:
        sink = ctx.snapshot.create(relative_path)
    except SnapshotFileExists:
        if not relative_path.startswith(SHARED_PREFIX):
            raise
        if relative_path not in ctx.created:
            head, _, local = relative_path.rpartition("-")
            return copy_into(ctx, source, f"{head}-{uuid.uuid4().hex[:12]}-{local}", kind)
        size = ctx.snapshot.size_of(relative_path)
        checksum = ctx.snapshot.checksum_of(relative_path)
        if size != source.stat().st_size or checksum != file_checksum(source):
            raise
        return SnapshotFile(relative_path, size, checksum, kind), False
    ctx.created.append(relative_path)
    _stream(ctx, source, sink)
    info = sink.close()
    return SnapshotFile(info.path, info.size, info.checksum, kind), True


def _stream(ctx: WriteContext, source: Path, sink: SnapshotFileWriter) -> None:
    try:
        with open(source, "rb") as f:
            while chunk := f.read(_CHUNK):
                ctx.check()
                sink.write(chunk)
    except BaseException:
        sink.abort()
        raise


class NativeCapture(Capture):
    """A hard-linked RocksDB checkpoint in a local directory, plus its live SST metadata."""

    def __init__(
        self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend, local: Path
    ) -> None:
        super().__init__(operator_uid, subtask_index, backend)
        self.local = local
        backend.create_checkpoint(local)  # type: ignore[attr-defined]
        self.sst_meta = list(backend.live_sst_files())  # type: ignore[attr-defined]
        self.db_id = str(backend.db_path)  # type: ignore[attr-defined]
        self.states = {n: m.to_dict() for n, m in backend.registered_states().items()}

    def write_files(self, ctx: WriteContext, opened: Callable[[str], None]) -> SubtaskResult:
        return self._upload(ctx)

    def result(self, ctx: WriteContext, written: SubtaskResult) -> SubtaskResult:
        return written

    def _upload(self, ctx: WriteContext) -> SubtaskResult:
        own_dir = f"native-{self.subtask_index}-{uuid.uuid4().hex[:12]}"
        files: list[SnapshotFile] = []
        written = reused = 0
        for name in sorted(os.listdir(self.local)):
            ctx.check()
            source = self.local / name
            size = source.stat().st_size
            if name.endswith(".sst"):
                if ctx.incremental and not ctx.savepoint:
                    checksum = ctx.registry.local_checksum(
                        self.db_id, name, size, lambda s=source: file_checksum(s)
                    )
                    path = SHARED_PREFIX + shared_sst_name(name, size, checksum)
                    known = ctx.registry.lookup(path)
                    if known is not None:
                        files.append(known)
                        reused += 1
                        continue
                    f, new = copy_into(ctx, source, path, FileKind.NATIVE_SST)
                    crash_point("checkpoint.native.after_shared_upload")
                else:
                    f, new = copy_into(ctx, source, f"{own_dir}/{name}", FileKind.NATIVE_SST)
            else:
                f, new = copy_into(ctx, source, f"{own_dir}/{name}", FileKind.NATIVE_PRIVATE)
            files.append(f)
            written += f.size if new else 0
            reused += 0 if new else 1
        return SubtaskResult(
            self.operator_uid,
            self.subtask_index,
            self.key_group_range,
            files,
            self._estimate_stats(),
            written,
            files_reused=reused,
        )

    def _estimate_stats(self) -> dict[int, KeyGroupStats]:
        """Rows and bytes per key group estimated from the SSTs' key ranges and entry counts
        (a scan would cost as much as a full snapshot); each SST's entries are spread evenly
        over the key groups between its first and last key."""
        plen = key_group_prefix_length(self.max_parallelism)
        first, last = self.key_group_range
        rows: dict[int, float] = {}
        size: dict[int, float] = {}
        for sst in self.sst_meta:
            start, end = sst.get("start_key") or b"", sst.get("end_key") or b""
            if start.startswith(_META_KEYS) or len(start) < plen or len(end) < plen:
                continue  # the default column family (state meta, counters) holds no rows
            a = max(int.from_bytes(start[:plen], "big"), first)
            b = min(int.from_bytes(end[:plen], "big"), last)
            if a > b:
                continue
            n = b - a + 1
            entries = max(int(sst.get("num_entries", 0)) - int(sst.get("num_deletions", 0)), 0)
            for kg in range(a, b + 1):
                rows[kg] = rows.get(kg, 0.0) + entries / n
                size[kg] = size.get(kg, 0.0) + int(sst.get("size", 0)) / n
        return {
            kg: KeyGroupStats(round(rows[kg]), round(size[kg]))
            for kg in sorted(rows)
            if round(rows[kg]) > 0
        }

    def release(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)


class NativeSnapshotStrategy(SnapshotStrategy):
    format = SnapshotFormat.NATIVE

    def __init__(self, checkpoint_id: int) -> None:
        self.checkpoint_id = checkpoint_id

    def capture(
        self, operator_uid: str, subtask_index: int, backend: KeyedStateBackend
    ) -> NativeCapture:
        root = Path(backend.path) / "snapshots"  # type: ignore[attr-defined]
        root.mkdir(parents=True, exist_ok=True)
        local = root / f"chk-{self.checkpoint_id}-{uuid.uuid4().hex[:8]}"
        return NativeCapture(operator_uid, subtask_index, backend, local)


def is_native(backend: KeyedStateBackend) -> bool:
    return hasattr(backend, "create_checkpoint") and hasattr(backend, "db_path")


ReleaseFn = Callable[[], None]
