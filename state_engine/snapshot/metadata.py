"""The ``_metadata`` document: what a snapshot holds and where each byte of it lives.

A JSON object with a ``format_version``. Every file of the snapshot is listed once, with a path
relative to the snapshot directory (a checkpoint's shared files as ``../shared/<name>``; a
savepoint has none, so its directory is self-contained), size, checksum, rows and kind; canonical
keyed files also carry their key-group index as runs ``[first_kg, last_kg, first_rg, last_rg]``:
every key group in ``first_kg..last_kg`` that the file holds lies in row groups
``first_rg..last_rg``. Subtasks and operators refer to files by path.

``created_at`` is milliseconds since the Unix epoch (UTC).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from state_engine.errors import (
    ChecksumMismatch,
    CorruptMetadata,
    InvalidSnapshotPath,
    InvalidSnapshotRequest,
    SnapshotFileMismatch,
    UnsupportedMetadataVersion,
)
from state_engine.snapshot.storage import (
    CHECKSUM_ALGORITHM,
    METADATA_FILE,
    CheckpointStorage,
    FileSystem,
    SnapshotDir,
    normalize_relative,
)
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind

FORMAT_VERSION = 1


class FileKind(StrEnum):
    KEYED = "keyed"
    OPERATOR = "operator"
    NATIVE_SST = "native-sst"
    NATIVE_PRIVATE = "native-private"
    DELTA = "delta"


#: the files of a backend's native format (RocksDB's SSTs and private files)
NATIVE_KINDS = frozenset({FileKind.NATIVE_SST, FileKind.NATIVE_PRIVATE})
#: where an operator state's meta sits in ``OperatorSnapshot.states`` (keyed states: their name)
OPERATOR_STATE_PREFIX = "@operator/"


def operator_state_key(name: str) -> str:
    """The key of operator state ``name`` in ``OperatorSnapshot.states``."""
    return OPERATOR_STATE_PREFIX + name


@dataclass(frozen=True)
class KeyGroupRun:
    """Key groups ``first_key_group..last_key_group`` live in row groups ``first..last``."""

    first_key_group: int
    last_key_group: int
    first_row_group: int
    last_row_group: int

    def to_json(self) -> list[int]:
        return [
            self.first_key_group,
            self.last_key_group,
            self.first_row_group,
            self.last_row_group,
        ]


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot. ``chain_index`` orders delta files (1 = first delta on a base)."""

    path: str
    size: int
    checksum: str
    kind: FileKind
    rows: int | None = None
    key_groups: tuple[KeyGroupRun, ...] = ()
    chain_index: int | None = None

    @property
    def shared(self) -> bool:
        return self.path.startswith("../")

    def row_groups_for(self, first_key_group: int, last_key_group: int) -> list[int]:
        """Row groups that hold any key group of ``first..last`` (sorted, unique)."""
        wanted: set[int] = set()
        for run in self.key_groups:
            if run.first_key_group <= last_key_group and run.last_key_group >= first_key_group:
                wanted.update(range(run.first_row_group, run.last_row_group + 1))
        return sorted(wanted)


