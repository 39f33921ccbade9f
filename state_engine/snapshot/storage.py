"""Where snapshot files live, and how they are written, committed, read back and discarded.

Layout under a checkpoint root (any fsspec URL)::

    <root>/<job>/chk-<n>/_metadata      written last
    <root>/<job>/chk-<n>/...            files exclusive to that checkpoint
    <root>/<job>/shared/...             files several checkpoints reference
    <root>/<job>/savepoints/savepoint-<n>-<short uuid>/   (default savepoint directory)

Paths inside a snapshot are relative to the snapshot directory. A checkpoint reaches the job's
shared files as ``../shared/<name>``; a savepoint never does, so a savepoint directory can be
moved or copied and still reads.

Data files are created exclusively under names that are never reused; nothing here overwrites
an existing file.
"""

from __future__ import annotations

import os
import posixpath
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import fsspec
import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from state_engine.checkpoint_dirs import checkpoint_dir_name, is_checkpoint_dir
from state_engine.errors import (
    CheckpointError,
    InvalidSnapshotPath,
    MissingMetadata,
    MissingSnapshotFile,
    SnapshotFileExists,
    StorageAccessDenied,
    StorageBucketMissing,
    StorageUnavailable,
    StorageUnreachable,
    UnknownStorageScheme,
)
from state_engine.names import check_job_name

METADATA_FILE = "_metadata"
SHARED_DIR = "shared"
#: where a checkpoint's shared files sit, relative to its directory
SHARED_PREFIX = f"../{SHARED_DIR}/"
SAVEPOINTS_DIR = "savepoints"
CHECKSUM_ALGORITHM = "crc32"

# Schemes worth suggesting when a URL's scheme is unknown: the ones that can hold checkpoints.
_STORAGE_SCHEMES = (
    "file",
    "memory",
    "s3",
    "s3a",
    "gs",
    "gcs",
    "az",
    "abfs",
    "adl",
    "hdfs",
    "webhdfs",
    "sftp",
    "oss",
)
# Object stores: one PUT is atomic and there is no cheap rename, so `_metadata` is written
# directly (exclusively) instead of through a temporary name.
_OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileInfo:
    """A written file: path relative to the directory it was written through, size, checksum."""

    path: str
    size: int
    checksum: str


@dataclass(frozen=True)
class StoredFile:
    """A file found by a listing: path relative to the listed directory, size, and the store's
    modification time in seconds since the epoch (None when the store reports none)."""

    path: str
    size: int
    modified_at: float | None

    @property
    def modified(self) -> datetime | None:
        """The modification time as an aware datetime (None when unknown)."""
        return None if self.modified_at is None else datetime.fromtimestamp(self.modified_at, UTC)

    @property
    def mtime(self) -> float:
        """``modified_at``, 0.0 when unknown."""
        return self.modified_at if self.modified_at is not None else 0.0


@dataclass(frozen=True)
class DirEntry:
    """One child of a directory: its path on the file system, whether it is a directory, size
    and modification time."""

    path: str
    is_dir: bool
    size: int
    modified: datetime | None

    @property
    def mtime(self) -> float:
        return self.modified.timestamp() if self.modified is not None else 0.0


#: The file system type behind a store (for type hints; only this module calls it).
FileSystem: TypeAlias = AbstractFileSystem


def format_checksum(crc: int) -> str:
    return f"{CHECKSUM_ALGORITHM}:{crc & 0xFFFFFFFF:08x}"


def validate_job_name(job: str) -> str:
    """Return ``job`` if it is usable as one directory name, else raise InvalidJobName."""
    return check_job_name(job)


def normalize_relative(path: str, *, allow_shared: bool, where: str) -> str:
    """Validate a snapshot-relative path and return it in normal form.

    Only ``../shared/...`` may leave the directory, and only when ``allow_shared``.
    """
    if not isinstance(path, str) or not path or "\x00" in path or "\\" in path:
        raise InvalidSnapshotPath(
            f"file path {path!r} in snapshot {where} is empty or holds NUL/backslash; "
            "use a relative POSIX path such as 'keyed-0-<uuid>.parquet'"
        )
    if path.startswith("/") or "://" in path:
        raise InvalidSnapshotPath(
            f"file path {path!r} in snapshot {where} is absolute; snapshot paths are relative "
            "to the snapshot directory so it can be moved"
        )
    parts = path.split("/")
    if allow_shared and len(parts) >= 3 and parts[0] == ".." and parts[1] == SHARED_DIR:
        rest = parts[2:]
        prefix = SHARED_PREFIX
    elif allow_shared and len(parts) >= 3 and parts[0] == ".." and is_checkpoint_dir(parts[1]):
        # a file of an earlier checkpoint of the job, reused by a rescale that rewrote nothing
        rest = parts[2:]
        prefix = f"../{parts[1]}/"
    else:
        rest = parts
        prefix = ""
    if any(p in ("", ".", "..") for p in rest):
        hint = " or ../shared/<name>" if allow_shared else " (savepoints hold no shared files)"
        raise InvalidSnapshotPath(
            f"file path {path!r} in snapshot {where} has an empty, '.' or '..' component; "
            f"use a plain relative path inside the snapshot directory{hint}"
        )
    return prefix + "/".join(rest)


