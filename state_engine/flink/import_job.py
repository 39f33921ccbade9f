"""``statectl flink import``: bring a Flink job's completed snapshots into the catalog, and sync.

Each PATH is a job's checkpoint directory ``<checkpoint-dir>/<job-id>``, one savepoint directory
or a directory of savepoints. One listing per PATH plus one read per ``_metadata``: handle paths
are resolved against that listing, so importing costs no per-file I/O. Running it again syncs:
new snapshots are added, imported ones whose ``_metadata`` is gone are DISCARDED, and a claimed
directory that is missing altogether is only reported (an unmounted volume is not the end of its
checkpoints). A directory, and a file, belongs to one job. Snapshots are written in chunks, each
in one transaction (:func:`_write_snapshots`): a crash leaves a chunk imported or not at all.
"""

from __future__ import annotations

import os
import posixpath
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from state_engine.catalog import Catalog, FileGroup, KeyGroupStatRow
from state_engine.catalog.records import JobRecord, SnapshotRecord
from state_engine.collector import collector_paused
from state_engine.errors import (
    FlinkDirectoryClaimed,
    FlinkImportError,
    FlinkJobDirectoryMissing,
    FlinkMetadataError,
    NoSuchJob,
)
from state_engine.faults import crash_point
from state_engine.flink.discarded import is_discarded_metadata, metadata_stamp
from state_engine.flink.layout import (
    JOB_DIR_PARTS,
    KIND_FOREIGN,
    KIND_TASKOWNED,
    METADATA_FILE,
    ROLE_CHANGELOG,
    ROLE_CHECKPOINTS,
    ROLE_SAVEPOINT,
    ROLE_SAVEPOINTS,
    ROLE_SHARED,
    is_checkpoint_dir,
)
from state_engine.flink.metadata import (
    INLINE,
    KEY_GROUPS,
    SAVEPOINT_KEY_GROUPS,
    SEGMENT,
    FileReference,
    FlinkSnapshotMetadata,
    KeyedStateHandle,
    metadata_from_bytes,
    normalize_location,
    read_metadata,
)
from state_engine.snapshot.storage import FileStore
from state_engine.snapshot_enums import SnapshotStatus

TRIGGER = "flink-import"


@dataclass
class Listing:
    """One PATH: its store, root, role, every file under it (path on the store -> size; 0
    for local directories, which are listed without a stat per file) and the names of the
    directories right under the root that hold files."""

    url: str
    store: FileStore
    root: str
    role: str
    files: dict[str, int]
    directories: set[str] = field(default_factory=set)
    _outside: dict[str, bool] = field(default_factory=dict)

    def to_url(self, path: str) -> str:
        return self.store.url_of(path)

    def exists(self, location: str) -> bool:
        """Whether ``location`` exists: from the listing under the root, asked elsewhere (a
        NO_CLAIM restore's ancestor files live outside the job's directory)."""
        if location in self.files:  # a listed path, as a local handle's location is: it exists
            return True
        path = self.store.path_of(location)
        if path == self.root or path.startswith(self.root.rstrip("/") + "/"):
            return path in self.files
        if path not in self._outside:
            self._outside[path] = self.store.exists(path)
        return self._outside[path]

    @property
    def root_url(self) -> str:
        return self.to_url(self.root)

    def looks_in(self, directory: str) -> bool:
        """Whether this listing's role looks for a snapshot's ``_metadata`` in ``directory`` (a
        path on the store): the root of a savepoint, a ``chk-N`` of a job directory, a child of a
        directory of savepoints."""
        if directory != self.root and not directory.startswith(self.root.rstrip("/") + "/"):
            return False
        depth = _depth(directory, self.root)
        if self.role == ROLE_SAVEPOINT:
            return depth == 0
        if self.role == ROLE_CHECKPOINTS:
            return depth == 1 and is_checkpoint_dir(posixpath.basename(directory))
        return depth == 1

    def metadata_files(self) -> list[str]:
        """Paths of the completed snapshots' ``_metadata`` under the root (a role looks for
        them in the root or a directory right under it: those are asked, not every file)."""
        root = self.root.rstrip("/")
        candidates = [f"{root}/{d}/{METADATA_FILE}" for d in self.directories]
        candidates.append(f"{root}/{METADATA_FILE}")
        return sorted(
            p for p in candidates if p in self.files and self.looks_in(posixpath.dirname(p))
        )