@dataclass(frozen=True)
class SubtaskSnapshot:
    """What one subtask of an operator wrote: its key-group range and files (paths)."""

    index: int
    key_group_range: tuple[int, int]
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class OperatorSnapshot:
    """One operator's state: key serializer snapshot, states (opaque JSON), subtasks."""

    operator_id: str
    key_serializer: dict[str, Any] | None
    states: dict[str, dict[str, Any]]
    subtasks: tuple[SubtaskSnapshot, ...]
    operator_state_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class SnapshotMetadata:
    job: str
    checkpoint_id: int
    kind: SnapshotKind
    format: SnapshotFormat
    max_parallelism: int
    parallelism: int
    operators: tuple[OperatorSnapshot, ...]
    files: tuple[SnapshotFile, ...]
    parent: int | None = None
    created_at: int = field(default_factory=lambda: int(time.time() * 1000))
    format_version: int = FORMAT_VERSION

    def file(self, path: str) -> SnapshotFile:
        for f in self.files:
            if f.path == path:
                return f
        raise CorruptMetadata(
            f"snapshot of job {self.job!r} (checkpoint {self.checkpoint_id}) refers to {path!r}, "
            "which its _metadata does not list: the document is damaged; restore from another "
            "snapshot"
        )

    def operator(self, operator_id: str | None = None) -> OperatorSnapshot:
        """The operator ``operator_id``; without it, the only operator."""
        if operator_id is None:
            if len(self.operators) != 1:
                raise InvalidSnapshotRequest(
                    f"snapshot of job {self.job!r} holds {len(self.operators)} operators "
                    f"({', '.join(o.operator_id for o in self.operators)}); name one"
                )
            return self.operators[0]
        for op in self.operators:
            if op.operator_id == operator_id:
                return op
        raise InvalidSnapshotRequest(
            f"snapshot of job {self.job!r} has no operator {operator_id!r}; it has "
            f"{', '.join(o.operator_id for o in self.operators) or 'none'}"
        )

    def files_of(
        self, operator_id: str | None = None, kinds: Iterable[FileKind] | None = None
    ) -> list[SnapshotFile]:
        """The files an operator's subtasks reference (each once, in subtask order)."""
        op = self.operator(operator_id)
        wanted = set(kinds) if kinds is not None else None
        by_path = {f.path: f for f in self.files}
        seen: set[str] = set()
        out: list[SnapshotFile] = []
        for path in [p for s in op.subtasks for p in s.files] + list(op.operator_state_files):
            f = by_path[path]
            if path not in seen and (wanted is None or f.kind in wanted):
                seen.add(path)
                out.append(f)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        doc = {
            "format_version": self.format_version,
            "job": self.job,
            "checkpoint_id": self.checkpoint_id,
            "kind": str(self.kind),
            "format": str(self.format),
            "parent": self.parent,
            "created_at": self.created_at,
            "max_parallelism": self.max_parallelism,
            "parallelism": self.parallelism,
            "operators": [
                {
                    "operator_id": op.operator_id,
                    "key_serializer": op.key_serializer,
                    "states": op.states,
                    "subtasks": [
                        {
                            "index": s.index,
                            "key_group_range": list(s.key_group_range),
                            "files": list(s.files),
                        }
                        for s in op.subtasks
                    ],
                    "operator_state_files": list(op.operator_state_files),
                }
                for op in self.operators
            ],
            "files": [_file_to_json(f) for f in self.files],
        }
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_json(cls, data: bytes | str, where: str = "<memory>") -> SnapshotMetadata:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptMetadata(
                f"{METADATA_FILE} of snapshot {where} is not valid JSON ({exc}); it was truncated "
                "or edited: restore from another snapshot"
            ) from exc
        meta = _parse(_Doc(where), doc)
        validate(meta, where)
        return meta


def _file_to_json(f: SnapshotFile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": f.path,
        "size": f.size,
        "checksum": f.checksum,
        "kind": str(f.kind),
        "rows": f.rows,
    }
    if f.key_groups:
        out["key_groups"] = [r.to_json() for r in f.key_groups]
    if f.chain_index is not None:
        out["chain_index"] = f.chain_index
    return out


