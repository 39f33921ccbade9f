"""Restoring RocksDB's native snapshot files: download one old subtask's DB, then open it in place
or read its rows aside.

With a RocksDB factory the restore opens the DB of the old subtask that overlaps a new subtask
most and cuts the foreign key groups out with ``delete_range``, as Flink does
(:meth:`RocksDBBackendFactory.restore_native`); every other overlapping DB is opened aside in a
scratch directory (:func:`opened_aside`) and its rows of the range inserted into the new backend
(:func:`insert_rows`), which also works for a heap backend (the bridge:
:meth:`HeapBackendFactory.restore_native`); Spark tasks read native snapshots through
:func:`opened_aside` too.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from state_engine.backends.base import KeyedStateBackend, KeyedStateView
from state_engine.backends.rocksdb.backend import RocksDBKeyedStateBackend
from state_engine.backends.rocksdb.snapshot import local_name_of
from state_engine.keygroups import KeyGroupRange
from state_engine.serde import TypeSerializer
from state_engine.snapshot.metadata import FileKind, checksum_mismatch
from state_engine.snapshot.native import BackendSpec, NativeSource
from state_engine.snapshot.storage import SHARED_PREFIX, format_checksum

_CHUNK = 1 << 20
#: the backend insert_rows fills and returns
B = TypeVar("B", bound=KeyedStateBackend)


def download(source: NativeSource, db: Path) -> None:
    """Copy the subtask's files into the empty directory ``db``, checking every checksum."""
    snap, meta = source.snapshot, source.metadata
    for p in source.subtask.files:
        f = meta.file(p)
        name = local_name_of(p)
        # Every byte passes through here anyway: checking it costs one crc32 per chunk, and a
        # flipped byte in an SST would otherwise be restored silently (RocksDB checks block
        # checksums only when it happens to read the block).
        crc = 0
        with snap.open_input(p, source.stats) as src, open(db / name, "xb") as out:
            while chunk := src.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
        actual = format_checksum(crc)
        if actual != f.checksum:
            raise checksum_mismatch(snap, f, actual)
        if (
            source.registry is not None
            and f.kind is FileKind.NATIVE_SST
            and p.startswith(SHARED_PREFIX)
        ):
            source.registry.remember_checksum(str(db), name, f.size, f.checksum)


def open_in_place(path: Path, spec: BackendSpec, source: NativeSource) -> RocksDBKeyedStateBackend:
    """The backend ``spec`` over ``source``'s DB, downloaded into the fresh directory ``path``,
    holding only the spec's key groups (the others are cut out with ``delete_range``)."""
    db = path / "db"
    db.mkdir()
    download(source, db)
    key_group_range = spec.key_group_range
    backend = RocksDBKeyedStateBackend(
        path, spec.key_serializer, spec.max_parallelism, key_group_range, spec.clock
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
        download(source, scratch / "db")
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


def insert_rows(target: B, sources: Sequence[NativeSource], key_serializer: TypeSerializer) -> B:
    """``target`` with the rows of its key groups inserted from each of ``sources``' DBs, opened
    aside (any backend: a heap one reads RocksDB's files this way); closed if one fails."""
    try:
        for source in sources:
            with opened_aside(source, key_serializer) as view:
                rows = view.iter_entries(target.key_group_range)
                target.restore_entries(rows, dict(view.states))
    except BaseException:
        target.close()
        raise
    return target