@dataclass
class ImportReport:
    job: str
    directories: list[str] = field(default_factory=list)
    added: list[dict[str, Any]] = field(default_factory=list)
    resumed: list[dict[str, Any]] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    vanished: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    missing_directories: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"job {self.job}: {len(self.added)} snapshot(s) added, {len(self.resumed)} resumed, "
            f"{len(self.unchanged)} unchanged, {len(self.vanished)} vanished, "
            f"{len(self.skipped)} skipped, {len(self.in_flight)} chk-N without _metadata"
        ]
        for a in self.added + self.resumed:
            lines.append(
                f"  + {a['kind'].lower()} {a['checkpoint_id']} ({a['format'].lower()}): "
                f"{a['files']} file(s), {a['bytes']} B, snapshot {a['snapshot_id']}"
                + (f", {a['relocated']} relocated" if a["relocated"] else "")
            )
        for v in self.vanished:
            lines.append(f"  - {v['checkpoint_id']} vanished: {v['location']}")
        for s in self.skipped:
            lines.append(f"  ! {s['location']}: {s['reason']}")
        for d in self.missing_directories:
            lines.append(
                f"  ! directory gone: {d}; its snapshots are kept as they were: sync again "
                "once it is back"
            )
        return "\n".join(lines)


def _depth(path: str, root: str) -> int:
    if path == root:
        return 0
    rel = path[len(root.rstrip("/")) + 1 :]
    return rel.count("/") + 1


def normalize_root(store: FileStore, path: str) -> str:
    """One spelling of a directory: ``.``, ``..`` and doubled slashes folded and, on local storage,
    links resolved. A directory imported through a link (``/data -> /mnt/disk1/data``) or as
    ``<root>/./<job>`` is then the directory Flink wrote to, one claimed directory whatever the
    spelling, and every file in it has the spelling its listing gives."""
    path = normalize_location(path.rstrip("/") or "/")
    return os.path.realpath(path) if store.is_local else path


def list_directory(url: str, storage_options: dict[str, Any] | None = None) -> Listing | None:
    """List ``url`` once and classify it; None if it does not exist."""
    store, root = FileStore.at(url, storage_options)
    root = normalize_root(store, root)
    if not store.exists(root):
        return None
    if not store.isdir(root):
        raise FlinkImportError(
            f"{url} is a file; give a Flink job's checkpoint directory "
            "(<checkpoint-dir>/<job-id>), a savepoint directory or a directory of savepoints"
        )
    if store.is_local:
        # the import needs only which files exist: no stat per file
        files = dict.fromkeys(store.file_paths(root), 0)
    else:
        files = {f"{root.rstrip('/')}/{f.path}": f.size for f in store.find(root)}
    skip = len(root) + 1
    top_dirs = {p[skip:cut] for p in files if (cut := p.find("/", skip)) > 0}
    if f"{root}/{METADATA_FILE}" in files:
        role = ROLE_SAVEPOINT
    elif any(map(is_checkpoint_dir, top_dirs)) or top_dirs & set(JOB_DIR_PARTS):
        role = ROLE_CHECKPOINTS
    elif any(f"{root}/{c}/{METADATA_FILE}" in files for c in top_dirs):
        role = ROLE_SAVEPOINTS
    else:
        nested = sorted(
            {
                posixpath.dirname(posixpath.dirname(p))
                for p in files
                if is_checkpoint_dir(posixpath.basename(posixpath.dirname(p)))
            }
        )
        some = ", ".join(store.url_of(n) for n in nested[:3])
        hint = f"; it holds job directories: import one of {some}" if nested else ""
        raise FlinkImportError(
            f"{url} is not a Flink job checkpoint directory (chk-N/, shared/), a savepoint "
            f"directory (_metadata) or a directory of savepoints{hint}"
        )
    return Listing(url, store, root, role, files, top_dirs)


def operator_key(uid: str, operator_id: str) -> str:
    """The catalog's operator uid of a Flink operator: its uid, or its id when it has none."""
    return uid or operator_id