class _Doc:
    """Typed field access that names the snapshot and the field path in every error."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, problem: str) -> CorruptMetadata:
        return CorruptMetadata(
            f"{METADATA_FILE} of snapshot {self.where}: field {path} {problem}; the document was "
            "edited or written by a broken writer: restore from another snapshot"
        )

    def obj(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be an object, not {type(value).__name__}")
        return value

    def get(self, d: Mapping[str, Any], key: str, path: str, *, optional: bool = False) -> Any:
        if key not in d:
            if optional:
                return None
            raise self.fail(f"{path}.{key}" if path else key, "is missing")
        return d[key]

    def int_(self, value: Any, path: str, *, minimum: int = 0, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, not {type(value).__name__} {value!r}")
        if value < minimum:
            raise self.fail(path, f"must be >= {minimum}, not {value}")
        return value

    def str_(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"must be a non-empty string, not {value!r}")
        return value

    def list_(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, not {type(value).__name__}")
        return value

    def enum(self, value: Any, enum: type[StrEnum], path: str) -> Any:
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(e.value for e in enum)
            raise self.fail(path, f"is {value!r}; allowed: {allowed}") from None


def _parse(p: _Doc, raw: Any) -> SnapshotMetadata:
    doc = p.obj(raw, "(document)")
    version = p.int_(p.get(doc, "format_version", ""), "format_version", minimum=1)
    if version > FORMAT_VERSION:
        raise UnsupportedMetadataVersion(
            f"{METADATA_FILE} of snapshot {p.where} has format_version {version}, but this "
            f"Statekeeper reads up to {FORMAT_VERSION}; restore it with a newer Statekeeper"
        )
    operators = []
    for i, raw_op in enumerate(p.list_(p.get(doc, "operators", ""), "operators")):
        path = f"operators[{i}]"
        op = p.obj(raw_op, path)
        key_ser = p.get(op, "key_serializer", path)
        if key_ser is not None:
            p.obj(key_ser, f"{path}.key_serializer")
        states = p.obj(p.get(op, "states", path), f"{path}.states")
        for name, st in states.items():
            p.obj(st, f"{path}.states[{name!r}]")
        subtasks = []
        for j, raw_st in enumerate(p.list_(p.get(op, "subtasks", path), f"{path}.subtasks")):
            spath = f"{path}.subtasks[{j}]"
            st = p.obj(raw_st, spath)
            kgr = p.list_(p.get(st, "key_group_range", spath), f"{spath}.key_group_range")
            if len(kgr) != 2:
                raise p.fail(f"{spath}.key_group_range", f"must be [first, last], not {kgr!r}")
            subtasks.append(
                SubtaskSnapshot(
                    index=p.int_(p.get(st, "index", spath), f"{spath}.index"),
                    key_group_range=(
                        p.int_(kgr[0], f"{spath}.key_group_range[0]"),
                        p.int_(kgr[1], f"{spath}.key_group_range[1]"),
                    ),
                    files=tuple(
                        p.str_(f, f"{spath}.files[{k}]")
                        for k, f in enumerate(p.list_(p.get(st, "files", spath), f"{spath}.files"))
                    ),
                )
            )
        op_files = p.list_(p.get(op, "operator_state_files", path), f"{path}.operator_state_files")
        operators.append(
            OperatorSnapshot(
                operator_id=p.str_(p.get(op, "operator_id", path), f"{path}.operator_id"),
                key_serializer=key_ser,
                states=dict(states),
                subtasks=tuple(subtasks),
                operator_state_files=tuple(
                    p.str_(f, f"{path}.operator_state_files[{k}]") for k, f in enumerate(op_files)
                ),
            )
        )
    files = []
    for i, raw_f in enumerate(p.list_(p.get(doc, "files", ""), "files")):
        path = f"files[{i}]"
        f = p.obj(raw_f, path)
        runs = []
        for k, raw_run in enumerate(p.list_(f.get("key_groups", []), f"{path}.key_groups")):
            rpath = f"{path}.key_groups[{k}]"
            run = p.list_(raw_run, rpath)
            if len(run) != 4:
                raise p.fail(rpath, f"must be [first_kg, last_kg, first_rg, last_rg], not {run!r}")
            runs.append(KeyGroupRun(*(p.int_(v, f"{rpath}[{n}]") for n, v in enumerate(run))))
        files.append(
            SnapshotFile(
                path=p.str_(p.get(f, "path", path), f"{path}.path"),
                size=p.int_(p.get(f, "size", path), f"{path}.size"),
                checksum=p.str_(p.get(f, "checksum", path), f"{path}.checksum"),
                kind=p.enum(p.get(f, "kind", path), FileKind, f"{path}.kind"),
                rows=p.int_(p.get(f, "rows", path, optional=True), f"{path}.rows", optional=True),
                key_groups=tuple(runs),
                chain_index=p.int_(
                    f.get("chain_index"), f"{path}.chain_index", minimum=1, optional=True
                ),
            )
        )
    return SnapshotMetadata(
        format_version=version,
        job=p.str_(p.get(doc, "job", ""), "job"),
        checkpoint_id=p.int_(p.get(doc, "checkpoint_id", ""), "checkpoint_id"),
        kind=p.enum(p.get(doc, "kind", ""), SnapshotKind, "kind"),
        format=p.enum(p.get(doc, "format", ""), SnapshotFormat, "format"),
        parent=p.int_(p.get(doc, "parent", "", optional=True), "parent", optional=True),
        created_at=p.int_(p.get(doc, "created_at", ""), "created_at"),
        max_parallelism=p.int_(p.get(doc, "max_parallelism", ""), "max_parallelism", minimum=1),
        parallelism=p.int_(p.get(doc, "parallelism", ""), "parallelism", minimum=1),
        operators=tuple(operators),
        files=tuple(files),
    )


def validate(meta: SnapshotMetadata, where: str) -> None:
    """Check the document's internal consistency; raise CorruptMetadata naming the field."""
    p = _Doc(where)
    if meta.parallelism > meta.max_parallelism:
        raise p.fail(
            "parallelism", f"{meta.parallelism} exceeds max_parallelism {meta.max_parallelism}"
        )
    if meta.parent is not None and meta.parent >= meta.checkpoint_id:
        raise p.fail("parent", f"{meta.parent} is not older than checkpoint {meta.checkpoint_id}")
    listed: dict[str, SnapshotFile] = {}
    for i, f in enumerate(meta.files):
        fpath = f"files[{i}]"
        try:
            norm = normalize_relative(
                f.path, allow_shared=meta.kind is SnapshotKind.CHECKPOINT, where=where
            )
        except InvalidSnapshotPath as exc:
            raise p.fail(f"{fpath}.path", f"is not usable: {exc}") from None
        if norm != f.path:
            raise p.fail(f"{fpath}.path", f"{f.path!r} is not in normal form ({norm!r})")
        if f.path.startswith("../chk-") and int(f.path[7:].split("/")[0]) >= meta.checkpoint_id:
            raise p.fail(f"{fpath}.path", f"{f.path!r} is not a file of an earlier checkpoint")
        if f.path in listed:
            raise p.fail(f"{fpath}.path", f"lists {f.path!r} a second time")
        algo, _, digest = f.checksum.partition(":")
        if algo != CHECKSUM_ALGORITHM or len(digest) != 8 or not _is_hex(digest):
            raise p.fail(
                f"{fpath}.checksum", f"{f.checksum!r} is not '{CHECKSUM_ALGORITHM}:<8 hex digits>'"
            )
        for k, run in enumerate(f.key_groups):
            if not (
                run.first_key_group <= run.last_key_group < meta.max_parallelism
                and run.first_row_group <= run.last_row_group
            ):
                raise p.fail(f"{fpath}.key_groups[{k}]", f"{run.to_json()} is not a valid run")
        listed[f.path] = f
    seen_ops: set[str] = set()
    for i, op in enumerate(meta.operators):
        opath = f"operators[{i}]"
        if op.operator_id in seen_ops:
            raise p.fail(f"{opath}.operator_id", f"repeats operator {op.operator_id!r}")
        seen_ops.add(op.operator_id)
        indexes: set[int] = set()
        for j, st in enumerate(op.subtasks):
            spath = f"{opath}.subtasks[{j}]"
            if st.index >= meta.parallelism or st.index in indexes:
                raise p.fail(
                    f"{spath}.index",
                    f"{st.index} is repeated or not below parallelism {meta.parallelism}",
                )
            indexes.add(st.index)
            first, last = st.key_group_range
            if not first <= last < meta.max_parallelism:
                raise p.fail(
                    f"{spath}.key_group_range",
                    f"{[first, last]} is not within 0..{meta.max_parallelism - 1}",
                )
            for k, path in enumerate(st.files):
                if path not in listed:
                    raise p.fail(f"{spath}.files[{k}]", f"refers to {path!r}, not listed in files")
        for k, path in enumerate(op.operator_state_files):
            if path not in listed:
                raise p.fail(
                    f"{opath}.operator_state_files[{k}]", f"refers to {path!r}, not listed in files"
                )


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s)


