"""Reader of Apache Flink ``_metadata`` files (versions 3 to 6) into typed records.

One call: :func:`read_metadata` (``path_or_url`` of a ``_metadata`` file or of the directory
holding it) returns a :class:`FlinkSnapshotMetadata`. The layout is Flink's
``MetadataV2V3SerializerBase`` and ``MetadataV3/V4/V5/V6Serializer`` (see ``FLINK_FORMAT.md`` §2):
big-endian integers, Java modified UTF-8 strings, one tag byte per state handle and, from version 4
on, a Java-serialized ``CheckpointProperties`` at the end that says checkpoint or savepoint,
canonical or native.

Paths (FLINK_FORMAT.md §3): relative handles resolve against the snapshot's own directory;
absolute handles are normalised (``.``, ``//``) and, when their
``<job-id>/{shared,taskowned,chk-N}/[<dir>/]<name>`` tail exists under the job directory (file
merging's physical files are one directory deeper), re-rooted there
and flagged ``relocated`` -- even when the path as written exists too: it is then another spelling
of the job directory (a link, a mount) or the original of a copy, and the job's own file is the one
its expire and orphan cleanup must see as referenced. Inline handles (``ByteStreamStateHandle``)
carry their bytes and have no file.

Every malformed, truncated or unknown input is a :class:`~state_engine.errors.FlinkMetadataError`
naming the file, the byte offset and what was expected there.
"""

from __future__ import annotations

import posixpath
import re
import struct
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from state_engine.errors import (
    FlinkMetadataError,
    FlinkPathEscapes,
    UnsupportedFlinkMetadataVersion,
)
from state_engine.flink.javaser import JavaEnum, JavaObject, decode_modified_utf8, read_java_object
from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot.storage import FileStore, open_url

METADATA_FILE_NAME = "_metadata"
HEADER_MAGIC_NUMBER = 0x4960672D
MASTER_STATE_MAGIC = 0xC96B1696
SUPPORTED_VERSIONS = (3, 4, 5, 6)

# Stream handle types (StreamHandle.type).
INLINE = "inline"  # ByteStreamStateHandle: bytes inside _metadata, no file
FILE = "file"  # FileStateHandle: absolute URI
RELATIVE = "relative"  # RelativeFileStateHandle: bare name in the snapshot's directory
SEGMENT = "segment"  # SegmentFileStateHandle: a range of a (file-merging) physical file
EMPTY_SEGMENT = "empty-segment"

# Keyed state handle types (KeyedStateHandle.type).
KEY_GROUPS = "key-groups"  # heap checkpoints, hashmap native savepoints (tag 12, legacy 3)
SAVEPOINT_KEY_GROUPS = "savepoint-key-groups"  # canonical savepoints (tag 7)
INCREMENTAL = "incremental"  # RocksDB checkpoints and native savepoints (tag 11, legacy 5)
CHANGELOG = "changelog"  # tags 8 / 14
CHANGELOG_BYTES = "changelog-bytes"  # tag 9
CHANGELOG_FILE = "changelog-file"  # tags 10 / 13

# Roles of referenced files (FileReference.role).
ROLE_COORDINATOR = "coordinator"
ROLE_OPERATOR_STATE = "operator-state"
ROLE_KEYED_STATE = "keyed-state"
ROLE_META = "meta"
ROLE_SHARED = "shared"
ROLE_PRIVATE = "private"
ROLE_CHANNEL_STATE = "channel-state"
ROLE_CHANGELOG = "changelog"

# Where a file lives (StreamHandle.kind).
KIND_INLINE = "inline"
KIND_EXCLUSIVE = "exclusive"  # the snapshot's own directory
KIND_SHARED = "shared"  # <job>/shared
KIND_TASKOWNED = "taskowned"  # <job>/taskowned
KIND_FOREIGN = "foreign"  # anywhere else (another checkpoint, a NO_CLAIM ancestor's directory)

_CHK_DIR = re.compile(r"^chk-(\d+)$")
#: ``<job-id>/{shared,taskowned,chk-N}/[<dir>/]<name>``: file merging (FLIP-306) keeps its
#: physical files one directory deeper (``shared/job_<id>_op_<op>_<i>_<p>/``,
#: ``taskowned/job_<id>_tm_<tm>/``)
_RELOCATABLE_TAIL = re.compile(r"/([^/]+)/(shared|taskowned|chk-\d+)/((?:[^/]+/)?[^/]+)$")


@dataclass(frozen=True)
class KeyGroupRange:
    """Key groups ``start..end`` inclusive (Flink's ``KeyGroupRange``); empty if ``end < start``."""

    start: int
    end: int

    @classmethod
    def of(cls, start: int, count: int) -> KeyGroupRange:
        return cls(start, start + count - 1)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))


@dataclass
class StreamHandle:
    """One stream state handle: a file, a part of a file, or bytes inline in ``_metadata``.

    * ``type``: :data:`INLINE`, :data:`FILE`, :data:`RELATIVE`, :data:`SEGMENT` or
      :data:`EMPTY_SEGMENT`.
    * ``name``: the path exactly as written: the would-be file name of an inline handle (no such
      file exists), the URI of a file handle, the bare name of a relative handle, the physical file
      of a segment.
    * ``size``: bytes of state (inline: ``len(data)``; segment: the segment's length).
    * ``data``: the inline bytes (``None`` for every other type).
    * ``start_pos``: segment start inside its physical file (0 otherwise).
    * ``location``: where to read it on this machine (a local path or an fsspec URL), after
      resolution and relocation; ``None`` for inline and empty handles.
    * ``relocated``: ``location`` is not the absolute path as written but its tail re-rooted under
      the job (or snapshot) directory.
    * ``exists``: whether ``location`` was found (``None`` for inline/empty handles).
    * ``kind``: :data:`KIND_INLINE`, :data:`KIND_EXCLUSIVE`, :data:`KIND_SHARED`,
      :data:`KIND_TASKOWNED` or :data:`KIND_FOREIGN`.
    """

    type: str
    name: str
    size: int
    data: bytes | None = None
    start_pos: int = 0
    logical_id: str = ""
    scope: str = ""
    location: str | None = None
    relocated: bool = False
    exists: bool | None = None
    kind: str = ""

    @property
    def inline(self) -> bool:
        return self.type == INLINE

    def read_bytes(self) -> bytes:
        """The handle's bytes (inline data, or the file/segment read from storage)."""
        if self.type == INLINE:
            return self.data or b""
        if self.type == EMPTY_SEGMENT or self.location is None:
            return b""
        with open_url(self.location) as f:
            if self.type == SEGMENT:
                f.seek(self.start_pos)
                segment: bytes = f.read(self.size)
                return segment
            data: bytes = f.read()
            return data