def file_groups(meta: FlinkSnapshotMetadata, store: FileStore) -> list[FileGroup]:
    """Catalog file references of one snapshot, ``_metadata`` and every on-disk file, as
    groups: one per operator subtask, key-group range, role and kind (and foreign or not), as
    the handles give them: a RocksDB handle's thousands of shared files are one group, with no
    object each, and their role and kind recorded once (the group's common details; a file's
    own say where it came from: its RocksDB name, where Flink wrote it if it moved).

    A file is a physical file: the ranges of one (file merging, a changelog) are one reference, see
    :func:`_physical_file_ref`."""
    to_url = store.url_of
    groups = [
        FileGroup(
            [to_url(meta.metadata_path)],
            [meta.metadata_size],
            common_details={"role": "metadata", "kind": "exclusive"},
        )
    ]
    operators = {op.operator_id: operator_key(op.uid, op.operator_id) for op in meta.operators}
    runs = meta.handle_runs()
    # files whose handles give ranges, not the file's size: file merging's segments, a
    # changelog's files (every handle of such a file is one of its ranges)
    ranged = {
        h.location
        for run in runs
        if run.files is None or not run.files.in_columns  # columns: plain file handles
        for h in run.handles
        if h.location is not None and (h.type == SEGMENT or run.role == ROLE_CHANGELOG)
    }
    physical: dict[str, list[FileReference]] = {}
    # (operator, subtask, key groups, kind, role) -> the group's columns: locations, sizes, details
    columns: dict[tuple[Any, ...], tuple[list[str], list[int], list[dict[str, Any] | None]]] = {}
    for run in runs:
        role, operator_id, subtask, kg = run.role, run.operator_id, run.subtask, run.key_groups
        if kg is not None and kg.start > kg.end:
            kg = None  # an empty range is no range
        files = run.files
        if files is not None and files.locations is not None and ranged.isdisjoint(files.locations):
            # RocksDB files resolved as columns (one kind, one relocation): appended whole
            cols = columns.setdefault((operator_id, subtask, kg, files.kind, role), ([], [], []))
            written, file_sizes = files.paths, files.sizes
            assert written is not None and file_sizes is not None  # kept with the locations
            cols[0].extend(store.urls_in(files.directory, files.locations))
            cols[1].extend(file_sizes)
            names = files.file_names  # inline ones have no file
            if files.relocated:
                cols[2].extend(map(_file_details, names, written))
            else:  # _file_details(name) of each, spelled out: thousands of files
                cols[2].extend([{"local_path": name} if name else None for name in names])
            continue
        local_paths = run.local_paths
        # A run's files are mostly of one kind: its group's columns are looked up again only
        # when the kind changes.
        last_kind = None
        paths: list[str] = []
        sizes: list[int] = []
        notes: list[dict[str, Any] | None] = []
        for i, h in enumerate(run.handles):  # tens of thousands
            location = h.location
            if location is None:
                continue  # inline and empty handles: no file
            if ranged and location in ranged:
                local = local_paths[i] if local_paths else ""
                ref = FileReference(
                    role, h, operator_id, subtask, local, run.key_groups, run.offsets
                )
                physical.setdefault(location, []).append(ref)
                continue
            kind = h.kind
            if kind != last_kind:
                paths, sizes, notes = columns.setdefault(
                    (operator_id, subtask, kg, kind, role), ([], [], [])
                )
                last_kind = kind
            notes.append(
                _file_details(
                    local_paths[i] if local_paths else "",
                    h.name if h.relocated else None,
                    None if h.type in ("file", "relative") else h.type,
                )
            )
            paths.append(to_url(location))
            sizes.append(h.size)
    for (operator_id, subtask, kg, kind, role), (paths, sizes, notes) in columns.items():
        # outside the job's directory (a NO_CLAIM or LEGACY restore's ancestor): another
        # job's file, if the catalog has that job, and used by more than this snapshot
        foreign = kind == KIND_FOREIGN
        groups.append(
            FileGroup(
                paths,
                sizes,
                # shared state, and anything the task managers own: a changelog backend's
                # materialized state in taskowned/ serves every checkpoint until the next one
                role == ROLE_SHARED or foreign or kind == KIND_TASKOWNED,
                details=None if notes.count(None) == len(notes) else notes,
                operator=operators.get(operator_id, operator_id),
                subtask=subtask if subtask >= 0 else None,
                key_group_start=None if kg is None else kg.start,
                key_group_end=None if kg is None else kg.end,
                foreign=foreign,
                common_details={"role": role, "kind": kind},
            )
        )
    for location, parts in physical.items():
        groups.append(_physical_file_ref(to_url(location), parts, operators))
    return groups


def _file_details(
    local: str, flink_path: str | None = None, handle: str | None = None
) -> dict[str, Any] | None:
    """A file reference's own details, beside its group's role and kind: its RocksDB name,
    where Flink wrote it when that is not where it is (``flink_path``: it was relocated), and
    its handle type when it is not a plain file; None when there is nothing to say."""
    details: dict[str, Any] = {"local_path": local} if local else {}
    if flink_path is not None:
        details["relocated"] = True
        details["flink_path"] = flink_path
    if handle is not None:
        details["handle"] = handle
    return details or None


