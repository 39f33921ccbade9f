"""Where the files a Flink ``_metadata`` references are, on this machine.

Relative handles resolve against the snapshot's own directory. Absolute handles are normalised
(``.``, ``//``) and, when their ``<job-id>/{shared,taskowned,chk-N}/[<dir>/]<name>`` tail exists
under the job directory, re-rooted there and flagged ``relocated`` -- even when the path as
written exists too: it is then another spelling of the job directory (a link, a mount) or the
original of a copy, and the job's own file is the one its expire and orphan cleanup must see as
referenced. Inline handles carry their bytes and have no file.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Container, Iterable

from state_engine.errors import FlinkPathEscapes
from state_engine.flink.layout import (
    KIND_EXCLUSIVE,
    KIND_FOREIGN,
    KIND_INLINE,
    KIND_SHARED,
    KIND_TASKOWNED,
    METADATA_FILE,
    RELOCATABLE_TAIL,
    SHARED_DIR,
    TASKOWNED_DIR,
)
from state_engine.flink.metadata.records import (
    EMPTY_SEGMENT,
    FILE,
    INLINE,
    RELATIVE,
    LocalFiles,
    StreamHandle,
)

__all__ = [
    "PathResolver",
    "local_url",
    "metadata_file",
    "normalize_location",
]


def local_url(uri: str) -> str:
    """A Flink URI as storage addresses it (``file:/x`` -> ``/x``; other schemes unchanged)."""
    if uri.startswith("file://"):
        rest = uri[len("file://") :]
        return rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    if uri.startswith("file:"):
        return uri[len("file:") :]
    return uri


def normalize_location(loc: str) -> str:
    """``loc`` (a path or URL) with ``.``, ``..`` and doubled slashes folded, so that one file has
    one spelling (the scheme and host of a URL are kept as they are)."""
    scheme, sep, path = loc.rpartition("://")
    if sep:
        host, slash, rest = path.partition("/")
        return f"{scheme}://{host}{slash}{posixpath.normpath(rest) if rest else ''}".rstrip("/")
    if not loc:
        return loc
    norm = posixpath.normpath(loc)
    # POSIX keeps a leading "//" (implementation-defined); a local path never needs it
    return "/" + norm.lstrip("/") if norm.startswith("//") else norm


class PathResolver:
    """Resolves handle paths of one snapshot (relative names, absolute URIs, relocation).

    ``exists`` answers whether a location exists; the importer passes a lookup in its one
    listing, so resolving costs no extra I/O. ``listed``: locations known to exist (that
    listing's files), answered without calling ``exists``.
    """

    def __init__(
        self,
        directory: str,
        job_dir: str | None,
        exists: Callable[[str], bool],
        source: str,
        listed: Container[str] = (),
    ) -> None:
        self.directory = normalize_location(directory)
        self.job_dir = normalize_location(job_dir) if job_dir else None
        self.exists = exists
        self.listed = listed
        self.source = source
        # Everything below is derived once: resolve runs for every handle.
        self._join_base = self.directory.rstrip("/") + "/"
        self._dir_name = posixpath.basename(self.directory)
        self._own = self.directory + "/"
        self._job = f"{self.job_dir}/" if self.job_dir is not None else None
        # the snapshot's and the job's directories (handles there are not relocated)
        self._own_dirs = (self._own,) if self._job is None else (self._own, self._job)
        self._job_name = posixpath.basename(self.job_dir) if self.job_dir is not None else None
        self._shared = f"{self.job_dir}/{SHARED_DIR}/" if self.job_dir is not None else None
        self._taskowned = f"{self.job_dir}/{TASKOWNED_DIR}/" if self.job_dir is not None else None
        # handle directory as written -> (its normalised prefix, kind): see _absolute_location
        self._directories: dict[str, tuple[str | None, str | None]] = {}

    def resolve(self, h: StreamHandle) -> None:
        """Set ``h``'s ``location``, ``exists``, ``relocated`` and ``kind``."""
        if h.type in (INLINE, EMPTY_SEGMENT):
            h.kind = KIND_INLINE
            return
        if h.type == RELATIVE:
            loc = self._relative_location(h.name)
            h.location, h.exists, h.kind = loc, self.exists(loc), self._kind(loc)
            return
        loc, kind = self._absolute_location(h.name)
        if kind is None:
            moved = self._relocate(loc)
            if moved is not None:
                h.location, h.exists, h.relocated, h.kind = moved, True, True, self._kind(moved)
                return
            kind = self._kind(loc)
        h.location, h.exists, h.kind = loc, self.exists(loc), kind

    def resolve_all(self, handles: Iterable[StreamHandle]) -> None:
        """:meth:`resolve` each of ``handles``. A file handle in a directory an earlier handle's
        path already placed in the snapshot's or the job's directories (the thousands of SSTs in
        ``shared/``) is resolved here, without the calls."""
        directories = self._directories
        exists, listed = self.exists, self.listed
        resolve = self.resolve
        for h in handles:
            if h.type == FILE:
                name = h.name
                cut = name.rfind("/") + 1
                folded = directories.get(name[:cut]) if cut else None
                if folded is not None and folded[1] is not None:
                    file_name = name[cut:]
                    if file_name and file_name != "." and file_name != "..":
                        loc = folded[0] + file_name  # type: ignore[operator]
                        h.location, h.kind = loc, folded[1]
                        h.exists = loc in listed or exists(loc)
                        continue
            resolve(h)

    def resolve_files(self, files: LocalFiles) -> None:
        """Resolve a RocksDB handle's files. Kept as columns (see :class:`LocalFiles`) when every
        plain one is a file name in one directory, of the snapshot's or the job's or re-rooted
        into the job's, and found there (the thousands of SSTs in ``shared/``): then one
        location each, and one kind and relocation for all, the very ones :meth:`resolve`
        gives (and the inline ones their kind). Any other: each handle through
        :meth:`resolve_all`."""
        if not self._resolve_as_columns(files):
            self.resolve_all(files.handles)

    def _resolve_as_columns(self, files: LocalFiles) -> bool:
        """:meth:`resolve_files`'s columns, set if they can be (see there)."""
        paths = files.paths
        if not paths or files.locations is not None:
            return False
        cut = paths[0].rfind("/") + 1
        head = paths[0][:cut]
        names = [p[cut:] for p in paths]
        # every path is head + a file name ("", "." and ".." are not file names)
        if (
            not cut
            or [head + name for name in names] != paths
            or "/" in "".join(names)
            or "" in names
            or "." in names
            or ".." in names
        ):
            return False
        folded = self._directories.get(head)
        if folded is None:
            folded = self._directories[head] = self._fold_directory(head)
        prefix, kind = folded
        relocated = False
        if kind is None and prefix is not None:
            prefix = self._relocated_directory(prefix)
            if prefix is not None:
                kind, relocated = self._kind(prefix), True
        if kind is None or prefix is None:
            return False
        locations = [prefix + name for name in names]
        listed, exists = self.listed, self.exists
        if not all(map(listed.__contains__, locations)) and not all(
            loc in listed or exists(loc) for loc in locations
        ):
            return False
        files.locations, files.directory = locations, prefix
        files.kind, files.relocated = kind, relocated
        for h in files.inline.values():
            self.resolve(h)  # inline: no file, its kind
        return True

    def _relocated_directory(self, prefix: str) -> str | None:
        """The job's own directory the files ``prefix + name`` (a plain file name) are
        re-rooted into by :meth:`_relocate`'s first rule (``<job>/{shared,taskowned,chk-N}/``
        tails), whatever the name; None if that rule does not apply. (Only where each file is
        found is it re-rooted, as there.)"""
        m = RELOCATABLE_TAIL.search(prefix + "x")  # "x": any file name; group 3 ends with it
        if m is None or self._job is None or m.group(1) != self._job_name:
            return None
        return f"{self._job}{m.group(2)}/{m.group(3)[:-1]}"

    def _relative_location(self, name: str) -> str:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise FlinkPathEscapes(
                f"{self.source}: relative state handle {name!r} is not a bare file name "
                "inside the snapshot directory; refusing to follow it (the _metadata is "
                "corrupt or was tampered with)"
            )
        return self._join_base + name

    def _absolute_location(self, name: str) -> tuple[str, str | None]:
        """``(location, kind)`` of an absolute handle's path: normalised (refused if it has
        ``..``); the kind if it lies in the snapshot's or the job's directory, else None.

        A snapshot's handles share a few directories: each is normalised and classified once,
        and a file name in it (a plain path component) only appended.
        """
        cut = name.rfind("/") + 1
        file_name = name[cut:]
        if cut and file_name not in ("", ".", ".."):
            head = name[:cut]
            folded = self._directories.get(head)
            if folded is None:
                folded = self._directories[head] = self._fold_directory(head)
            prefix, kind = folded
            if prefix is not None:
                return prefix + file_name, kind
        loc = self._normalized(name)
        return loc, self._kind(loc) if loc.startswith(self._own_dirs) else None

    def _fold_directory(self, head: str) -> tuple[str | None, str | None]:
        """``(prefix, kind)`` shared by the handle paths ``head + name`` (``head`` ends with '/',
        ``name`` is a file name: not empty, '.' or '..'). Their normalised location is
        ``prefix + name``, as normalising works on whole components and the name is one, and
        their kind is ``kind``, as the kinds' prefixes end with '/' and the name has none.
        ``(None, None)`` if such paths are refused (``..``): each is, under its own name.
        """
        try:
            probe = self._normalized(head + "x")  # "x": any file name
        except FlinkPathEscapes:
            return None, None
        prefix = probe[:-1]
        return prefix, self._kind(prefix) if prefix.startswith(self._own_dirs) else None

    def _normalized(self, name: str) -> str:
        """The normalised location of an absolute handle's path (refused if it has ``..``)."""
        loc = local_url(name)
        if "/../" in loc or loc.endswith("/..") or loc.startswith("../"):
            raise FlinkPathEscapes(
                f"{self.source}: state handle path {name!r} contains '..'; refusing to "
                "follow it (the _metadata is corrupt or was tampered with)"
            )
        return normalize_location(loc)

    def _relocate(self, loc: str) -> str | None:
        """The job's (or snapshot's) own file with ``loc``'s tail, if there is one."""
        m = RELOCATABLE_TAIL.search(loc)
        if m and self._job is not None and m.group(1) == self._job_name:
            candidate = f"{self._job}{m.group(2)}/{m.group(3)}"
            if self.exists(candidate):
                return candidate
        # Absolute handles into the snapshot's own directory (savepoints with entropy injection).
        parent, name = posixpath.split(loc)
        if posixpath.basename(parent) == self._dir_name:
            candidate = self._join_base + name
            if self.exists(candidate):
                return candidate
        return None

    def _kind(self, loc: str) -> str:
        if loc.startswith(self._own):
            return KIND_EXCLUSIVE
        if self._shared is not None and loc.startswith(self._shared):
            return KIND_SHARED
        if self._taskowned is not None and loc.startswith(self._taskowned):
            return KIND_TASKOWNED
        return KIND_FOREIGN


def metadata_file(path_or_url: str) -> str:
    """The ``_metadata`` path for a snapshot directory or a ``_metadata`` path."""
    p = local_url(str(path_or_url)).rstrip("/")
    return p if posixpath.basename(p) == METADATA_FILE else p + "/" + METADATA_FILE
