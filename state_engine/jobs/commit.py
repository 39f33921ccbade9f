"""Commit a snapshot whose files Spark tasks wrote: the driver's half of the protocol.

:func:`begin_output` reserves the next checkpoint id and its directory and records the snapshot
PENDING (tagged with the maintenance run, so a retry finds what an earlier attempt left);
:func:`commit_output` attaches the files and key-group statistics while it is still PENDING, writes
``_metadata`` last and completes the snapshot by compare-and-swap; :func:`abort_output` fails it
and removes its directory. Built on the catalog's public API: the checkpoint manager's commit
path is private to the engine's own snapshots.
"""

from __future__ import annotations

import hashlib
import posixpath
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow, SnapshotRecord
from state_engine.checkpoint.metadata import (
    METADATA_FILE,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotFormat,
    SnapshotKind,
    SnapshotMetadata,
    SubtaskSnapshot,
    write_metadata,
)
from state_engine.checkpoint.storage import CheckpointStorage, SnapshotDir, format_checksum
from state_engine.config import Settings
from state_engine.errors import CommitConflict, InvalidJobParams
from state_engine.faults import crash_point
from state_engine.jobs.canonical_write import RangeOutput, TargetSpec
from state_engine.snapshot_enums import UNFINISHED_STATUSES, SnapshotStatus

RUN_TAG_PREFIX = "run-"