def _physical_file_ref(
    url: str, parts: list[FileReference], operators: dict[str, str]
) -> FileGroup:
    """The reference to a file whose handles give ranges of it, not its size: a physical file of
    Flink's file merging (FLIP-306), holding segments of several subtasks, roles and
    checkpoints (an SST a later checkpoint reuses, a private file, operator state) and, with
    ``file-merging.across-checkpoint-boundary``, appended to while the job runs; or a changelog
    backend's file of state changes (its handle's size leaves out the file's header byte; later
    checkpoints read it from an offset). One shared reference (a group of one file) whose size
    is what this snapshot needs of the file (``grows``: the catalog keeps the most any snapshot
    needs, and verify wants at least that much in storage; bytes no segment uses any more stay
    until Flink drops the whole file). ``details["segments"]`` lists ``[role, start, length]``
    of the snapshot's ranges."""
    first = parts[0].handle
    roles = {r.role for r in parts}
    ops = {operators.get(r.operator_id, r.operator_id) for r in parts}
    subtasks = {r.subtask for r in parts}
    ranges = [r.key_groups for r in parts if r.key_groups is not None]
    one_subtask = len(ops) == 1 and len(subtasks) == 1 and next(iter(subtasks)) >= 0
    kg_start = kg_end = None
    if one_subtask and ranges and all(g.start <= g.end for g in ranges):
        kg_start, kg_end = min(g.start for g in ranges), max(g.end for g in ranges)
    details: dict[str, Any] = {
        "role": roles.pop() if len(roles) == 1 else "merged",
        "kind": first.kind,
        "handle": first.type,
        "segments": sorted([r.role, r.handle.start_pos, r.handle.size] for r in parts),
    }
    if first.relocated:
        details["relocated"] = True
        details["flink_path"] = first.name
    return FileGroup(
        [url],
        [max(r.handle.start_pos + r.handle.size for r in parts)],
        True,
        details=[details],
        operator=ops.pop() if len(ops) == 1 else None,
        subtask=next(iter(subtasks)) if one_subtask else None,
        key_group_start=kg_start,
        key_group_end=kg_end,
        foreign=first.kind == KIND_FOREIGN,
        grows=True,
    )


def referenced_files(meta: FlinkSnapshotMetadata, store: FileStore) -> dict[str, tuple[int, bool]]:
    """Every file ``meta`` references (``_metadata`` included): URL -> (size, whether it
    grows, see :func:`_physical_file_ref`)."""
    out: dict[str, tuple[int, bool]] = {}
    for g in file_groups(meta, store):
        for path, size in zip(g.paths, g.sizes, strict=True):
            out.setdefault(path, (size, g.grows))
    return out


def metadata_problems(
    location: str, job_location: str | None, attached: dict[str, int]
) -> list[str]:
    """How a Flink snapshot's ``_metadata`` disagrees with the files the catalog attached.

    ``attached``: catalog path -> size. Used by ``statectl verify`` for jobs of origin flink.
    """
    store, _ = FileStore.at(location)
    job_dir = (
        job_location
        if job_location and location.startswith(job_location.rstrip("/") + "/")
        else None
    )
    meta = read_metadata(location, job_dir=job_dir)
    expected = referenced_files(meta, store)
    problems = []
    for path, (size, grows) in sorted(expected.items()):
        if path not in attached:
            problems.append(f"it lists {path}, which the catalog did not attach")
        elif grows and attached[path] < size:
            problems.append(
                f"it reads {size} bytes of {path}, the catalog records {attached[path]}"
            )
        elif not grows and attached[path] != size:
            problems.append(f"it records {path} as {size} bytes, the catalog as {attached[path]}")
    for path in sorted(set(attached) - set(expected)):
        problems.append(f"the catalog attached {path}, which it does not list")
    return problems


def key_group_bytes(h: KeyedStateHandle) -> dict[int, int]:
    """Bytes per key group of a key-groups handle, from its offsets (0 = no data in canonical)."""
    if h.type not in (KEY_GROUPS, SAVEPOINT_KEY_GROUPS) or h.delegate is None or not h.offsets:
        return {}
    end_of_stream = h.delegate.size if h.delegate.type != INLINE else len(h.delegate.data or b"")
    present = sorted({o for o in h.offsets if o > 0})
    nxt = {
        o: (present[i + 1] if i + 1 < len(present) else end_of_stream)
        for i, o in enumerate(present)
    }
    out = {}
    for i, off in enumerate(h.offsets):
        out[h.key_groups.start + i] = max(0, nxt[off] - off) if off > 0 else 0
    return out


_END_OF_KEY_GROUP = 0xFFFF


def canonical_rows(h: KeyedStateHandle) -> dict[int, int]:
    """Records per key group of an uncompressed canonical savepoint stream, by walking its
    length prefixes (FLINK_FORMAT.md §5.2; nothing is deserialized); {} when compressed or not
    canonical. A stream that does not parse counts nothing rather than failing the import."""
    if h.type != SAVEPOINT_KEY_GROUPS or h.delegate is None or not h.offsets:
        return {}
    data = h.delegate.read_bytes()
    # KeyedBackendSerializationProxy: i32 version, bool usingKeyGroupCompression
    if len(data) < 5 or data[4] != 0:
        return {}
    out: dict[int, int] = {}
    unpack = struct.unpack_from
    try:
        for i, off in enumerate(h.offsets):
            if off <= 0:
                continue
            pos, n = off + 2, 0  # i16 kvStateId
            while True:
                (klen,) = unpack(">i", data, pos)
                first = data[pos + 4]
                pos += 4 + klen
                (vlen,) = unpack(">i", data, pos)
                pos += 4 + vlen
                n += 1
                if first & 0x80:
                    (mark,) = unpack(">H", data, pos)
                    pos += 2
                    if mark == _END_OF_KEY_GROUP:
                        break
            out[h.key_groups.start + i] = n
    except (struct.error, IndexError):
        return {}
    return out