@dataclass(frozen=True, init=False)
class LocalFile:
    """A RocksDB file of an incremental handle: its name in the RocksDB directory and its handle."""

    local_path: str
    handle: StreamHandle

    def __init__(self, local_path: str, handle: StreamHandle) -> None:
        # Set through __dict__: the generated __init__ of a frozen dataclass pays an
        # object.__setattr__ per field (1.7x the cost), and a checkpoint has tens of thousands.
        fields = self.__dict__
        fields["local_path"] = local_path
        fields["handle"] = handle


class LocalFiles(Sequence[LocalFile]):
    """The files of a RocksDB handle as columns, their local names and their handles, read as
    :class:`LocalFile` records: an incremental checkpoint lists tens of thousands, and the
    importer reads the columns (no object per file). Equal to another sequence of the same
    records, a tuple of them included.

    As read from ``_metadata`` (see :meth:`of_files`), the plain file handles are kept as two
    more columns, their paths as written and their sizes, and the few inline ones (files Flink
    wrote into ``_metadata`` for being small) by position. :meth:`PathResolver.resolve_files`
    adds the plain ones' ``locations``, all of them files right in one ``directory`` (ending
    in '/'), one ``kind`` for all (every file found where that kind's directory lists it) and
    whether they were re-rooted (``relocated``, one for all).
    The :class:`StreamHandle` objects of the plain ones are made when ``handles`` is first
    read, with what resolution set; from then on the objects are what holds it (the columns
    are dropped: ``in_columns`` is False and ``locations`` None)."""

    __slots__ = (
        "_handles",
        "directory",
        "inline",
        "kind",
        "locations",
        "names",
        "paths",
        "relocated",
        "sizes",
    )

    def __init__(self, names: Sequence[str] = (), handles: Sequence[StreamHandle] = ()) -> None:
        if len(names) != len(handles):
            raise ValueError(f"{len(names)} local names for {len(handles)} handles")
        self.names = names
        self._handles: Sequence[StreamHandle] | None = handles
        self.paths: list[str] | None = None
        self.sizes: list[int] | None = None
        self.inline: dict[int, StreamHandle] = {}
        self.locations: list[str] | None = None
        self.directory = ""
        self.kind = ""
        self.relocated = False

    @classmethod
    def of_files(
        cls,
        names: list[str],
        paths: list[str],
        sizes: list[int],
        inline: dict[int, StreamHandle] | None = None,
    ) -> LocalFiles:
        """Files as columns: every local name; the paths as written and the sizes of the plain
        file handles (:data:`FILE`), in order; ``inline``: position -> the handle of each
        other one, an inline handle (:data:`INLINE`)."""
        inline = inline or {}
        if len(paths) != len(sizes) or len(paths) + len(inline) != len(names):
            raise ValueError(
                f"{len(names)} local names for {len(paths)} paths, {len(sizes)} sizes and "
                f"{len(inline)} inline handles"
            )
        if any(not 0 <= i < len(names) or h.type != INLINE for i, h in inline.items()):
            raise ValueError("inline handles are inline, each at a position among the names")
        out = cls()
        out.names, out._handles, out.paths, out.sizes, out.inline = (
            names,
            None,
            paths,
            sizes,
            inline,
        )
        return out

    @property
    def in_columns(self) -> bool:
        """Whether the files are kept as columns (no handle of a plain file made yet)."""
        return self._handles is None

    @property
    def file_names(self) -> list[str]:
        """The local names of the plain file handles, position for position with ``paths``."""
        if not self.inline:
            return list(self.names)
        return [name for i, name in enumerate(self.names) if i not in self.inline]

    @property
    def handles(self) -> Sequence[StreamHandle]:
        """The files' handles (made here, once, for files kept as columns)."""
        if self._handles is None:
            assert self.paths is not None and self.sizes is not None
            if self.locations is None:
                plain = [
                    StreamHandle(FILE, p, n) for p, n in zip(self.paths, self.sizes, strict=True)
                ]
            else:
                kind, relocated = self.kind, self.relocated
                plain = [
                    StreamHandle(
                        FILE, p, n, location=loc, relocated=relocated, exists=True, kind=kind
                    )
                    for p, n, loc in zip(self.paths, self.sizes, self.locations, strict=True)
                ]
            for i in sorted(self.inline):  # in position order: each lands where it was
                plain.insert(i, self.inline[i])
            self._handles = plain
            self.paths = self.sizes = self.locations = None
            self.inline, self.directory = {}, ""
        return self._handles

    @classmethod
    def of(cls, files: Iterable[LocalFile]) -> LocalFiles:
        listed = list(files)
        return cls([f.local_path for f in listed], [f.handle for f in listed])

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> LocalFile: ...
    @overload
    def __getitem__(self, i: slice) -> LocalFiles: ...
    def __getitem__(self, i: int | slice) -> LocalFile | LocalFiles:
        if isinstance(i, slice):
            return LocalFiles(self.names[i], self.handles[i])
        return LocalFile(self.names[i], self.handles[i])

    def __iter__(self) -> Iterator[LocalFile]:
        return map(LocalFile, self.names, self.handles)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LocalFiles):
            return list(self.names) == list(other.names) and list(self.handles) == list(
                other.handles
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable handles: not hashable, as a list

    def __repr__(self) -> str:
        return f"LocalFiles({list(self)!r})"


class _HandlesOf(Sequence[StreamHandle]):
    """The handles of a :class:`LocalFiles`, made only when one is read (a run's length and the
    importer's columns need none)."""

    __slots__ = ("files",)

    def __init__(self, files: LocalFiles) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files.names)

    @overload
    def __getitem__(self, i: int) -> StreamHandle: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[StreamHandle]: ...
    def __getitem__(self, i: int | slice) -> StreamHandle | Sequence[StreamHandle]:
        return self.files.handles[i]

    def __iter__(self) -> Iterator[StreamHandle]:
        return iter(self.files.handles)


