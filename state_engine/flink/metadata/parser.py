"""The parser of Flink's ``_metadata`` (versions 3 to 6): bytes to records, paths resolved.

The layout is Flink's ``MetadataV2V3SerializerBase`` and ``MetadataV3/V4/V5/V6Serializer``:
big-endian integers, Java modified UTF-8 strings, one tag byte per state handle and, from version 4
on, a Java-serialized ``CheckpointProperties`` at the end that says checkpoint or savepoint,
canonical or native. Every malformed, truncated or unknown input is a
:class:`~state_engine.errors.FlinkMetadataError` naming the file, the byte offset and what was
expected there.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable, Container
from typing import Any

from state_engine.errors import (
    FlinkMetadataError,
    KeyGroupOutOfRange,
    UnsupportedFlinkMetadataVersion,
)
from state_engine.flink.javaser import JavaEnum, JavaObject, decode_modified_utf8, read_java_object
from state_engine.flink.layout import SAVEPOINT_DIR_PREFIX, is_checkpoint_dir
from state_engine.flink.metadata.paths import PathResolver, local_url, metadata_file
from state_engine.flink.metadata.records import (
    CHANGELOG,
    CHANGELOG_BYTES,
    CHANGELOG_FILE,
    EMPTY_SEGMENT,
    FILE,
    INCREMENTAL,
    INLINE,
    KEY_GROUPS,
    RELATIVE,
    SAVEPOINT_KEY_GROUPS,
    SEGMENT,
    ChannelStateHandle,
    FlinkSnapshotMetadata,
    KeyedStateHandle,
    LocalFiles,
    OperatorState,
    OperatorStateEntry,
    OperatorStateHandle,
    StreamHandle,
    SubtaskState,
)
from state_engine.keygroups import KeyGroupRange
from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM
from state_engine.snapshot.storage import FileStore, open_url

__all__ = [
    "HEADER_MAGIC_NUMBER",
    "MASTER_STATE_MAGIC",
    "SUPPORTED_VERSIONS",
    "metadata_from_bytes",
    "parse_metadata",
    "read_metadata",
]

HEADER_MAGIC_NUMBER = 0x4960672D
MASTER_STATE_MAGIC = 0xC96B1696
SUPPORTED_VERSIONS = (3, 4, 5, 6)


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


def _read_key_group_range(r: _Reader) -> KeyGroupRange:
    """A key-group range as ``_metadata`` stores it: its first key group, then how many."""
    at = r.pos
    start = r.i32("start key group")
    n = r.count("number of key groups", 1 << 16)
    try:
        return KeyGroupRange.from_count(start, n)
    except KeyGroupOutOfRange:
        raise r.fail(
            f"a key-group range inside 0..{UPPER_BOUND_MAX_PARALLELISM - 1}, found {n} key "
            f"groups from {start}",
            at,
        ) from None


def _read_key_groups(r: _Reader) -> tuple[KeyGroupRange, tuple[int, ...]]:
    kgr = _read_key_group_range(r)
    n = len(kgr)
    raw = r.take(8 * n, "key-group offsets")
    return kgr, struct.unpack(f">{n}q", raw)


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
        kgr = _read_key_group_range(r)
        size = r.i64("the checkpointed size") if tag == 11 else 0
        meta = _read_stream_handle(r)
        shared = _read_local_files(r, "shared")
        private = _read_local_files(r, "private")
        hid = r.utf("the state handle id") if tag == 11 else ""
        return KeyedStateHandle(
            INCREMENTAL,
            kgr,
            handle_id=hid,
            checkpoint_id=cid,
            backend_id=backend,
            checkpointed_size=size,
            meta=meta,
            shared=shared,
            private=private,
        )
    if tag in (8, 14):
        kgr = _read_key_group_range(r)
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
            kgr,
            handle_id=hid,
            checkpoint_id=cid,
            checkpointed_size=size,
            nested=tuple(nested),
        )
    if tag == 9:
        kgr = _read_key_group_range(r)
        r.i64("the from sequence number")
        r.i64("the to sequence number")
        for _ in range(r.count("changes")):
            r.i32("a change's key group")
            r.take(r.count("a change's length", 1 << 31), "a change's bytes")
        return KeyedStateHandle(CHANGELOG_BYTES, kgr, handle_id=r.utf("the state handle id"))
    if tag in (10, 13):
        kgr = _read_key_group_range(r)
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
            kgr,
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
    if posixpath.basename(directory.rstrip("/")).startswith(SAVEPOINT_DIR_PREFIX):
        canonical = any(
            h.type == SAVEPOINT_KEY_GROUPS
            for op in operators
            for st in op.subtasks
            for h in st.keyed_handles
        )
        return "savepoint", "canonical" if canonical else "native", "Savepoint", ""
    return "checkpoint", "native", "Checkpoint", ""


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
        job_dir = local_url(job_dir).rstrip("/")
    if job_dir is None and is_checkpoint_dir(posixpath.basename(directory)):
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