def run_tag(run_id: str) -> str:
    """The snapshot ``trigger`` that ties a snapshot to the maintenance run that wrote it."""
    return RUN_TAG_PREFIX + hashlib.sha1(run_id.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class OutputSnapshot:
    """A PENDING snapshot reserved for a job's output."""

    record: SnapshotRecord
    snapshot: SnapshotDir
    kind: SnapshotKind

    def target(self, **sizing: int) -> TargetSpec:
        return TargetSpec(
            url=self.snapshot.url,
            max_parallelism=self.record.max_parallelism,
            allow_shared=self.snapshot.allow_shared,
            **sizing,
        )


def storage_for(catalog: Catalog, job: str, settings: Settings | None = None) -> CheckpointStorage:
    """The checkpoint root of ``job``: the parent of its registered location, else the setting."""
    record = catalog.get_job(job)
    location = (record.location or "").rstrip("/")
    if location and posixpath.basename(location) == job:
        return CheckpointStorage(location[: -len(job) - 1])
    return CheckpointStorage((settings or Settings.from_env()).checkpoint_root)


def previous_output(catalog: Catalog, job: str, tag: str) -> SnapshotRecord | None:
    """The COMPLETED snapshot an earlier attempt of the run committed; cleans up any other.

    An attempt that died after reserving its snapshot leaves it PENDING (or FAILED) with files:
    those are failed and removed here, so the retry writes the output once.
    """
    done = None
    for snap in catalog.list_snapshots(job):
        if snap.trigger != tag:
            continue
        if snap.status is SnapshotStatus.COMPLETED:
            done = snap
        elif snap.status in UNFINISHED_STATUSES:
            if snap.status is SnapshotStatus.PENDING:
                catalog.fail_snapshot(snap.id, error="abandoned by an earlier attempt of its run")
            _remove_dir(SnapshotDir.from_url(snap.location))
    return done


def begin_output(
    catalog: Catalog,
    storage: CheckpointStorage,
    job: str,
    *,
    kind: str,
    parallelism: int,
    max_parallelism: int,
    tag: str,
    savepoint_dir: str | None = None,
) -> OutputSnapshot:
    """Reserve the job's next checkpoint id and directory; the snapshot is PENDING."""
    try:
        kind_ = SnapshotKind(kind.upper())
    except ValueError:
        raise InvalidJobParams(
            f"output kind {kind!r} is unknown; use CHECKPOINT or SAVEPOINT"
        ) from None
    if savepoint_dir is not None and kind_ is not SnapshotKind.SAVEPOINT:
        raise InvalidJobParams("savepoint_dir is only for kind SAVEPOINT")
    for _ in range(20):
        latest = catalog.list_snapshots(job, limit=1)
        cid = (latest[0].checkpoint_id + 1) if latest else 1
        snap = (
            storage.checkpoint(job, cid)
            if kind_ is SnapshotKind.CHECKPOINT
            else storage.savepoint(job, cid, savepoint_dir)
        )
        if snap.has_metadata():
            raise InvalidJobParams(
                f"snapshot directory {snap.url} already holds a committed {METADATA_FILE}; "
                "snapshots are never overwritten: choose another savepoint directory"
            )
        try:
            record = catalog.begin_snapshot(
                job,
                location=snap.url,
                parallelism=parallelism,
                kind=str(kind_),
                format=str(SnapshotFormat.CANONICAL),
                checkpoint_id=cid,
                max_parallelism=max_parallelism,
                trigger=tag,
            )
        except CommitConflict:
            continue  # another writer took this id: take the next one
        return OutputSnapshot(record, snap, kind_)
    raise CommitConflict(
        f"could not reserve a checkpoint id for job {job!r}: others keep taking them"
    )


def build_metadata(
    out: OutputSnapshot,
    template: SnapshotMetadata,
    outputs: Sequence[RangeOutput],
    operator_state_files: dict[str, Sequence[SnapshotFile]] | None = None,
) -> SnapshotMetadata:
    """``_metadata`` of the output: the template's operators and states over the new files."""
    operator_state_files = operator_state_files or {}
    files: list[SnapshotFile] = []
    operators = []
    for op in template.operators:
        mine = sorted(
            (o for o in outputs if o.range.operator == op.operator_id),
            key=lambda o: o.range.first,
        )
        subtasks: dict[int, list[RangeOutput]] = {}
        for o in mine:
            subtasks.setdefault(o.range.subtask, []).append(o)
        sub = []
        for index, parts in sorted(subtasks.items()):
            paths = tuple(f.path for o in parts for f in o.files)
            files.extend(f for o in parts for f in o.files)
            sub.append(SubtaskSnapshot(index, (parts[0].range.first, parts[-1].range.last), paths))
        op_files = list(operator_state_files.get(op.operator_id, ()))
        files.extend(op_files)
        operators.append(
            OperatorSnapshot(
                operator_id=op.operator_id,
                key_serializer=op.key_serializer,
                states=dict(op.states),
                subtasks=tuple(sub),
                operator_state_files=tuple(f.path for f in op_files),
            )
        )
    return SnapshotMetadata(
        job=out.record.job,
        checkpoint_id=out.record.checkpoint_id,
        kind=out.kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=out.record.max_parallelism,
        parallelism=out.record.parallelism,
        operators=tuple(operators),
        files=tuple(files),
    )


def commit_output(
    catalog: Catalog, out: OutputSnapshot, meta: SnapshotMetadata, outputs: Iterable[RangeOutput]
) -> SnapshotRecord:
    """Attach files and statistics (PENDING), write ``_metadata``, then complete by CAS."""
    snap = out.snapshot
    by_path = {f.path: f for f in meta.files}
    refs: list[FileRef] = []
    for op in meta.operators:
        for st in op.subtasks:
            for p in st.files:
                f = by_path[p]
                refs.append(
                    FileRef(
                        _url(snap, p),
                        f.size,
                        f.checksum,
                        # ../ paths are files of earlier snapshots (a rescale's): shared by both
                        shared=f.shared,
                        operator=op.operator_id,
                        subtask=st.index,
                        key_group_start=st.key_group_range[0],
                        key_group_end=st.key_group_range[1],
                        details={"kind": str(f.kind)},
                    )
                )
        for p in op.operator_state_files:
            f = by_path[p]
            refs.append(
                FileRef(
                    _url(snap, p),
                    f.size,
                    f.checksum,
                    operator=op.operator_id,
                    details={"kind": str(f.kind)},
                )
            )
    data = meta.to_json()
    refs.append(
        FileRef(
            snap.metadata_url,
            len(data),
            format_checksum(zlib.crc32(data)),
            details={"kind": METADATA_FILE},
        )
    )
    catalog.attach_files(out.record.id, refs)
    stats: dict[str, dict[int, KeyGroupStatRow]] = {}
    for o in outputs:
        per_op = stats.setdefault(o.range.operator, {})
        for kg, s in o.key_group_stats.items():
            per_op[kg] = KeyGroupStatRow(o.range.operator, kg, s.rows, s.bytes)
    catalog.record_key_group_stats(
        out.record.id, [row for per_op in stats.values() for _, row in sorted(per_op.items())]
    )
    write_metadata(snap, None, meta)
    crash_point("jobs.commit.after_metadata")
    return catalog.complete_snapshot(out.record.id, out.record.version)


def abort_output(catalog: Catalog, out: OutputSnapshot, error: str) -> None:
    """Fail the PENDING output and remove everything written under its directory."""
    current = catalog.get_snapshot(out.record.id)
    if current.status is SnapshotStatus.PENDING:
        catalog.fail_snapshot(out.record.id, error=error[:2000])
    if current.status in UNFINISHED_STATUSES:
        _remove_dir(out.snapshot)


def _url(snap: SnapshotDir, relative: str) -> str:
    return snap.url_of(relative)


def _remove_dir(snap: SnapshotDir) -> None:
    # only ever a directory of a snapshot that never completed: its files are its own
    snap.remove()
