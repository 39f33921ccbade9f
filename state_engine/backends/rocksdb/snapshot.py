"""RocksDB's native snapshots: the DB's own files, SSTs shared between incremental checkpoints.

At the barrier the backend hard-links a RocksDB checkpoint into a local directory (and notes its
live SSTs' metadata); asynchronously the files are copied into the snapshot. Incremental
checkpoints upload each SST once into ``shared/`` under a content name (:func:`shared_sst_name`)
and reference it afterwards; private files (MANIFEST, OPTIONS, CURRENT, ...) are written per
checkpoint. Savepoints copy every file into their own directory (self-contained).
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from state_engine.backends.rocksdb.layout import META_PREFIX, OLD_LIST_SEQ_KEY
from state_engine.errors import SnapshotFileExists
from state_engine.faults import crash_point
from state_engine.keygroups import key_group_prefix_length
from state_engine.snapshot.canonical import KeyGroupStats
from state_engine.snapshot.metadata import FileKind, SnapshotFile
from state_engine.snapshot.storage import SHARED_PREFIX, SnapshotFileWriter, format_checksum
from state_engine.snapshot.strategy import Capture, SnapshotSource, SubtaskResult, WriteContext
from state_engine.snapshot_enums import SnapshotFormat

if TYPE_CHECKING:
    from state_engine.state.meta import StateMetaInfo

_CHUNK = 1 << 20
# keys of the default column family (state meta, old list counters), which holds no rows
_META_KEYS = (META_PREFIX, OLD_LIST_SEQ_KEY)


class NativeBackend(SnapshotSource, Protocol):
    """What a native snapshot uses of its RocksDB backend."""

    path: Path
    db_path: Path

    def create_checkpoint(self, path: str | Path) -> None: ...

    def live_sst_files(self) -> list[dict[str, Any]]: ...

    def registered_states(self) -> Mapping[str, StateMetaInfo]: ...


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


class NativeCapture(Capture[SubtaskResult]):
    """A hard-linked RocksDB checkpoint in a local directory, plus its live SST metadata."""

    def __init__(
        self,
        operator_uid: str,
        subtask_index: int,
        backend: NativeBackend,
        local: Path,
    ) -> None:
        super().__init__(operator_uid, subtask_index, backend)
        self.local = local
        backend.create_checkpoint(local)
        self.sst_meta = list(backend.live_sst_files())
        self.db_id = str(backend.db_path)
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
                        self.db_id, name, size, functools.partial(file_checksum, source)
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


class NativeSnapshotStrategy:
    """The native snapshot of one RocksDB backend."""

    format = SnapshotFormat.NATIVE

    def __init__(self, backend: NativeBackend) -> None:
        self.backend = backend

    def capture(self, operator_uid: str, subtask_index: int, ctx: WriteContext) -> NativeCapture:
        return self.capture_at(operator_uid, subtask_index, ctx.checkpoint_id)

    def capture_at(
        self, operator_uid: str, subtask_index: int, checkpoint_id: int
    ) -> NativeCapture:
        """:meth:`capture` before the snapshot has a :class:`WriteContext` (a worker process
        captures at the barrier; the parent's manager says later where to write)."""
        root = self.backend.path / "snapshots"
        root.mkdir(parents=True, exist_ok=True)
        local = root / f"chk-{checkpoint_id}-{uuid.uuid4().hex[:8]}"
        return NativeCapture(operator_uid, subtask_index, self.backend, local)