def resolve_storage(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[AbstractFileSystem, str]:
    """``fsspec.core.url_to_fs`` with errors that say which schemes would work."""
    if not isinstance(url, str) or not url.strip():
        raise UnknownStorageScheme(
            f"checkpoint URL {url!r} is empty; use e.g. 'file:///var/lib/checkpoints' or "
            "'s3://bucket/checkpoints'"
        )
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        raise UnknownStorageScheme(
            f"checkpoint URL {url!r}: scheme {scheme!r} needs a driver that is not installed "
            f"({exc}); install it or use one of: file, memory"
        ) from exc
    except ValueError as exc:
        if "Protocol not known" not in str(exc):
            raise UnknownStorageScheme(
                f"checkpoint URL {url!r} cannot be opened: {exc}; check the URL and storage_options"
            ) from exc
        known = [s for s in _STORAGE_SCHEMES if s in fsspec.available_protocols()]
        raise UnknownStorageScheme(
            f"checkpoint URL {url!r} has scheme {scheme!r}, which fsspec does not know; "
            f"use one of: {', '.join(known)}"
        ) from exc
    return fs, path.rstrip("/") or "/"


_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "ServerDisconnectedError")  # fmt: skip
_REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidClientTokenId",
            "ExpiredToken", "does not exist in our records", "signature we calculated")  # fmt: skip


def storage_failure(exc: BaseException, url: str) -> StorageUnavailable | None:
    """The Statekeeper error for an object store that cannot be used (None for anything else):
    endpoint unreachable, credentials refused, bucket missing, each naming what to fix."""
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in seen:
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme not in _OBJECT_STORE_PROTOCOLS:
        return None
    endpoint = "AWS_ENDPOINT_URL" if scheme.startswith("s3") else "the storage endpoint"
    for e in seen:
        text = " ".join(str(e).split())[:300]
        if isinstance(e, StorageUnavailable):
            return e
        if type(e).__name__ in _UNREACHABLE or isinstance(e, ConnectionRefusedError):
            return StorageUnreachable(
                f"checkpoint storage {url} is unreachable ({text}); check {endpoint} and that "
                "the object store is running and reachable from this machine"
            )
        if "bucket does not exist" in text.lower() or "NoSuchBucket" in text:
            bucket = url.split("://", 1)[-1].split("/", 1)[0]
            return StorageBucketMissing(
                f"bucket {bucket!r} of checkpoint storage {url} does not exist ({text}); create "
                "it, or point STATEKEEPER_CHECKPOINT_ROOT at an existing bucket"
            )
        if isinstance(e, PermissionError) or any(code in text for code in _REFUSED):
            return StorageAccessDenied(
                f"checkpoint storage {url} refused the request ({text}); check the credentials "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the instance role) and that "
                "they may read, write and list the bucket"
            )
    return None


def _protocol(fs: AbstractFileSystem) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _modified(info: dict[str, Any]) -> datetime | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created", "modified"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _local_files(root: str) -> Iterator[tuple[str, os.DirEntry[str] | None]]:
    """Every file under local directory ``root`` as (path, its directory entry; None for
    ``root`` itself when it is a file, as fsspec's find gives it). A link to a directory is
    walked, as fsspec's find does; a directory removed during the walk (a running job subsumed
    a checkpoint) is skipped. No stat: ``is_dir`` reads the entry's type from the directory."""
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            if directory == root:
                yield root, None
            continue
        with entries:
            for entry in entries:
                if entry.is_dir():  # False for an entry gone meanwhile: its stat says
                    stack.append(entry.path)
                else:
                    yield entry.path, entry


def _walk_local(root: str) -> Iterator[tuple[str, int, float]]:
    """(path, size, mtime) of every file under local directory ``root`` (see _local_files); a
    file removed during the walk is skipped, a dangling link has its own stat."""
    for path, entry in _local_files(root):
        try:
            st = os.stat(root) if entry is None else entry.stat()
        except FileNotFoundError:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
        yield path, st.st_size, st.st_mtime


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return tuple(proto) if isinstance(proto, tuple | list) else (proto,)