def _is_filesystem(source: object) -> bool:
    # fsspec has no type information: FileSystem is Any to mypy, which isinstance() refuses
    filesystem_class: type = FileSystem
    return isinstance(source, filesystem_class)


def snapshot_dir_of(
    source: CheckpointStorage | FileSystem | SnapshotDir | str, snapshot: str | None = None
) -> SnapshotDir:
    """Resolve where a snapshot lives.

    ``source`` is a SnapshotDir; a CheckpointStorage with ``snapshot`` relative to its root (or
    a URL); an fsspec filesystem with ``snapshot`` a path on it; or a URL (``snapshot`` None).
    """
    if isinstance(source, SnapshotDir):
        return source
    if isinstance(source, CheckpointStorage):
        if snapshot is None:
            raise TypeError("read_metadata(storage, snapshot): name the snapshot directory")
        return source.snapshot(snapshot)
    if _is_filesystem(source):
        if snapshot is None:
            raise TypeError("read_metadata(fs, snapshot): name the snapshot path on fs")
        return SnapshotDir.on(source, snapshot)
    if isinstance(source, str) and snapshot is None:
        return SnapshotDir.from_url(source)
    raise TypeError(
        "pass a SnapshotDir, (CheckpointStorage, path), (filesystem, path) or a snapshot URL"
    )