def key_group_stats(meta: FlinkSnapshotMetadata) -> list[KeyGroupStatRow]:
    """Per operator and key group: bytes from the offsets, and records where they can be counted
    without decoding (uncompressed canonical savepoints; 0 elsewhere)."""
    sizes: dict[tuple[str, int], int] = {}
    rows: dict[tuple[str, int], int] = {}
    for op in meta.operators:
        uid = operator_key(op.uid, op.operator_id)
        for st in op.subtasks:
            if st.managed_keyed_state is None:
                continue
            for kg, n in key_group_bytes(st.managed_keyed_state).items():
                if 0 <= kg < meta.max_parallelism:
                    sizes[(uid, kg)] = sizes.get((uid, kg), 0) + n
            for kg, n in canonical_rows(st.managed_keyed_state).items():
                if 0 <= kg < meta.max_parallelism:
                    rows[(uid, kg)] = rows.get((uid, kg), 0) + n
    return [
        KeyGroupStatRow(uid, kg, rows.get((uid, kg), 0), n)
        for (uid, kg), n in sorted(sizes.items())
    ]


def _catalog_parallelism(meta: FlinkSnapshotMetadata) -> tuple[int, int]:
    # Subtask indexes of every operator must fit, and key groups of every keyed operator.
    p = max([op.parallelism for op in meta.operators] or [1])
    max_p = max([meta.max_parallelism, p])
    return p, max_p


def _summary(
    snap: SnapshotRecord, groups: list[FileGroup], meta: FlinkSnapshotMetadata, files: int
) -> dict[str, Any]:
    return {
        "snapshot_id": snap.id,
        "checkpoint_id": snap.checkpoint_id,
        "kind": snap.kind,
        "format": snap.format,
        "location": snap.location,
        "files": files,
        "bytes": snap.bytes,
        "relocated": sum(
            1 for g in groups for d in g.details or () if d is not None and d.get("relocated")
        ),
        "inline_handles": len(meta.inline_handles),
    }


def import_flink(
    catalog: Catalog,
    paths: list[str],
    job: str,
    *,
    storage_options: dict[str, Any] | None = None,
) -> ImportReport:
    """Import or sync the Flink directories ``paths`` as catalog job ``job`` (see module doc)."""
    # an import builds a few objects per state handle, none of them in a cycle
    with collector_paused():
        return _import(catalog, paths, job, storage_options)


@dataclass
class _ToImport:
    """A snapshot on disk to bring into the catalog (``prior``: the PENDING record a crash left)."""

    listing: Listing
    meta: FlinkSnapshotMetadata
    location: str
    prior: SnapshotRecord | None
    groups: list[FileGroup]


def _import(
    catalog: Catalog, paths: list[str], job: str, storage_options: dict[str, Any] | None
) -> ImportReport:
    if not paths:
        raise FlinkImportError("name at least one Flink checkpoint or savepoint directory")
    report = ImportReport(job)
    record = _flink_job(catalog, job)
    known_dirs = dict(catalog.job_directories(job)) if record is not None else {}
    listings = _list_directories(catalog, paths, job, known_dirs, storage_options, report)
    found = _read_snapshots(listings, report)
    if not found and not known_dirs and not report.missing_directories:
        raise FlinkImportError(
            f"no completed Flink snapshot (a chk-N or savepoint directory with a _metadata) under "
            f"{', '.join(paths)}; nothing was imported"
        )
    existing: dict[int, list[SnapshotRecord]] = {}
    for snap in catalog.list_snapshots(job) if record else []:
        existing.setdefault(snap.checkpoint_id, []).append(snap)
    todo, present = _plan(found, catalog, existing, report)
    # Checked before anything is written: the catalog stays as it was.
    adopt = _files_to_adopt(catalog, job, todo, report.directories)
    if adopt:  # files another job's snapshots reference too: shared, whatever their role
        taken = set(adopt)
        for item in todo:
            item.groups = [_shared_where(g, taken) for g in item.groups]

    def register() -> None:
        """The job (if new), its directories and the files it takes over."""
        if record is None:
            max_p = max((_catalog_parallelism(m)[1] for _, m in found), default=None)
            location = next(
                (lst.root_url for lst in listings if lst.role == ROLE_CHECKPOINTS), None
            )
            catalog.register_job(
                job,
                max_parallelism=max_p or 128,
                location=location or (listings[0].root_url if listings else None),
                origin="flink",
            )
        for listing in listings:
            catalog.claim_directory(job, listing.root_url, listing.role)
        if adopt:
            catalog.adopt_files(job, adopt)

    chunks = _chunks(todo)
    if not chunks:
        with catalog.batch():
            register()
    for i, chunk in enumerate(chunks):  # registered with the first: all of it or none
        _write_snapshots(catalog, job, chunk, report, before=register if i == 0 else None)
    if record is not None:  # a job registered just now has no snapshot that could have vanished
        _mark_vanished(catalog, job, listings, present, report)
    return report


