"""The records a Flink ``_metadata`` is read into: the snapshot, its operators and subtasks, and
their state handles (a file, a part of one, or bytes inline)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from state_engine.flink.javaser import JavaObject
from state_engine.flink.layout import (
    ROLE_CHANGELOG,
    ROLE_CHANNEL_STATE,
    ROLE_COORDINATOR,
    ROLE_KEYED_STATE,
    ROLE_META,
    ROLE_OPERATOR_STATE,
    ROLE_PRIVATE,
    ROLE_SHARED,
)
from state_engine.keygroups import KeyGroupRange
from state_engine.snapshot.storage import open_url

__all__ = [
    "CHANGELOG",
    "CHANGELOG_BYTES",
    "CHANGELOG_FILE",
    "EMPTY_SEGMENT",
    "FILE",
    "INCREMENTAL",
    "INLINE",
    "KEY_GROUPS",
    "RELATIVE",
    "SAVEPOINT_KEY_GROUPS",
    "SEGMENT",
    "ChannelStateHandle",
    "FileReference",
    "FlinkSnapshotMetadata",
    "HandleRun",
    "KeyedStateHandle",
    "LocalFile",
    "LocalFiles",
    "OperatorState",
    "OperatorStateEntry",
    "OperatorStateHandle",
    "StreamHandle",
    "SubtaskState",
]

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