def read_metadata(
    source: CheckpointStorage | FileSystem | SnapshotDir | str, snapshot: str | None = None
) -> SnapshotMetadata:
    """Read and validate a snapshot's ``_metadata`` (MissingMetadata if it never committed)."""
    snap = snapshot_dir_of(source, snapshot)
    return SnapshotMetadata.from_json(snap.read_metadata_bytes(), snap.url)


def write_metadata(
    target: CheckpointStorage | SnapshotDir,
    snapshot_dir: str | None,
    meta: SnapshotMetadata,
    *,
    check_files: bool = True,
) -> SnapshotDir:
    """Validate ``meta`` and commit it as the snapshot's ``_metadata`` (last, exactly once).

    With ``check_files`` (the default) every listed file must already exist with its size, so
    a committed ``_metadata`` never points at a file that was not written.
    """
    snap = target if isinstance(target, SnapshotDir) else target.snapshot(snapshot_dir or "")
    validate(meta, snap.url)
    if meta.kind is SnapshotKind.SAVEPOINT and snap.allow_shared:
        snap = snap.self_contained()
    if check_files:
        verify(snap, meta)
    snap.commit_metadata(meta.to_json())
    return snap


def verify(snapshot: SnapshotDir, meta: SnapshotMetadata, *, deep: bool = False) -> None:
    """Check every listed file exists with its size (``deep``: and checksum); deletes nothing."""
    for f in meta.files:
        size = snapshot.size_of(f.path)
        if size != f.size:
            raise SnapshotFileMismatch(
                f"file {f.path!r} of snapshot {snapshot.url} has {size} bytes, but "
                f"{METADATA_FILE} recorded {f.size}; it was truncated or replaced: restore "
                "from another snapshot"
            )
        if deep:
            actual = snapshot.checksum_of(f.path)
            if actual != f.checksum:
                raise checksum_mismatch(snapshot, f, actual)


def checksum_mismatch(snapshot: SnapshotDir, file: SnapshotFile, actual: str) -> ChecksumMismatch:
    """The error for a snapshot file whose content has checksum ``actual``, not the recorded one."""
    return ChecksumMismatch(
        f"file {file.path!r} of snapshot {snapshot.url} has checksum {actual}, but "
        f"{METADATA_FILE} recorded {file.checksum}; its content is corrupt: restore from "
        "another snapshot"
    )