def _flink_job(catalog: Catalog, job: str) -> JobRecord | None:
    """The catalog's record of ``job`` (None if there is none yet); it must be a Flink job."""
    try:
        record = catalog.get_job(job)
    except NoSuchJob:
        return None
    if record.origin != "flink":
        raise FlinkImportError(
            f"job {job!r} is a Statekeeper job, not a Flink one; import the Flink directories "
            "under another job name"
        )
    return record


def _list_directories(
    catalog: Catalog,
    paths: list[str],
    job: str,
    known_dirs: dict[str, str],
    storage_options: dict[str, Any] | None,
    report: ImportReport,
) -> list[Listing]:
    listings: list[Listing] = []
    for url in paths:
        listing = list_directory(url, storage_options)
        if listing is None:
            store, root = FileStore.at(url, storage_options)
            root_url = store.url_of(normalize_root(store, root))
            if root_url in known_dirs:
                report.missing_directories.append(root_url)
                continue
            raise FlinkJobDirectoryMissing(
                f"{url} does not exist; give an existing Flink checkpoint or savepoint directory"
            )
        owner = catalog.directory_owner(listing.root_url)
        if owner is not None and owner != job:
            raise FlinkDirectoryClaimed(
                f"{listing.root_url} was already imported as job {owner!r}; one directory belongs "
                f"to one job: sync it with `statectl flink import {url} --job {owner}` instead"
            )
        if listing.root_url not in report.directories:  # one directory under two spellings
            listings.append(listing)
            report.directories.append(listing.root_url)
    return listings


def _read_snapshots(
    listings: list[Listing], report: ImportReport
) -> list[tuple[Listing, FlinkSnapshotMetadata]]:
    """Parse every ``_metadata`` before writing anything: a corrupt one fails the import cleanly.
    Records the ``chk-N`` directories without one in ``report.in_flight``."""
    found: list[tuple[Listing, FlinkSnapshotMetadata]] = []
    ckpt_dirs = [_located(lst, lst.root) for lst in listings if lst.role == ROLE_CHECKPOINTS]
    for listing in listings:
        for mpath in listing.metadata_files():
            try:
                data = listing.store.read_bytes(mpath)
            except FileNotFoundError:
                continue  # subsumed by a running job since the listing: no longer a snapshot
            job_dir = (
                _located(listing, listing.root)
                if listing.role == ROLE_CHECKPOINTS
                else (ckpt_dirs[0] if ckpt_dirs else None)
            )
            try:
                meta = metadata_from_bytes(
                    bytes(data),
                    _located(listing, mpath),
                    job_dir=job_dir,
                    exists=listing.exists,
                    listed=listing.files,
                )
            except FlinkMetadataError as exc:
                raise FlinkMetadataError(f"{exc}; nothing was imported") from None
            found.append((listing, meta))
        if listing.role == ROLE_CHECKPOINTS:
            root = listing.root.rstrip("/")
            for head in sorted(listing.directories):
                parent = f"{root}/{head}"
                if is_checkpoint_dir(head) and f"{parent}/{METADATA_FILE}" not in listing.files:
                    report.in_flight.append(listing.to_url(parent))
    return found


def _located(listing: Listing, path: str) -> str:
    """``path`` (on the listing's store) as the handles of a snapshot there are resolved
    against: a local path as it is, a URL on an object store (its bucket path alone would be
    read as a local path)."""
    return path if listing.store.is_local else listing.to_url(path)


def _plan(
    found: list[tuple[Listing, FlinkSnapshotMetadata]],
    catalog: Catalog,
    existing: dict[int, list[SnapshotRecord]],
    report: ImportReport,
) -> tuple[list[_ToImport], set[str]]:
    """What to import (in checkpoint id order) and the locations of every snapshot on disk;
    the snapshots left alone go to the report. ``existing``: the catalog's snapshots by
    checkpoint id (at most one not DISCARDED per id)."""
    todo: list[_ToImport] = []
    present: set[str] = set()
    for listing, meta in sorted(found, key=lambda lm: lm[1].checkpoint_id):
        location = listing.to_url(meta.directory)
        if location in present:
            continue  # found by two listings (a savepoint directory inside a claimed one)
        present.add(location)
        known = existing.get(meta.checkpoint_id, [])
        prior = next((s for s in known if s.status is not SnapshotStatus.DISCARDED), None)
        if (
            prior is not None
            and prior.location == location
            and prior.status is SnapshotStatus.COMPLETED
        ):
            report.unchanged.append(prior.checkpoint_id)
            continue
        reason = _not_imported_because(catalog, listing, meta, location, prior, known)
        if reason is None and prior is None:
            missing = sorted(
                {
                    h.location or h.name
                    for run in meta.handle_runs()
                    if run.files is None or run.files.locations is None  # columns: all found
                    for h in run.handles
                    if h.location is not None and not h.exists
                }
            )
            if missing:
                # Not restorable as it is (a later sync imports it once the files are back).
                reason = (
                    f"{len(missing)} file(s) its _metadata references are missing "
                    f"(e.g. {missing[0]}); not imported"
                )
                report.skipped.append(
                    {
                        "checkpoint_id": meta.checkpoint_id,
                        "location": location,
                        "reason": reason,
                        "missing": missing,
                    }
                )
                continue
        if reason is not None:
            report.skipped.append(
                {"checkpoint_id": meta.checkpoint_id, "location": location, "reason": reason}
            )
            continue
        todo.append(_ToImport(listing, meta, location, prior, file_groups(meta, listing.store)))
    return todo, present