class FileStore:
    """A file system reached through URLs: the one door to fsspec.

    Paths are the file system's own (a URL without its scheme, e.g. ``/var/ckpt/x`` or
    ``bucket/x``); :meth:`path_of` and :meth:`url_of` convert. Listings are one call
    (``find(detail=True)``), never a stat per file, so they stay cheap on object stores.
    """

    def __init__(self, fs: AbstractFileSystem) -> None:
        self._fs = fs
        self._local = isinstance(fs, LocalFileSystem)

    @classmethod
    def at(cls, url: str, storage_options: dict[str, Any] | None = None) -> tuple[FileStore, str]:
        """The store of ``url`` and the path ``url`` names on it."""
        fs, path = resolve_storage(url, storage_options)
        return cls(fs), path

    def __repr__(self) -> str:
        return f"FileStore({self.protocol!r})"

    @property
    def filesystem(self) -> FileSystem:
        """The fsspec file system (for :class:`SnapshotDir` and pyarrow hand-offs)."""
        return self._fs

    @property
    def protocol(self) -> str:
        return _protocol(self._fs)

    @property
    def is_local(self) -> bool:
        """Whether paths are local files (``file://``)."""
        return self._local or bool({"file", "local"} & set(_protocols(self._fs)))

    @property
    def is_object_store(self) -> bool:
        return _protocol(self._fs) in _OBJECT_STORE_PROTOCOLS

    def handles(self, url: str) -> bool:
        """Whether ``url`` (or a bare path) lives on this store's kind of file system."""
        if "://" not in url:
            return True
        return url.split("://", 1)[0] in _protocols(self._fs)

    # --- URL <-> path ---

    def path_of(self, location: str) -> str:
        """The path of ``location`` (a URL or a path) on this file system."""
        if self._local and location.startswith("/") and "//" not in location:
            return location.rstrip("/") or "/"
        return str(self._fs._strip_protocol(location))

    def url_of(self, path: str) -> str:
        """The URL of ``path`` (a path on this file system, or a URL: made canonical)."""
        if self._local and path.startswith("/") and "//" not in path:
            return "file://" + path
        return str(self._fs.unstrip_protocol(self._fs._strip_protocol(path)))

    def urls_of(self, paths: list[str]) -> list[str]:
        """:meth:`url_of` of each of ``paths`` (a snapshot's thousands of files in one call)."""
        if not self._local:
            return [self.url_of(p) for p in paths]
        url_of = self.url_of
        return ["file://" + p if p[:1] == "/" and "//" not in p else url_of(p) for p in paths]

    def urls_in(self, directory: str, paths: list[str]) -> list[str]:
        """:meth:`urls_of` of ``paths`` that are all files right in ``directory`` (a path ending
        in '/', each path it and a file name): on local storage made without a check per path
        when the directory's own path needs none."""
        if self._local and directory.startswith("/") and "//" not in directory:
            return ["file://" + p for p in paths]
        return self.urls_of(paths)

    # --- queries ---

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(path))

    def isdir(self, path: str) -> bool:
        return bool(self._fs.isdir(path))

    def size(self, path: str) -> int:
        return int(self._fs.info(path)["size"])

    def find(self, path: str) -> list[StoredFile]:
        """Every file under ``path`` (relative to it), sorted; [] if it does not exist."""
        base = path.rstrip("/") or "/"
        skip = len(base) + (0 if base.endswith("/") else 1)
        if self.is_local:
            # a scandir walk: a third of fsspec's find, which builds an info dict per file
            out = [StoredFile(p[skip:], size, mtime) for p, size, mtime in _walk_local(base)]
        else:
            if not self._fs.exists(base):
                return []
            out = []
            for name, info in self._fs.find(base, detail=True).items():
                modified = _modified(info)
                out.append(
                    StoredFile(
                        name[skip:] if name.startswith(base) else posixpath.relpath(name, base),
                        int(info.get("size") or 0),
                        None if modified is None else modified.timestamp(),
                    )
                )
        out.sort(key=lambda f: f.path)
        return out

    def file_paths(self, path: str) -> list[str]:
        """The path of every file under ``path``, unsorted, without sizes: on local storage no
        stat per file (what a caller needs when only which files exist matters)."""
        base = path.rstrip("/") or "/"
        if self.is_local:
            return [p for p, _ in _local_files(base)]
        if not self._fs.exists(base):
            return []
        return [str(p) for p in self._fs.find(base)]

    def modified(self, path: str) -> datetime | None:
        """When ``path`` was last modified, as the store reports it (None when it does not)."""
        return _modified(self._fs.info(path))

    def ls(self, path: str) -> list[DirEntry]:
        """The children of directory ``path``."""
        return [
            DirEntry(
                info["name"].rstrip("/"),
                info.get("type") == "directory",
                int(info.get("size") or 0),
                _modified(info),
            )
            for info in self._fs.ls(path, detail=True)
        ]

    def is_empty_dir(self, path: str) -> bool:
        return not self._fs.ls(path, detail=False)

    def glob(self, pattern: str) -> list[str]:
        return sorted(self._fs.glob(pattern))

    # --- reads ---

    def open_read(self, path: str, **kwargs: Any) -> Any:
        return self._fs.open(path, "rb", **kwargs)

    def read_bytes(self, path: str, start: int | None = None, size: int | None = None) -> bytes:
        """The bytes of ``path`` (or of ``size`` bytes from ``start``)."""
        if start is None:
            return bytes(self._fs.cat_file(path))
        with self._fs.open(path, "rb") as f:
            f.seek(start)
            return bytes(f.read(-1 if size is None else size))

    # --- writes and deletes ---

    def open_write(self, path: str) -> Any:
        """A scratch file opened for writing (created or replaced; parents made): for files that
        are never part of a snapshot, such as spills. Snapshot files use SnapshotDir.create."""
        parent = posixpath.dirname(path)
        if parent:
            self._fs.makedirs(parent, exist_ok=True)
        return self._fs.open(path, "wb")

    def makedirs(self, path: str) -> None:
        self._fs.makedirs(path, exist_ok=True)

    def delete(self, path: str) -> bool:
        """Remove file ``path``; False if it was already gone."""
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True

    def delete_tree(self, path: str) -> bool:
        """Remove directory ``path`` and everything under it; False if it did not exist."""
        if not self._fs.exists(path):
            return False
        self._fs.rm(path, recursive=True)
        return True

    def rmdir(self, path: str) -> None:
        self._fs.rmdir(path)