@dataclass
class KeyedStateHandle:
    """A keyed state handle of one subtask.

    * ``type``: :data:`KEY_GROUPS` (heap checkpoints and hashmap native savepoints),
      :data:`SAVEPOINT_KEY_GROUPS` (canonical savepoints), :data:`INCREMENTAL` (RocksDB checkpoints
      and native savepoints), or a changelog type.
    * ``key_groups``: the key-group range the handle covers.
    * ``offsets``: for key-groups types, the byte offset of each key group ``key_groups.start + i``
      in ``delegate`` (0 in a canonical savepoint = the key group has no data).
    * ``delegate``: the data stream of key-groups types.
    * ``handle_id``: Flink's ``stateHandleId`` ("" where the version does not write one).
    * incremental only: ``checkpoint_id`` (of the backend's snapshot), ``backend_id`` (UUID),
      ``checkpointed_size`` (incremental bytes), ``meta`` (the KeyedBackendSerializationProxy
      bytes), ``shared`` and ``private`` (RocksDB files by their local names: SSTs; MANIFEST,
      CURRENT, OPTIONS).
    * changelog only: ``nested`` keyed handles, ``changelog_files`` stream handles.
    """

    type: str
    key_groups: KeyGroupRange
    offsets: tuple[int, ...] = ()
    delegate: StreamHandle | None = None
    handle_id: str = ""
    checkpoint_id: int = -1
    backend_id: str = ""
    checkpointed_size: int = 0
    meta: StreamHandle | None = None
    shared: LocalFiles = field(default_factory=LocalFiles)
    private: LocalFiles = field(default_factory=LocalFiles)
    nested: tuple[KeyedStateHandle, ...] = ()
    changelog_files: tuple[StreamHandle, ...] = ()

    def offset_of(self, key_group: int) -> int:
        """Byte offset of ``key_group`` in ``delegate`` (key-groups types only)."""
        if key_group not in self.key_groups or not self.offsets:
            raise KeyError(f"key group {key_group} is not in this handle's range {self.key_groups}")
        return self.offsets[key_group - self.key_groups.start]

    def stream_handles(self) -> Iterator[tuple[str, StreamHandle, str]]:
        """Every stream handle below this one as ``(role, handle, local_path)``."""
        for role, handles, files in self.handle_runs():
            local_paths = files.names if files is not None else ()
            for i, h in enumerate(handles):
                yield role, h, local_paths[i] if local_paths else ""

    def handle_runs(
        self,
    ) -> Iterator[tuple[str, Sequence[StreamHandle], LocalFiles | None]]:
        """The stream handles below this one, a run per role in :meth:`stream_handles` order:
        ``(role, handles, files)``, ``files`` the RocksDB shared or private files the run's
        handles are (their handles made only when read), None for the other roles."""
        if self.delegate is not None:
            yield ROLE_KEYED_STATE, (self.delegate,), None
        if self.meta is not None:
            yield ROLE_META, (self.meta,), None
        for role, files in ((ROLE_SHARED, self.shared), (ROLE_PRIVATE, self.private)):
            if files:
                yield role, _HandlesOf(files), files
        if self.changelog_files:
            yield ROLE_CHANGELOG, self.changelog_files, None
        for nested in self.nested:
            yield from nested.handle_runs()


@dataclass(frozen=True)
class OperatorStateEntry:
    """One named operator state of an operator state handle: distribution mode, element offsets."""

    name: str
    mode: str  # SPLIT_DISTRIBUTE, UNION or BROADCAST
    offsets: tuple[int, ...]


@dataclass
class OperatorStateHandle:
    """Operator (non-keyed) state of one subtask: its named states and the stream holding them."""

    states: tuple[OperatorStateEntry, ...]
    delegate: StreamHandle | None


@dataclass
class ChannelStateHandle:
    """Unaligned-checkpoint channel state (input or output) of one subtask."""

    direction: str  # "input" or "output"
    subtask: int
    delegate: StreamHandle | None
    size: int


@dataclass
class SubtaskState:
    """The state of one subtask of an operator; ``finished`` subtasks carry no handles."""

    index: int
    finished: bool = False
    managed_operator_state: OperatorStateHandle | None = None
    raw_operator_state: OperatorStateHandle | None = None
    managed_keyed_state: KeyedStateHandle | None = None
    raw_keyed_state: KeyedStateHandle | None = None
    input_channel_state: tuple[ChannelStateHandle, ...] = ()
    output_channel_state: tuple[ChannelStateHandle, ...] = ()

    @property
    def keyed_handles(self) -> tuple[KeyedStateHandle, ...]:
        return tuple(h for h in (self.managed_keyed_state, self.raw_keyed_state) if h is not None)

    @property
    def key_groups(self) -> KeyGroupRange | None:
        """The key-group range of the managed keyed state (``None`` without keyed state)."""
        return self.managed_keyed_state.key_groups if self.managed_keyed_state is not None else None