def _not_imported_because(
    catalog: Catalog,
    listing: Listing,
    meta: FlinkSnapshotMetadata,
    location: str,
    prior: SnapshotRecord | None,
    known: list[SnapshotRecord],
) -> str | None:
    """Why a snapshot on disk whose checkpoint id the catalog already has is not imported (None:
    it is, or its PENDING record is completed). ``prior``: the catalog's live snapshot with that
    id, ``known``: every snapshot with it (DISCARDED ones too)."""
    cid = meta.checkpoint_id
    if prior is not None:
        if prior.location == location and prior.status is SnapshotStatus.PENDING:
            return None
        if prior.location != location:
            return (
                f"checkpoint id {cid} is already snapshot {prior.id} at {prior.location} "
                "(another run of the job?); the catalog keeps one live snapshot per checkpoint "
                "id, so it is not imported, but expire and orphan cleanup keep every file it "
                "references"
            )
        return f"snapshot {prior.id} is {prior.status} in the catalog"
    here = [s for s in known if s.location == location]
    if not here:
        return None
    stamp = metadata_stamp(listing.store, meta.metadata_path)
    for snap in here:
        if is_discarded_metadata(snap, stamp):
            return f"snapshot {snap.id} is DISCARDED in the catalog (expired; its files go next)"
    # The old _metadata's row is forgotten by the expire that discarded it; until then it
    # clashes with the new one's (one path, one file). Its shared files may stay: reused.
    if catalog.path_owners([f"{location.rstrip('/')}/{METADATA_FILE}"]):
        return (
            f"a new checkpoint {cid} where snapshot {here[0].id} was discarded, whose expire did "
            f"not finish removing its files; run `statectl maintain expire --job {here[0].job} "
            "...` again to finish it (it keeps this checkpoint's files), and the next sync "
            "imports this one"
        )
    return None  # a new checkpoint where an expired one was: a snapshot of its own


def _files_to_adopt(
    catalog: Catalog, job: str, todo: list[_ToImport], directories: list[str]
) -> list[str]:
    """The files in the job's own directories that another job registered first as its foreign
    references (a NO_CLAIM child imported before its ancestor): this job takes them over.

    A file another job holds in its own directories refuses the import (a directory inside one
    of that job's), naming that job. A snapshot's foreign references to other jobs'
    files are what they are: references. One indexed lookup of the new snapshots' paths,
    whatever the number of jobs and their files."""
    own = set().union(*(g.paths for item in todo for g in item.groups if not g.foreign))
    others = catalog.path_owners(own, other_than=job) if own else {}
    if not others:
        return []
    flink_jobs = {j.name for j in catalog.list_jobs() if j.origin == "flink"}
    claimed = {o: [d for d, _ in catalog.job_directories(o)] for o in set(others.values())}
    # adopted only from a Flink job that holds the file outside its own directories
    held = sorted(p for p, o in others.items() if o not in flink_jobs or under_any(p, claimed[o]))
    if held:
        other = others[held[0]]
        raise FlinkImportError(
            f"{len(held)} file(s) that snapshots under {', '.join(directories)} reference "
            f"already belong to job {other!r} (e.g. {held[0]}), in its own directories: this "
            "is one of its directories, or inside one. A file belongs to one job, so nothing was "
            f"imported: sync it as job {other!r} (`statectl flink import PATH... --job {other}`)"
        )
    return sorted(others)


def _shared_where(group: FileGroup, paths: set[str]) -> FileGroup:
    """``group`` with its files among ``paths`` marked shared."""
    if not paths.intersection(group.paths):
        return group
    shared = [p in paths or group.is_shared(i) for i, p in enumerate(group.paths)]
    return replace(group, shared=shared)


def under_any(url: str, directories: list[str]) -> bool:
    """Whether ``url`` is inside one of ``directories`` (by path, never the directory itself)."""
    return any(url.startswith(d.rstrip("/") + "/") for d in directories)


