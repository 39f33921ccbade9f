"""Restoring RocksDB's native snapshot files: download one old subtask's DB, then open it in place
or read its rows aside.

With a RocksDB factory the restore opens the DB of the old subtask that overlaps a new subtask
most and cuts the foreign key groups out with ``delete_range``, as Flink does
(:meth:`RocksDBBackendFactory.restore_native`); every other overlapping DB is opened aside in a
scratch directory (:func:`opened_aside`) and its rows of the range inserted into the new backend
(:func:`insert_rows`), which also works for a heap backend (the bridge); Spark tasks read native
snapshots through :func:`opened_aside` too.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from state_engine.backends.base import KeyedStateBackend, KeyedStateView
from state_engine.backends.rocksdb.backend import RocksDBKeyedStateBackend
from state_engine.backends.rocksdb.snapshot import local_name_of
from state_engine.checkpoint.metadata import FileKind, SnapshotMetadata, SubtaskSnapshot
from state_engine.checkpoint.registry import SharedStateRegistry
from state_engine.checkpoint.storage import (
    METADATA_FILE,
    ReadStats,
    SnapshotDir,
    format_checksum,
)
from state_engine.checkpoint.strategies import SHARED_PREFIX
from state_engine.errors import ChecksumMismatch
from state_engine.keygroups import KeyGroupRange
from state_engine.serde import TypeSerializer
from state_engine.state.ttl import Clock

NATIVE_KINDS = frozenset({FileKind.NATIVE_SST, FileKind.NATIVE_PRIVATE})
_CHUNK = 1 << 20


@dataclass
class NativeSource:
    """The native files of one old subtask in a snapshot, and where reading them is counted."""

    snapshot: SnapshotDir
    metadata: SnapshotMetadata
    subtask: SubtaskSnapshot
    stats: ReadStats
    #: learns the checksums of the shared SSTs downloaded, so the next incremental checkpoint
    #: of the restored DB references them instead of reading them again (None: no checkpoints
    #: follow, e.g. a Spark task reading the rows)
    registry: SharedStateRegistry | None = None

    def download(self, db: Path) -> None:
        """Copy the subtask's files into the empty directory ``db``, checking every checksum."""
        snap, meta = self.snapshot, self.metadata
        for p in self.subtask.files:
            f = meta.file(p)
            name = local_name_of(p)
            # Every byte passes through here anyway: checking it costs one crc32 per chunk, and a
            # flipped byte in an SST would otherwise be restored silently (RocksDB checks block
            # checksums only when it happens to read the block).
            crc = 0
            with snap.open_input(p, self.stats) as src, open(db / name, "xb") as out:
                while chunk := src.read(_CHUNK):
                    crc = zlib.crc32(chunk, crc)
                    out.write(chunk)
            actual = format_checksum(crc)
            if actual != f.checksum:
                raise ChecksumMismatch(
                    f"file {p!r} of snapshot {snap.url} has checksum {actual}, but "
                    f"{METADATA_FILE} recorded {f.checksum}; its content is corrupt: restore "
                    "from another snapshot"
                )
            if (
                self.registry is not None
                and f.kind is FileKind.NATIVE_SST
                and p.startswith(SHARED_PREFIX)
            ):
                self.registry.remember_checksum(str(db), name, f.size, f.checksum)

    @property
    def key_group_range(self) -> KeyGroupRange:
        return KeyGroupRange.of(*self.subtask.key_group_range)


@runtime_checkable
class NativeRestoreFactory(Protocol):
    """A backend factory that opens a native snapshot's DB in place (the RocksDB factory)."""

    def restore_native(
        self,
        operator_uid: str,
        subtask_index: int,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None,
        source: NativeSource,
    ) -> KeyedStateBackend: ...


def open_in_place(
    new_path: Callable[[], Path],
    key_serializer: Any,
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    clock: Clock | None,
    source: NativeSource,
) -> RocksDBKeyedStateBackend:
    """A backend over ``source``'s DB, downloaded into a fresh directory, holding only the key
    groups of ``key_group_range`` (the others are cut out with ``delete_range``)."""
    path = new_path()
    db = path / "db"
    db.mkdir()
    source.download(db)
    backend = RocksDBKeyedStateBackend(
        path, key_serializer, max_parallelism, key_group_range, clock
    )
    try:
        first, last = source.subtask.key_group_range
        if first < key_group_range.start:
            backend.delete_key_group_range(KeyGroupRange.of(first, key_group_range.start - 1))
        if last > key_group_range.end:
            backend.delete_key_group_range(KeyGroupRange.of(key_group_range.end + 1, last))
    except BaseException:
        backend.close()
        raise
    return backend


@contextlib.contextmanager
def opened_aside(
    source: NativeSource, key_serializer: TypeSerializer, scratch_root: str | Path | None = None
) -> Iterator[KeyedStateView]:
    """A view of ``source``'s DB, downloaded into a scratch directory (never opened in place:
    RocksDB writes LOCK and LOG files next to its data) and removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="sk-restore-", dir=scratch_root))
    try:
        (scratch / "db").mkdir()
        source.download(scratch / "db")
        aside = RocksDBKeyedStateBackend(
            scratch, key_serializer, source.metadata.max_parallelism, source.key_group_range
        )
        try:
            with aside.snapshot_view() as view:
                yield view
        finally:
            aside.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def insert_rows(
    source: NativeSource,
    key_groups: KeyGroupRange,
    target: KeyedStateBackend,
    key_serializer: TypeSerializer,
) -> None:
    """Insert ``source``'s rows of ``key_groups`` into ``target`` (any backend)."""
    with opened_aside(source, key_serializer) as view:
        target.restore_entries(view.iter_entries(key_groups), dict(view.states))