def locate(url: str, storage_options: dict[str, Any] | None = None) -> tuple[FileStore, str]:
    """The store of ``url`` and its path there (``FileStore.at``)."""
    return FileStore.at(url, storage_options)


def canonical_url(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """``url`` as the stores spell it (``/x`` -> ``file:///x``), without a trailing slash."""
    store, path = FileStore.at(url, storage_options)
    return store.url_of(path).rstrip("/")


def forget_object_store_clients(protocols: Iterable[str] = ("s3", "s3a")) -> None:
    """Drop fsspec's cached clients of ``protocols``: they keep the settings (endpoint,
    credentials) of the environment they were made in."""
    for protocol in protocols:
        try:
            fsspec.get_filesystem_class(protocol).clear_instance_cache()
        except (ImportError, ValueError):
            continue  # that object store's fsspec package is not installed


def open_url(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """``url`` opened for reading."""
    store, path = FileStore.at(url, storage_options)
    return store.open_read(path)


def url_exists(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    store, path = FileStore.at(url, storage_options)
    return store.exists(path)


def list_url(url: str, storage_options: dict[str, Any] | None = None) -> list[StoredFile]:
    """Every file under ``url`` (paths relative to it), one listing call; [] if it is gone."""
    store, path = FileStore.at(url, storage_options)
    return store.find(path)


def delete_url(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Remove the file at ``url``; False if it was already gone."""
    store, path = FileStore.at(url, storage_options)
    return store.delete(path)


def delete_each(
    urls: Iterable[str], after_each: Callable[[], object] | None = None
) -> list[str | None]:
    """Remove each of ``urls``: the URL when it was removed, None when it was already gone.

    Usable as a Spark ``mapPartitions`` function: an executor imports this module only.
    ``after_each`` runs after every removal (a crash point in tests).
    """
    out: list[str | None] = []
    for url in urls:
        if delete_url(url):
            if after_each is not None:
                after_each()
            out.append(url)
        else:
            out.append(None)
    return out


class SnapshotFileWriter:
    """A file opened exclusively for writing; size and checksum are computed while streaming.

    ``close()`` returns the :class:`FileInfo`; ``abort()`` closes and removes the file.
    It is file-like enough for ``pyarrow.parquet.ParquetWriter``.
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        abs_path: str,
        relative_path: str,
        where: str,
        *,
        durable: bool = True,
    ):
        self._fs = fs
        self._abs = abs_path
        self._relative = relative_path
        self._where = where
        self._crc = 0
        self._size = 0
        self._info: FileInfo | None = None
        # on a local disk, close() returns once the bytes and the file's name are on the disk
        self._sync = durable and isinstance(fs, LocalFileSystem)
        self._file = _open_exclusive(fs, abs_path, where, durable=self._sync)

    @property
    def path(self) -> str:
        return self._relative

    @property
    def closed(self) -> bool:
        return self._info is not None or self._file is None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._file is None or self._info is not None:
            raise ValueError(f"write to closed snapshot file {self._relative!r}")
        view = memoryview(data)
        self._crc = zlib.crc32(view, self._crc)
        self._size += view.nbytes
        self._file.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass  # the fsspec file buffers; the data is on the disk only after close()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> FileInfo:
        if self._info is None:
            if self._file is None:
                raise CheckpointError(
                    f"snapshot file {self._relative!r} in {self._where} was aborted; write it "
                    "again under a new name"
                )
            try:
                if self._sync:
                    self._file.flush()
                    os.fsync(self._file.fileno())
                self._file.close()
            except FileExistsError as exc:  # an object store refused the conditional PUT
                if isinstance(exc, SnapshotFileExists):
                    raise
                raise _exists(self._fs, self._abs, self._where) from exc
            if self._sync:
                fsync_path(posixpath.dirname(self._abs))
            self._info = FileInfo(self._relative, self._size, format_checksum(self._crc))
        return self._info

    @property
    def info(self) -> FileInfo:
        if self._info is None:
            raise CheckpointError(f"snapshot file {self._relative!r} is not closed yet")
        return self._info

    def abort(self) -> None:
        """Close without committing and remove whatever was written."""
        if self._file is not None and self._info is None:
            try:
                self._file.close()
            finally:
                self._file = None
                if self._fs.exists(self._abs):
                    self._fs.rm_file(self._abs)

    def __enter__(self) -> SnapshotFileWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class CountingReader:
    """A read-only file wrapper that counts the bytes actually read from storage."""

    def __init__(self, raw: Any, stats: ReadStats | None):
        self._raw = raw
        self._stats = stats
        self._size: int | None = None

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        if self._stats is not None:
            self._stats.bytes_read += len(data)
        return bytes(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    def size(self) -> int:
        if self._size is None:
            here = self._raw.tell()
            self._size = self._raw.seek(0, 2)
            self._raw.seek(here)
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return bool(getattr(self._raw, "closed", False))

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> CountingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ReadStats:
    """What a restore read: bytes from storage, files opened, row groups decoded."""

    bytes_read: int = 0
    files_opened: int = 0
    row_groups_read: int = 0


def fsync_path(path: str) -> None:
    """Flush a local file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_durable_dirs(path: str) -> None:
    """``os.makedirs(path)`` whose new directories survive a power loss: each new directory's
    entry in its parent is flushed (a fresh ``chk-N`` would otherwise vanish with its files)."""
    created = []
    at = path
    while not os.path.isdir(at):
        created.append(at)
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    if not created:
        return
    os.makedirs(path, exist_ok=True)
    for new in reversed(created):
        fsync_path(os.path.dirname(new))


def _open_exclusive(
    fs: AbstractFileSystem, abs_path: str, where: str, *, durable: bool = False
) -> Any:
    parent = posixpath.dirname(abs_path)
    if parent:
        if durable:
            _make_durable_dirs(parent)
        else:
            fs.makedirs(parent, exist_ok=True)
    try:
        try:
            return fs.open(abs_path, "xb")
        except ValueError as exc:
            if "mode" not in str(exc):
                raise
            # A filesystem without exclusive create: names carry a uuid, so check-then-create
            # can only collide with a caller who reused a name on purpose.
            if fs.exists(abs_path):
                raise FileExistsError(abs_path) from exc
            return fs.open(abs_path, "wb")
    except FileExistsError as exc:
        raise _exists(fs, abs_path, where) from exc


def _exists(fs: AbstractFileSystem, abs_path: str, where: str) -> SnapshotFileExists:
    return SnapshotFileExists(
        f"{fs.unstrip_protocol(abs_path)} already exists in snapshot {where}; snapshot files "
        "are never overwritten: write under a new name (new_file_name()) or a new snapshot"
    )


class SnapshotDir:
    """One snapshot directory on a filesystem: resolve, write, read and commit its files."""

    def __init__(
        self,
        fs: AbstractFileSystem | FileStore,
        path: str,
        *,
        allow_shared: bool = True,
        durable: bool = True,
    ) -> None:
        self.store = fs if isinstance(fs, FileStore) else FileStore(fs)
        self.fs = self.store.filesystem
        self.path = path.rstrip("/") or "/"
        self.allow_shared = allow_shared
        #: on a local disk, each file is flushed to the disk when closed (False: scratch copies)
        self.durable = durable

    @classmethod
    def from_url(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        allow_shared: bool = True,
        durable: bool = True,
    ) -> SnapshotDir:
        fs, path = resolve_storage(url, storage_options)
        return cls(fs, path, allow_shared=allow_shared, durable=durable)

    @classmethod
    def on(cls, fs: FileSystem, location: str) -> SnapshotDir:
        """The snapshot at ``location`` (a URL or a path) on file system ``fs``."""
        store = FileStore(fs)
        return cls(store, store.path_of(location))

    def self_contained(self) -> SnapshotDir:
        """This directory read as a savepoint: no ``../shared/`` paths."""
        if not self.allow_shared:
            return self
        return SnapshotDir(self.store, self.path, allow_shared=False, durable=self.durable)

    @property
    def url(self) -> str:
        return str(self.fs.unstrip_protocol(self.path))

    def url_of(self, relative_path: str) -> str:
        """The URL of a snapshot-relative path (validated)."""
        return str(self.fs.unstrip_protocol(self.resolve(relative_path)))

    @property
    def metadata_url(self) -> str:
        return str(self.fs.unstrip_protocol(self.metadata_path))

    def exists(self) -> bool:
        """Whether the directory exists (anything was written to it)."""
        return bool(self.fs.exists(self.path))

    def has_file(self, relative_path: str) -> bool:
        return bool(self.fs.exists(self.resolve(relative_path)))

    def remove_file(self, relative_path: str) -> bool:
        """Remove one file of the snapshot; False if it was already gone."""
        return self.store.delete(self.resolve(relative_path))

    def remove(self) -> bool:
        """Remove the directory and everything in it (a snapshot that never completed);
        False if it did not exist. :meth:`CheckpointStorage.discard` adds the safety checks."""
        return self.store.delete_tree(self.path)

    def resolve(self, relative_path: str) -> str:
        """The absolute filesystem path of a snapshot-relative path (validated)."""
        rel = normalize_relative(relative_path, allow_shared=self.allow_shared, where=self.url)
        return posixpath.normpath(posixpath.join(self.path, rel))

    def new_file_name(self, prefix: str, suffix: str = "") -> str:
        """A file name never used before: ``<prefix>-<uuid4 hex><suffix>``."""
        return f"{prefix}-{uuid.uuid4().hex}{suffix}"

    def create(self, relative_path: str) -> SnapshotFileWriter:
        rel = normalize_relative(relative_path, allow_shared=self.allow_shared, where=self.url)
        if posixpath.basename(rel).startswith(METADATA_FILE):
            raise InvalidSnapshotPath(
                f"file name {rel!r} in snapshot {self.url} is reserved for the snapshot's "
                "_metadata; commit metadata with write_metadata()"
            )
        return SnapshotFileWriter(self.fs, self.resolve(rel), rel, self.url, durable=self.durable)

    def write_file(
        self, relative_path: str, data: bytes | Callable[[SnapshotFileWriter], object]
    ) -> FileInfo:
        """Write ``data`` (bytes, or a callback given the open file) exclusively."""
        writer = self.create(relative_path)
        try:
            if callable(data):
                data(writer)
            else:
                for start in range(0, len(data), _CHUNK):
                    writer.write(memoryview(data)[start : start + _CHUNK])
        except BaseException:
            writer.abort()
            raise
        return writer.close()

    def open_input(self, relative_path: str, stats: ReadStats | None = None) -> CountingReader:
        abs_path = self.resolve(relative_path)
        try:
            # cache_type="none": read-ahead would fetch bytes the restore never asked for
            raw = self.fs.open(abs_path, "rb", cache_type="none")
        except FileNotFoundError as exc:
            raise MissingSnapshotFile(
                f"file {relative_path!r} of snapshot {self.url} is missing from storage; "
                "restore from another snapshot"
            ) from exc
        if stats is not None:
            stats.files_opened += 1
        return CountingReader(raw, stats)

    def size_of(self, relative_path: str) -> int:
        try:
            return int(self.fs.info(self.resolve(relative_path))["size"])
        except FileNotFoundError as exc:
            raise MissingSnapshotFile(
                f"file {relative_path!r} of snapshot {self.url} is missing from storage; "
                "restore from another snapshot"
            ) from exc

    def checksum_of(self, relative_path: str) -> str:
        crc = 0
        with self.open_input(relative_path) as f:
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
        return format_checksum(crc)

    # --- _metadata ---

    @property
    def metadata_path(self) -> str:
        return posixpath.join(self.path, METADATA_FILE)

    def has_metadata(self) -> bool:
        return bool(self.fs.exists(self.metadata_path))

    def read_metadata_bytes(self) -> bytes:
        try:
            with self.fs.open(self.metadata_path, "rb") as f:
                return bytes(f.read())
        except FileNotFoundError as exc:
            raise MissingMetadata(
                f"snapshot {self.url} has no {METADATA_FILE}: it never completed (a checkpoint "
                "that failed or was cancelled before its commit); restore from an earlier one"
            ) from exc

    def commit_metadata(self, data: bytes) -> None:
        """Write ``_metadata`` once, atomically where the filesystem allows; never overwrite."""
        final = self.metadata_path
        exists_error = SnapshotFileExists(
            f"snapshot {self.url} already has a {METADATA_FILE}; a snapshot commits once: "
            "write a new snapshot instead"
        )
        if self.fs.exists(final):
            raise exists_error
        if _protocol(self.fs) in _OBJECT_STORE_PROTOCOLS:
            # one PUT with If-None-Match: the store refuses it if another commit got there first
            try:
                with _open_exclusive(self.fs, final, self.url) as f:
                    f.write(data)
            except FileExistsError as exc:
                raise exists_error from exc
            return
        local = isinstance(self.fs, LocalFileSystem)
        temp = posixpath.join(self.path, f"{METADATA_FILE}.inprogress-{uuid.uuid4().hex}")
        with _open_exclusive(self.fs, temp, self.url, durable=local) as f:
            f.write(data)
            if local:
                f.flush()
                os.fsync(f.fileno())
        try:
            if local:
                # link() is the atomic rename that refuses to replace an existing file; the
                # directory's flush makes the new name last (every data file was flushed on
                # close, before this: a _metadata on the disk never names a lost file)
                try:
                    os.link(temp, final)
                except FileExistsError as exc:
                    raise exists_error from exc
                fsync_path(self.path)
                # and the directory's own name, whoever made it (a rescale's spill, a retry)
                fsync_path(posixpath.dirname(self.path))
            else:
                if self.fs.exists(final):
                    raise exists_error
                self.fs.mv(temp, final)
        finally:
            if self.fs.exists(temp):
                self.fs.rm_file(temp)


class CheckpointStorage:
    """The checkpoint root of every job: layout, exclusive writes, discard and listing."""

    def __init__(self, root_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root_url = root_url
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = resolve_storage(root_url, self.storage_options)
        self.store = FileStore(self.fs)
        if _protocol(self.fs) in _OBJECT_STORE_PROTOCOLS:
            self.probe()

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.fs.unstrip_protocol(self.root)!r})"

    def probe(self) -> None:
        """Fail now, saying what to fix, if the storage is unreachable, refuses the credentials
        or lacks its bucket; a root with nothing in it yet is fine (the first write makes it).

        Object stores are probed when a storage is opened (one listing of the root), so a job
        fails at its start instead of at its first checkpoint or in a Spark task.
        """
        try:
            self.fs.ls(self.root, detail=False)
        except Exception as exc:
            failure = storage_failure(exc, self.root_url)
            if failure is not None:
                raise failure from exc
            if not isinstance(exc, FileNotFoundError):  # an empty root is no failure
                raise

    def url_of(self, relative_path: str = "") -> str:
        return str(self.fs.unstrip_protocol(self._abs(relative_path)))

    def _abs(self, relative_path: str) -> str:
        if not relative_path:
            return self.root
        rel = normalize_relative(relative_path, allow_shared=False, where=self.root_url)
        return posixpath.join(self.root, rel)

    # --- layout ---

    def job_dir(self, job: str) -> str:
        return validate_job_name(job)

    def shared_dir(self, job: str) -> str:
        return f"{validate_job_name(job)}/{SHARED_DIR}"

    def checkpoint_dir(self, job: str, checkpoint_id: int) -> str:
        return f"{validate_job_name(job)}/{checkpoint_dir_name(_checkpoint_id(checkpoint_id))}"

    def default_savepoint_dir(self, job: str, checkpoint_id: int) -> str:
        short = uuid.uuid4().hex[:8]
        return (
            f"{validate_job_name(job)}/{SAVEPOINTS_DIR}/"
            f"savepoint-{_checkpoint_id(checkpoint_id)}-{short}"
        )

    def checkpoint(self, job: str, checkpoint_id: int) -> SnapshotDir:
        """The directory of checkpoint ``checkpoint_id``; it may reach ``../shared/``."""
        return SnapshotDir(self.fs, self._abs(self.checkpoint_dir(job, checkpoint_id)))

    def savepoint(self, job: str, checkpoint_id: int, directory: str | None = None) -> SnapshotDir:
        """A savepoint directory: ``directory`` (a URL, or a path under the root) or the default.

        Savepoints are self-contained: they cannot reference shared files. A given directory
        must be new or empty.
        """
        if directory is None:
            return SnapshotDir(
                self.fs,
                self._abs(self.default_savepoint_dir(job, checkpoint_id)),
                allow_shared=False,
            )
        validate_job_name(job)
        if "://" in directory:
            snap = SnapshotDir.from_url(directory, self.storage_options, allow_shared=False)
        else:
            snap = SnapshotDir(self.fs, self._abs(directory), allow_shared=False)
        # A failed or cancelled savepoint removes its directory's files: a directory that already
        # holds anything (a job root, another snapshot, a user's files) must never be one.
        if snap.fs.exists(snap.path) and snap.fs.ls(snap.path, detail=False):
            raise InvalidSnapshotPath(
                f"savepoint directory {snap.url} is not empty: give the savepoint a new or empty "
                "directory of its own (or none, for the default under the job's savepoints/)"
            )
        return snap

    def snapshot(self, snapshot_dir: str) -> SnapshotDir:
        """A snapshot directory given relative to the root, or as an absolute URL."""
        if "://" in snapshot_dir:
            return SnapshotDir.from_url(snapshot_dir, self.storage_options)
        return SnapshotDir(self.fs, self._abs(snapshot_dir))

    # --- files ---

    def write_file(
        self, relative_path: str, data: bytes | Callable[[SnapshotFileWriter], object]
    ) -> FileInfo:
        """Write a file exclusively at ``relative_path`` (relative to the root)."""
        return SnapshotDir(self.fs, self.root, allow_shared=False).write_file(relative_path, data)

    def discard(self, snapshot_dir: str | SnapshotDir, keep: Iterable[str] = ()) -> list[str]:
        """Remove a snapshot directory's files except ``keep`` (snapshot-relative paths).

        For snapshots that failed or were cancelled: it leaves nothing behind. It never touches
        the job's ``shared/`` directory and refuses a directory that looks like a job root.
        Returns the removed paths (snapshot-relative).
        """
        snap = (
            snapshot_dir if isinstance(snapshot_dir, SnapshotDir) else self.snapshot(snapshot_dir)
        )
        fs, base = snap.fs, snap.path
        if posixpath.basename(base) in (SHARED_DIR, SAVEPOINTS_DIR) or base == self.root:
            raise InvalidSnapshotPath(
                f"{snap.url} is not a snapshot directory; discard takes a chk-<n> or savepoint "
                "directory"
            )
        if not fs.exists(base):
            return []
        children = {posixpath.basename(p.rstrip("/")) for p in fs.ls(base, detail=False)}
        if SHARED_DIR in children or any(c.startswith("chk-") for c in children):
            raise InvalidSnapshotPath(
                f"{snap.url} holds shared/ or chk-* directories, so it is a job root, not a "
                "snapshot; discard takes one snapshot directory"
            )
        keep_set = {normalize_relative(k, allow_shared=False, where=snap.url) for k in keep}
        removed: list[str] = []
        for abs_path in sorted(fs.find(base)):
            rel = posixpath.relpath(abs_path, base)
            if rel in keep_set:
                continue
            fs.rm_file(abs_path)
            removed.append(rel)
        if not keep_set and fs.exists(base):
            fs.rm(base, recursive=True)
        return removed

    def list_files(self, job: str) -> list[StoredFile]:
        """Every file under the job's root with size and modification time (one listing)."""
        return self.store.find(self._abs(self.job_dir(job)))

    # --- any location: a URL, or a path relative to the root ---

    def locate(self, location: str) -> tuple[FileStore, str]:
        """The store and path of ``location``: a URL (on this store's file system, with its
        options, or on its own), an absolute path on this file system, or a root-relative path."""
        if "://" in location:
            if self.store.handles(location):
                return self.store, self.store.path_of(location)
            return FileStore.at(location)
        if location.startswith("/"):
            return self.store, self.store.path_of(location)
        return self.store, self._abs(location)

    def path_of(self, location: str) -> str:
        """The file-system path of ``location`` (see :meth:`locate`)."""
        return self.locate(location)[1]

    def to_url(self, location: str) -> str:
        """``location`` as a canonical URL (see :meth:`locate`)."""
        store, path = self.locate(location)
        return store.url_of(path)

    def list_under(self, location: str) -> list[StoredFile]:
        """Every file under ``location`` (paths relative to it), one listing call."""
        store, path = self.locate(location)
        return store.find(path)

    def exists(self, location: str) -> bool:
        store, path = self.locate(location)
        return store.exists(path)

    def delete(self, location: str) -> bool:
        """Remove one file; False if it was already gone."""
        store, path = self.locate(location)
        return store.delete(path)

    def delete_many(
        self, locations: Iterable[str], after_each: Callable[[], object] | None = None
    ) -> list[str]:
        """Remove each file in ``locations``; returns those that existed (in order)."""
        removed = []
        for location in locations:
            if self.delete(location):
                if after_each is not None:
                    after_each()
                removed.append(location)
        return removed

    def remove_snapshot_dir(self, snapshot_dir: str | SnapshotDir) -> bool:
        """Remove a snapshot directory and everything in it; False if it did not exist."""
        snap = (
            snapshot_dir if isinstance(snapshot_dir, SnapshotDir) else self.snapshot(snapshot_dir)
        )
        return snap.remove()

    def remove_empty_dirs(
        self, urls: Iterable[str], stops: Iterable[str], keep: Iterable[str] = ()
    ) -> int:
        """:func:`remove_empty_dirs` on this storage's file system and options."""
        return remove_empty_dirs(urls, stops, keep, storage=self)


def _checkpoint_id(checkpoint_id: int) -> int:
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
        raise InvalidSnapshotPath(
            f"checkpoint id {checkpoint_id!r} is not a non-negative integer; checkpoint ids "
            "count up from 0 per job"
        )
    return checkpoint_id


def remove_empty_dirs(
    urls: Iterable[str],
    stops: Iterable[str],
    keep: Iterable[str] = (),
    storage: CheckpointStorage | None = None,
) -> int:
    """Remove each directory in ``urls`` and its empty parents, never a ``stops`` directory or
    anything above one, never a ``keep`` directory (a PENDING snapshot's) or ``shared/``;
    returns how many were removed. ``storage`` (with its options) resolves the URLs when
    given; otherwise each URL's own file system."""
    stop_list = [s.rstrip("/") for s in stops]
    keep_set = {k.rstrip("/") for k in keep}
    removed = 0
    for url in sorted({u.rstrip("/") for u in urls}, key=len, reverse=True):
        d = url
        while any(d.startswith(s + "/") for s in stop_list):
            if d in keep_set or posixpath.basename(d) == "shared":
                break
            store, path = storage.locate(d) if storage is not None else FileStore.at(d)
            try:
                if not store.exists(path) or not store.is_empty_dir(path):
                    break
                store.rmdir(path)
            except OSError:
                break  # not empty after all (a writer just created a file): leave it
            removed += 1
            d = posixpath.dirname(d)
    return removed