#: file references written per catalog transaction: a chunk of snapshots is imported whole or
#: not at all, and holds the catalog's writer lock for well under a second
CHUNK_REFERENCES = 100_000


def _chunks(todo: list[_ToImport]) -> list[list[_ToImport]]:
    """``todo`` in order, cut into runs of at most :data:`CHUNK_REFERENCES` file references
    (a snapshot with more is a run of its own)."""
    out: list[list[_ToImport]] = []
    size = 0
    for item in todo:
        n = sum(len(g.paths) for g in item.groups)
        if not out or size + n > CHUNK_REFERENCES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def _write_snapshots(
    catalog: Catalog,
    job: str,
    items: list[_ToImport],
    report: ImportReport,
    before: Callable[[], None] | None = None,
) -> None:
    """Write ``items`` into the catalog in one transaction: each snapshot begun (or its PENDING
    record resumed), every file attached in one call (a file that several of them reference is
    looked up and written once), key-group stats recorded, each snapshot completed. A crash
    leaves all of them imported or none. ``before``: catalog calls to make first, in the same
    transaction."""
    # Counted before the transaction: a canonical savepoint's records are counted by reading its
    # files, and the transaction holds the catalog's writer lock.
    stats = [key_group_stats(item.meta) for item in items]
    sizes = [_distinct_sizes(item.groups) for item in items]
    done: list[tuple[SnapshotRecord, bool, _ToImport]] = []
    with catalog.batch():
        if before is not None:
            before()
        begun: list[tuple[SnapshotRecord, bool, _ToImport]] = []
        for item in items:
            if item.prior is None:
                parallelism, snap_max_p = _catalog_parallelism(item.meta)
                snap = catalog.begin_snapshot(
                    job,
                    location=item.location,
                    parallelism=parallelism,
                    kind=item.meta.kind.upper(),
                    format=item.meta.format.upper(),
                    checkpoint_id=item.meta.checkpoint_id,
                    max_parallelism=snap_max_p,
                    trigger=TRIGGER,
                )
                begun.append((snap, False, item))
            else:
                begun.append((item.prior, True, item))
        catalog.attach_files_many(
            (snap.id, item.groups)
            for snap, resumed, item in begun
            if not resumed or not catalog.snapshot_files(snap.id, limit=1)
        )
        crash_point("flink.import.after_attach")
        for (snap, resumed, item), rows, files in zip(begun, stats, sizes, strict=True):
            if rows and (not resumed or not catalog.key_group_stats(snap.id)):
                catalog.record_key_group_stats(snap.id, rows)
            completed = catalog.complete_snapshot(
                snap.id,
                snap.version,
                bytes=sum(files.values()),
                entries=sum(r.rows for r in rows),
            )
            done.append((completed, resumed, item))
    for (snap, resumed, item), files in zip(done, sizes, strict=True):
        summary = _summary(snap, item.groups, item.meta, len(files))
        (report.resumed if resumed else report.added).append(summary)
    crash_point("flink.import.after_commit")


def _distinct_sizes(groups: list[FileGroup]) -> dict[str, int]:
    """The files ``groups`` reference, each once: path -> size."""
    sizes: dict[str, int] = {}
    for g in groups:
        sizes.update(zip(g.paths, g.sizes, strict=True))
    return sizes


def _mark_vanished(
    catalog: Catalog, job: str, listings: list[Listing], present: set[str], report: ImportReport
) -> None:
    """Discard the COMPLETED snapshots a listing looked for and did not find, once the store
    confirms their ``_metadata`` is gone. Snapshots of a missing directory are left alone."""
    claimed = [d for d, _ in catalog.job_directories(job)]
    for snap in catalog.list_snapshots(job, status=SnapshotStatus.COMPLETED):
        if snap.location in present:
            continue
        listing = next((lst for lst in listings if _looks_for(lst, snap.location, claimed)), None)
        if listing is None:
            continue
        metadata = f"{listing.store.path_of(snap.location)}/{METADATA_FILE}"
        if listing.store.exists(metadata):
            continue  # written since the listing (or the listing missed it): not vanished
        catalog.discard_snapshot(
            snap.id,
            error=f"its directory {snap.location} (or its _metadata) vanished; seen at import",
        )
        report.vanished.append(
            {"snapshot_id": snap.id, "checkpoint_id": snap.checkpoint_id, "location": snap.location}
        )


def _looks_for(listing: Listing, location: str, claimed: list[str]) -> bool:
    """Whether ``listing`` is where a snapshot at ``location`` is found: its role looks in that
    directory and no other claimed directory nested in its root holds it (that one's own sync
    decides)."""
    if not listing.store.handles(location) or not listing.looks_in(listing.store.path_of(location)):
        return False
    root = listing.root_url
    return not any(
        len(d) > len(root) and (location == d or location.startswith(d.rstrip("/") + "/"))
        for d in claimed
    )