@dataclass
class OperatorState:
    """One operator of the job: ids, parallelism and its subtasks' state.

    ``operator_id`` is Flink's ``OperatorID.toString()`` (32 hex digits); ``name`` and ``uid``
    are "" where the metadata version does not store them (before version 5) or the job set none.
    """

    operator_id: str
    name: str
    uid: str
    parallelism: int
    max_parallelism: int
    coordinator_state: StreamHandle | None = None
    subtasks: list[SubtaskState] = field(default_factory=list)
    fully_finished: bool = False

    @property
    def has_keyed_state(self) -> bool:
        return any(s.keyed_handles for s in self.subtasks)


@dataclass(frozen=True, slots=True)
class HandleRun:
    """Stream handles of one role that one state handle of a subtask holds in a row: a RocksDB
    handle's shared files, its private ones, a key-groups stream, an operator's coordinator
    state. ``files``: the RocksDB shared or private files a run of those is (its handles made
    only when read; see :class:`LocalFiles`), None for the other roles; ``key_groups``/``offsets``
    as in :class:`FileReference`. A snapshot's runs are its references without an object per
    handle.
    """

    role: str
    operator_id: str
    subtask: int
    handles: Sequence[StreamHandle]
    files: LocalFiles | None = None
    key_groups: KeyGroupRange | None = None
    offsets: tuple[int, ...] = ()

    @property
    def local_paths(self) -> Sequence[str]:
        """The RocksDB file names of the handles, position for position (empty: no RocksDB
        files)."""
        return self.files.names if self.files is not None else ()

    def references(self) -> Iterator[FileReference]:
        local = self.local_paths
        for i, h in enumerate(self.handles):
            yield FileReference(
                self.role,
                h,
                self.operator_id,
                self.subtask,
                local[i] if local else "",
                self.key_groups,
                self.offsets,
            )


@dataclass(frozen=True, init=False)
class FileReference:
    """One handle of a snapshot with why it is referenced.

    ``role`` is one of the ``ROLE_*`` constants; ``local_path`` is the RocksDB file name of shared
    and private handles; ``key_groups``/``offsets`` repeat the enclosing keyed handle's range and
    offsets (offsets only for key-groups delegates).
    """

    role: str
    handle: StreamHandle
    operator_id: str
    subtask: int
    local_path: str = ""
    key_groups: KeyGroupRange | None = None
    offsets: tuple[int, ...] = ()

    def __init__(
        self,
        role: str,
        handle: StreamHandle,
        operator_id: str,
        subtask: int,
        local_path: str = "",
        key_groups: KeyGroupRange | None = None,
        offsets: tuple[int, ...] = (),
    ) -> None:
        # Set through __dict__, as LocalFile's (3x faster): one reference per handle.
        fields = self.__dict__
        fields["role"] = role
        fields["handle"] = handle
        fields["operator_id"] = operator_id
        fields["subtask"] = subtask
        fields["local_path"] = local_path
        fields["key_groups"] = key_groups
        fields["offsets"] = offsets


@dataclass
class FlinkSnapshotMetadata:
    """A Flink checkpoint or savepoint as its ``_metadata`` describes it.

    * ``metadata_path``: the ``_metadata`` file read; ``directory``: the snapshot's directory (where
      relative handles live); ``job_dir``: the job's checkpoint directory used for re-rooting
      (``None`` when unknown, e.g. a savepoint read on its own).
    * ``version``: the metadata format version (3-6); ``metadata_size``: bytes of ``_metadata``.
    * ``checkpoint_id``; ``kind``: ``"checkpoint"`` or ``"savepoint"``; ``format``:
      ``"canonical"`` or ``"native"`` (checkpoints are native); ``snapshot_type``: Flink's type
      name (``"Checkpoint"``, ``"Full Checkpoint"``, ``"Savepoint"``, ...); ``sharing``: the
      checkpoint's ``sharingFilesStrategy`` ("" for savepoints); ``properties``: the whole
      decoded ``CheckpointProperties`` (``None`` before version 4).
    * ``operators``: every operator, in file order.
    """

    metadata_path: str
    directory: str
    job_dir: str | None
    version: int
    checkpoint_id: int
    kind: str
    format: str
    snapshot_type: str
    sharing: str
    properties: JavaObject | None
    master_states: int
    operators: list[OperatorState]
    metadata_size: int

    @property
    def parallelism(self) -> int:
        """The largest parallelism of an operator with keyed state (of any operator if none has)."""
        keyed = [op.parallelism for op in self.operators if op.has_keyed_state]
        return max(keyed or [op.parallelism for op in self.operators] or [0])

    @property
    def max_parallelism(self) -> int:
        keyed = [op.max_parallelism for op in self.operators if op.has_keyed_state]
        return max(keyed or [op.max_parallelism for op in self.operators] or [0])

    def operator(self, uid_or_id: str) -> OperatorState:
        """The operator whose uid, name or id is ``uid_or_id``."""
        for op in self.operators:
            if uid_or_id in (op.uid, op.operator_id):
                return op
        for op in self.operators:
            if op.name == uid_or_id:
                return op
        known = ", ".join(f"{op.uid or '-'}/{op.operator_id}" for op in self.operators)
        raise KeyError(f"{self.metadata_path}: no operator {uid_or_id!r} (uid/id: {known})")

    def handle_runs(self) -> list[HandleRun]:
        """Every handle of the snapshot, inline ones included, as runs (see :class:`HandleRun`)
        in file order: per operator its coordinator state, then per subtask its operator
        state, its keyed state handles' streams and its channel state."""
        cached: list[HandleRun] | None = self.__dict__.get("_runs")
        if cached is not None:
            return cached
        out: list[HandleRun] = []
        add = out.append
        for op in self.operators:
            op_id = op.operator_id
            if op.coordinator_state is not None:
                add(HandleRun(ROLE_COORDINATOR, op_id, -1, (op.coordinator_state,)))
            for st in op.subtasks:
                index = st.index
                for oh in (st.managed_operator_state, st.raw_operator_state):
                    if oh is not None and oh.delegate is not None:
                        add(HandleRun(ROLE_OPERATOR_STATE, op_id, index, (oh.delegate,)))
                for kh in st.keyed_handles:
                    kgr, offsets = kh.key_groups, kh.offsets
                    for role, handles, files in kh.handle_runs():
                        offs = offsets if role == ROLE_KEYED_STATE else ()
                        add(HandleRun(role, op_id, index, handles, files, kgr, offs))
                channels = [
                    ch.delegate
                    for ch in (*st.input_channel_state, *st.output_channel_state)
                    if ch.delegate is not None
                ]
                if channels:
                    add(HandleRun(ROLE_CHANNEL_STATE, op_id, index, channels))
        # computed once: the records are not changed after reading (the importer asks often)
        self.__dict__["_runs"] = out
        return out

    def references(self) -> list[FileReference]:
        """Every handle of the snapshot with its role, inline ones included, in file order."""
        cached: list[FileReference] | None = self.__dict__.get("_references")
        if cached is None:
            cached = [ref for run in self.handle_runs() for ref in run.references()]
            self.__dict__["_references"] = cached
        return cached

    def file_references(self) -> list[FileReference]:
        """References to on-disk files (inline and empty handles left out)."""
        return [r for r in self.references() if r.handle.location is not None]

    def files(self) -> dict[str, StreamHandle]:
        """Distinct physical files by location (segments of one file counted once)."""
        out: dict[str, StreamHandle] = {}
        for r in self.file_references():
            assert r.handle.location is not None
            out.setdefault(r.handle.location, r.handle)
        return out

    @property
    def referenced_bytes(self) -> int:
        """Bytes of the distinct on-disk files the snapshot references (segments: their lengths)."""
        total = 0
        seen: set[tuple[str, int]] = set()
        for r in self.file_references():
            key = (r.handle.location or "", r.handle.start_pos)
            if key not in seen:
                seen.add(key)
                total += r.handle.size
        return total

    @property
    def inline_handles(self) -> list[StreamHandle]:
        return [
            h
            for run in self.handle_runs()
            for h in (
                run.files.inline.values()
                if run.files is not None and run.files.in_columns
                else run.handles
            )
            if h.type == INLINE
        ]


class _Reader:
    """Big-endian cursor over one ``_metadata`` file's bytes; failures name file and offset."""

    __slots__ = ("data", "pos", "source")

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.pos = 0
        self.source = source

    def fail(self, expected: str, at: int | None = None) -> FlinkMetadataError:
        where = self.pos if at is None else at
        return FlinkMetadataError(
            f"{self.source}: at byte offset {where} expected {expected}; the file is truncated, "
            "corrupt or not a Flink _metadata file (point at a completed checkpoint or savepoint)"
        )

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{what} ({n} bytes), found only {len(self.data) - self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i8(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise self.fail(f"{what} (1 byte), found end of file")
        v = self.data[self.pos]
        self.pos += 1
        return v

    def i32(self, what: str) -> int:
        value: int = struct.unpack(">i", self.take(4, what))[0]
        return value

    def i64(self, what: str) -> int:
        value: int = struct.unpack(">q", self.take(8, what))[0]
        return value

    def count(self, what: str, limit: int = 1 << 24) -> int:
        at = self.pos
        n = self.i32(what)
        if not 0 <= n <= limit or n > len(self.data) - self.pos + 1:
            raise self.fail(f"{what} between 0 and the bytes left, found {n}", at)
        return n

    def utf(self, what: str) -> str:
        data, pos = self.data, self.pos
        end = pos + 2 + ((data[pos] << 8) | data[pos + 1]) if pos + 2 <= len(data) else -1
        if 0 <= end <= len(data):
            # the common case (an ASCII path or name) without building any error text
            try:
                text = data[pos + 2 : end].decode("ascii")
            except UnicodeDecodeError:
                pass
            else:
                self.pos = end
                return text
        n = struct.unpack(">H", self.take(2, f"length of {what}"))[0]
        at = self.pos
        raw = self.take(n, what)
        try:
            return decode_modified_utf8(raw)
        except UnicodeDecodeError:
            raise self.fail(f"{what} as Java modified UTF-8", at) from None


def _read_stream_handle(r: _Reader) -> StreamHandle | None:
    at = r.pos
    tag = r.i8("a stream state handle type (0, 1, 2, 3, 6, 15 or 16)")
    if tag == 0:
        return None
    if tag == 1:
        name = r.utf("the inline handle's name")
        n = r.count("the inline handle's length", 1 << 31)
        return StreamHandle(INLINE, name, n, data=r.take(n, "inline state bytes"))
    if tag == 2:
        size = r.i64("the file handle's size")
        return StreamHandle(FILE, r.utf("the file handle's path"), size)
    if tag == 6:
        name = r.utf("the relative file handle's name")
        return StreamHandle(RELATIVE, name, r.i64("the relative file handle's size"))
    if tag == 3:
        # A legacy KeyGroupsStateHandle used as a stream handle: its delegate is the data.
        r.i32("start key group")
        n = r.count("number of key groups")
        r.take(8 * n, "key-group offsets")
        return _read_stream_handle(r)
    if tag == 15:
        start = r.i64("the segment's start position")
        size = r.i64("the segment's size")
        scope = r.i32("the segment's scope (0 exclusive, 1 shared)")
        path = r.utf("the segment's physical file path")
        logical = r.utf("the segment's logical file id")
        return StreamHandle(
            SEGMENT,
            path,
            size,
            start_pos=start,
            logical_id=logical,
            scope="shared" if scope == 1 else "exclusive",
        )
    if tag == 16:
        return StreamHandle(EMPTY_SEGMENT, "", 0)
    raise r.fail("a stream state handle type (0, 1, 2, 3, 6, 15 or 16), found " + str(tag), at)


def _read_key_groups(r: _Reader) -> tuple[KeyGroupRange, tuple[int, ...]]:
    start = r.i32("start key group")
    n = r.count("number of key groups", 1 << 16)
    raw = r.take(8 * n, "key-group offsets")
    return KeyGroupRange.of(start, n), struct.unpack(f">{n}q", raw)


_I64_FROM = struct.Struct(">q").unpack_from


def _read_local_files(r: _Reader, what: str) -> LocalFiles:
    names: list[str] = []
    paths: list[str] = []
    sizes: list[int] = []
    inline: dict[int, StreamHandle] = {}  # position -> an inline handle (a small file)
    handles: list[StreamHandle] | None = None  # from the first other entry not read inline
    name_what = f"a {what} file's local name"
    data = r.data
    end = len(data)
    count = r.count(f"number of {what} files")
    pos = r.pos  # the cursor, kept here on the common entry and given back to r for the rest
    for _ in range(count):
        # The common entry (an ASCII local name, then a file handle with an ASCII path) read
        # inline into columns: tens of thousands per incremental checkpoint. Anything else, or
        # anything short, goes through the checked readers, which name what is wrong and where.
        if pos + 13 <= end:
            n = (data[pos] << 8) | data[pos + 1]
            at = pos + 2 + n
            if at + 11 <= end and data[at] == 2:
                m = (data[at + 9] << 8) | data[at + 10]
                stop = at + 11 + m
                raw_local, raw_path = data[pos + 2 : at], data[at + 11 : stop]
                if stop <= end and raw_local.isascii() and raw_path.isascii():
                    names.append(raw_local.decode("ascii"))
                    if handles is None:
                        paths.append(raw_path.decode("ascii"))
                        sizes.append(_I64_FROM(data, at + 1)[0])
                    else:
                        handles.append(
                            StreamHandle(FILE, raw_path.decode("ascii"), _I64_FROM(data, at + 1)[0])
                        )
                    pos = stop
                    continue
        r.pos = pos
        local = r.utf(name_what)
        h = _read_stream_handle(r)
        if h is None:
            raise r.fail(f"a state handle for the {what} file {local!r}")
        if handles is None and h.type == INLINE:  # a small file: kept by position
            inline[len(names)] = h
        else:
            if handles is None:  # from here on, objects: the columns so far made into handles
                handles = list(LocalFiles.of_files(names, paths, sizes, inline).handles)
            handles.append(h)
        names.append(local)
        pos = r.pos
    r.pos = pos
    if handles is None:
        return LocalFiles.of_files(names, paths, sizes, inline)
    return LocalFiles(names, handles)


def _read_keyed_handle(r: _Reader) -> KeyedStateHandle | None:
    at = r.pos
    tag = r.i8("a keyed state handle type (0, 3, 5, 7, 8-14)")
    if tag == 0:
        return None
    if tag in (3, 7, 12):
        kgr, offsets = _read_key_groups(r)
        delegate = _read_stream_handle(r)
        hid = r.utf("the state handle id") if tag == 12 else ""
        kind = SAVEPOINT_KEY_GROUPS if tag == 7 else KEY_GROUPS
        return KeyedStateHandle(kind, kgr, offsets, delegate, hid)
    if tag in (5, 11):
        cid = r.i64("the backend checkpoint id")
        backend = r.utf("the backend identifier")
        start = r.i32("start key group")
        n = r.count("number of key groups", 1 << 16)
        size = r.i64("the checkpointed size") if tag == 11 else 0
        meta = _read_stream_handle(r)
        shared = _read_local_files(r, "shared")
        private = _read_local_files(r, "private")
        hid = r.utf("the state handle id") if tag == 11 else ""
        return KeyedStateHandle(
            INCREMENTAL,
            KeyGroupRange.of(start, n),
            handle_id=hid,
            checkpoint_id=cid,
            backend_id=backend,
            checkpointed_size=size,
            meta=meta,
            shared=shared,
            private=private,
        )
    if tag in (8, 14):
        start = r.i32("start key group")
        n = r.count("number of key groups", 1 << 16)
        size = r.i64("the checkpointed size")
        nested = [h for _ in range(r.count("materialized handles")) if (h := _read_keyed_handle(r))]
        nested += [
            h for _ in range(r.count("non-materialized handles")) if (h := _read_keyed_handle(r))
        ]
        r.i64("the materialization id")
        cid = r.i64("the checkpoint id") if tag == 14 else -1
        hid = r.utf("the state handle id")
        return KeyedStateHandle(
            CHANGELOG,
            KeyGroupRange.of(start, n),
            handle_id=hid,
            checkpoint_id=cid,
            checkpointed_size=size,
            nested=tuple(nested),
        )
    if tag == 9:
        start = r.i32("start key group")
        n = r.count("number of key groups", 1 << 16)
        r.i64("the from sequence number")
        r.i64("the to sequence number")
        for _ in range(r.count("changes")):
            r.i32("a change's key group")
            r.take(r.count("a change's length", 1 << 31), "a change's bytes")
        return KeyedStateHandle(
            CHANGELOG_BYTES, KeyGroupRange.of(start, n), handle_id=r.utf("the state handle id")
        )
    if tag in (10, 13):
        start = r.i32("start key group")
        n = r.count("number of key groups", 1 << 16)
        files: list[StreamHandle] = []
        for _ in range(r.count("changelog stream handles")):
            r.i64("the changelog offset")
            stream = _read_stream_handle(r)
            if stream is not None:
                files.append(stream)
        r.i64("the changelog size")
        size = r.i64("the checkpointed size")
        hid = r.utf("the state handle id")
        if tag == 13:
            r.utf("the storage identifier")
        return KeyedStateHandle(
            CHANGELOG_FILE,
            KeyGroupRange.of(start, n),
            handle_id=hid,
            checkpointed_size=size,
            changelog_files=tuple(files),
        )
    raise r.fail(f"a keyed state handle type (0, 3, 5, 7, 8-14), found {tag}", at)


_MODES = ("SPLIT_DISTRIBUTE", "UNION", "BROADCAST")


def _read_operator_handle(r: _Reader) -> OperatorStateHandle:
    at = r.pos
    tag = r.i8("an operator state handle type (4 or 17)")
    if tag not in (4, 17):
        raise r.fail(f"an operator state handle type (4 or 17), found {tag}", at)
    states = []
    for _ in range(r.count("number of operator states")):
        name = r.utf("an operator state's name")
        mat = r.pos
        mode = r.i8("the distribution mode (0, 1 or 2)")
        if mode > 2:
            raise r.fail(f"the distribution mode (0, 1 or 2), found {mode}", mat)
        n = r.count("number of partition offsets")
        offsets = struct.unpack(f">{n}q", r.take(8 * n, "partition offsets"))
        states.append(OperatorStateEntry(name, _MODES[mode], offsets))
    if tag == 17:
        r.utf("the task-owned directory")
        r.utf("the shared directory")
        r.i8("the is-empty flag")
    return OperatorStateHandle(tuple(states), _read_stream_handle(r))


def _read_channel_handles(
    r: _Reader, direction: str, version: int
) -> tuple[ChannelStateHandle, ...]:
    out = []
    for _ in range(r.count(f"number of {direction} channel state handles")):
        at = r.pos
        # before version 6 every channel state handle is of the first (offsets-listed) kind
        kind = r.i8("a channel state handle type (1-4)") if version >= 6 else 1
        if kind in (1, 2):
            subtask = r.i32("the channel's subtask")
            r.i32("the gate or partition index")
            r.i32("the channel or subpartition index")
            n = r.count("number of channel offsets")
            r.take(8 * n, "channel offsets")
            size = r.i64("the channel state size")
            out.append(ChannelStateHandle(direction, subtask, _read_stream_handle(r), size))
        elif kind in (3, 4):
            subtask = r.i32("the channel's subtask")
            size = r.i64("the channel state size")
            delegate = _read_stream_handle(r)
            r.take(
                r.count("serialized channel offsets length", 1 << 31),
                "serialized channel offsets",
            )
            out.append(ChannelStateHandle(direction, subtask, delegate, size))
        else:
            raise r.fail(f"a channel state handle type (1-4), found {kind}", at)
    return tuple(out)


def _read_subtask(r: _Reader, version: int) -> SubtaskState:
    at = r.pos
    index = r.i32("a subtask index")
    if index < 0:
        return SubtaskState(-index - 1, finished=True)
    st = SubtaskState(index)
    for attr, what in (("managed_operator_state", "managed"), ("raw_operator_state", "raw")):
        flag_at = r.pos
        flag = r.i32(f"the has-{what}-operator-state flag (0 or 1)")
        if flag not in (0, 1):
            raise r.fail(
                f"the has-{what}-operator-state flag (0 or 1) of subtask {index} (at {at}), "
                f"found {flag}",
                flag_at,
            )
        if flag:
            setattr(st, attr, _read_operator_handle(r))
    st.managed_keyed_state = _read_keyed_handle(r)
    st.raw_keyed_state = _read_keyed_handle(r)
    st.input_channel_state = _read_channel_handles(r, "input", version)
    st.output_channel_state = _read_channel_handles(r, "output", version)
    return st


def _read_operator(r: _Reader, version: int) -> OperatorState:
    name = uid = ""
    if version >= 5:
        name = r.utf("the operator name")
        uid = r.utf("the operator uid")
    ids = r.take(16, "the operator id (two longs)")
    lower, upper = ids[:8], ids[8:]
    op_id = (lower + upper).hex()
    at = r.pos
    parallelism = r.i32("the operator parallelism")
    max_p = r.i32("the operator max parallelism")
    if not (0 < parallelism <= max_p <= UPPER_BOUND_MAX_PARALLELISM):
        raise r.fail(
            f"a parallelism in 1..max parallelism <= {UPPER_BOUND_MAX_PARALLELISM}, found "
            f"{parallelism} / {max_p}",
            at,
        )
    op = OperatorState(op_id, name, uid, parallelism, max_p)
    op.coordinator_state = _read_stream_handle(r)
    at = r.pos
    n = r.i32("the number of subtask states")
    if n == -1:
        op.fully_finished = True
        return op
    if not 0 <= n <= parallelism:
        raise r.fail(f"a number of subtask states in 0..{parallelism} (or -1), found {n}", at)
    op.subtasks = [_read_subtask(r, version) for _ in range(n)]
    return op


def parse_metadata(
    data: bytes, source: str
) -> tuple[int, int, int, list[OperatorState], JavaObject | None]:
    """``(version, checkpoint_id, master_states, operators, properties)`` of ``_metadata`` bytes."""
    r = _Reader(data, source)
    magic = struct.unpack(">I", r.take(4, "the magic number 0x4960672D"))[0]
    if magic != HEADER_MAGIC_NUMBER:
        raise r.fail(
            f"the magic number 0x4960672D of a Flink _metadata file, found 0x{magic:08X}", 0
        )
    version = r.i32("the metadata version")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedFlinkMetadataVersion(
            f"{source}: at byte offset 4 found metadata version {version}; this reader knows "
            f"versions {SUPPORTED_VERSIONS[0]} to {SUPPORTED_VERSIONS[-1]} (Flink 1.11 to 2.3): "
            "take a new savepoint with a Flink of that range"
        )
    at = r.pos
    checkpoint_id = r.i64("the checkpoint id")
    if checkpoint_id < 0:
        raise r.fail(f"a checkpoint id >= 0, found {checkpoint_id}", at)
    masters = r.count("the number of master states")
    for _ in range(masters):
        at = r.pos
        if (
            struct.unpack(">I", r.take(4, "the master state magic 0xC96B1696"))[0]
            != MASTER_STATE_MAGIC
        ):
            raise r.fail("the master state magic 0xC96B1696", at)
        r.take(r.count("the master state's length", 1 << 31), "the master state's bytes")
    operators = [
        _read_operator(r, version) for _ in range(r.count("the number of operators", 1 << 20))
    ]
    properties = None
    if version >= 4:
        obj, end = read_java_object(data, r.pos, source)
        if not isinstance(obj, JavaObject) or not obj.class_name.endswith("CheckpointProperties"):
            raise r.fail(
                "a Java-serialized org.apache.flink.runtime.checkpoint.CheckpointProperties"
            )
        properties = obj
        r.pos = end
    if r.pos != len(data):
        raise r.fail(f"the end of the file, found {len(data) - r.pos} more bytes")
    return version, checkpoint_id, masters, operators, properties


def _kind_and_format(
    properties: JavaObject | None, directory: str, operators: list[OperatorState]
) -> tuple[str, str, str, str]:
    """``(kind, format, type name, sharing strategy)`` from the properties (guessed before V4)."""
    if properties is not None:
        ctype = properties.fields.get("checkpointType")
        if isinstance(ctype, JavaObject):
            name = ctype.fields.get("name") or ""
            fmt = ctype.fields.get("formatType")
            if ctype.class_name.endswith("SavepointType"):
                fmt_name = fmt.constant if isinstance(fmt, JavaEnum) else "CANONICAL"
                return "savepoint", fmt_name.lower(), str(name), ""
            sharing = ctype.fields.get("sharingFilesStrategy")
            return (
                "checkpoint",
                "native",
                str(name),
                sharing.constant if isinstance(sharing, JavaEnum) else "",
            )
    # Version 3 has no properties: the directory name and handle types tell.
    if posixpath.basename(directory.rstrip("/")).startswith("savepoint-"):
        canonical = any(
            h.type == SAVEPOINT_KEY_GROUPS
            for op in operators
            for st in op.subtasks
            for h in st.keyed_handles
        )
        return "savepoint", "canonical" if canonical else "native", "Savepoint", ""
    return "checkpoint", "native", "Checkpoint", ""


def _local_url(uri: str) -> str:
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


def _under(path: str, directory: str | None) -> bool:
    return directory is not None and path.startswith(directory.rstrip("/") + "/")


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
        self._shared = f"{self.job_dir}/shared/" if self.job_dir is not None else None
        self._taskowned = f"{self.job_dir}/taskowned/" if self.job_dir is not None else None
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
        m = _RELOCATABLE_TAIL.search(prefix + "x")  # "x": any file name; group 3 ends with it
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
        loc = _local_url(name)
        if "/../" in loc or loc.endswith("/..") or loc.startswith("../"):
            raise FlinkPathEscapes(
                f"{self.source}: state handle path {name!r} contains '..'; refusing to "
                "follow it (the _metadata is corrupt or was tampered with)"
            )
        return normalize_location(loc)

    def _relocate(self, loc: str) -> str | None:
        """The job's (or snapshot's) own file with ``loc``'s tail, if there is one."""
        m = _RELOCATABLE_TAIL.search(loc)
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


def metadata_from_bytes(
    data: bytes,
    metadata_path: str,
    *,
    job_dir: str | None = None,
    exists: Callable[[str], bool] | None = None,
    listed: Container[str] = (),
) -> FlinkSnapshotMetadata:
    """Parse ``data`` (the bytes of ``metadata_path``), resolve its paths; see read_metadata.
    ``listed``: locations known to exist, answered without calling ``exists``."""
    directory = posixpath.dirname(metadata_path.rstrip("/"))
    if job_dir is not None:
        job_dir = _local_url(job_dir).rstrip("/")
    if job_dir is None and _CHK_DIR.match(posixpath.basename(directory)):
        job_dir = posixpath.dirname(directory)
    version, cid, masters, operators, props = parse_metadata(data, metadata_path)
    kind, fmt, type_name, sharing = _kind_and_format(props, directory, operators)
    if exists is None:
        store, _ = FileStore.at(directory or "/")
        cache: dict[str, bool] = {}

        def exists(loc: str) -> bool:
            if loc not in cache:
                cache[loc] = store.exists(loc)
            return cache[loc]

    resolver = PathResolver(directory, job_dir, exists, metadata_path, listed)
    meta = FlinkSnapshotMetadata(
        metadata_path,
        directory,
        job_dir,
        version,
        cid,
        kind,
        fmt,
        type_name,
        sharing,
        props,
        masters,
        operators,
        len(data),
    )
    # Every handle once, in file order, through the runs the importer reads next (built here
    # once, then cached; no object per handle).
    for run in meta.handle_runs():
        if run.files is not None:
            resolver.resolve_files(run.files)
        else:
            resolver.resolve_all(run.handles)
    return meta


def metadata_file(path_or_url: str) -> str:
    """The ``_metadata`` path for a snapshot directory or a ``_metadata`` path."""
    p = _local_url(str(path_or_url)).rstrip("/")
    return p if posixpath.basename(p) == METADATA_FILE_NAME else p + "/" + METADATA_FILE_NAME


def read_metadata(
    path_or_url: str, *, job_dir: str | None = None, exists: Callable[[str], bool] | None = None
) -> FlinkSnapshotMetadata:
    """Read a Flink snapshot's ``_metadata`` (a path or URL of the file or of its directory).

    ``job_dir`` is the job's checkpoint directory (``<checkpoint-dir>/<job-id>``) absolute handles
    are re-rooted under; it defaults to the parent of a ``chk-N`` directory. ``exists`` replaces the
    per-file existence checks (the importer passes a lookup in its own listing).
    """
    path = metadata_file(path_or_url)
    try:
        with open_url(path) as f:
            data: Any = f.read()
    except FileNotFoundError:
        raise FlinkMetadataError(
            f"{path}: no such _metadata file; point at a completed checkpoint (chk-N) or "
            "savepoint directory"
        ) from None
    except IsADirectoryError:
        raise FlinkMetadataError(f"{path}: is a directory, not a _metadata file") from None
    return metadata_from_bytes(bytes(data), path, job_dir=job_dir, exists=exists)
