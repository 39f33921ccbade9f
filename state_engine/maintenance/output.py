"""The snapshot a maintenance job writes: one context manager around the commit protocol.

Every writing of a snapshot by a maintenance run (the rewrite template,
:mod:`state_engine.maintenance.rewrite`; the Flink conversion) runs inside
:func:`output_snapshot`::

    with output_snapshot(catalog, job, tag=ctx.tag, kind=SnapshotKind.SAVEPOINT, ...) as out:
        if out.recovered:                       # an earlier attempt of the run committed it
            return out.recovered_result(stats)
        ...                                     # Spark tasks write into out.target()
        record = out.commit(out.metadata(template, outputs, op_files), outputs)

On entry, what an earlier attempt of the same run left (found by its tag, see
:func:`~state_engine.maintenance.run.run_tag`) is looked at: a COMPLETED output is handed back as
``recovered`` (nothing is written again); a PENDING or FAILED one is abandoned (FAILED, its files
forgotten by the catalog and removed), so the retry writes the output once, into the same fixed
savepoint directory too. Otherwise the job's next checkpoint id is reserved (PENDING) through
:mod:`state_engine.checkpoint.commit`, which also completes it (``commit``) or, when the body
raises, aborts it: FAILED, its directory removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from state_engine.catalog import KeyGroupStatRow, SnapshotRecord
from state_engine.checkpoint.commit import PendingCommit, abandon, reserve
from state_engine.config import Settings
from state_engine.errors import InvalidJobParams, InvalidSnapshotRequest
from state_engine.maintenance.job_storage import storage_for
from state_engine.maintenance.ranges import RangeOutput, TargetSpec
from state_engine.maintenance.run import JobResult
from state_engine.snapshot.canonical import DEFAULT_ROW_GROUP_BYTES, DEFAULT_TARGET_FILE_BYTES
from state_engine.snapshot.metadata import (
    FileKind,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
)
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import (
    UNFINISHED_STATUSES,
    SnapshotFormat,
    SnapshotKind,
    SnapshotStatus,
)

if TYPE_CHECKING:
    from state_engine.catalog import Catalog


class OutputSnapshot:
    """A job's output: reserved (PENDING) and written by the body, or ``recovered``."""

    def __init__(self, record: SnapshotRecord, pending: PendingCommit | None) -> None:
        self.record = record
        self._pending = pending
        self.committed = False

    @property
    def recovered(self) -> bool:
        """An earlier attempt of the run committed this output: there is nothing to write."""
        return self._pending is None

    @property
    def pending(self) -> PendingCommit:
        if self._pending is None:
            raise InvalidSnapshotRequest(
                f"snapshot {self.record.id} of job {self.record.job!r} was committed by an "
                "earlier attempt of this run; it is not written again"
            )
        return self._pending

    @property
    def snapshot(self) -> SnapshotDir:
        return self.pending.snapshot

    @property
    def kind(self) -> SnapshotKind:
        return self.pending.kind

    def target(
        self, *, row_group_bytes: int | None = None, target_file_bytes: int | None = None
    ) -> TargetSpec:
        """Where the tasks write the output's canonical files, of these sizes (None or 0: the
        writer's defaults)."""
        return TargetSpec(
            url=self.snapshot.url,
            max_parallelism=self.record.max_parallelism,
            allow_shared=self.snapshot.allow_shared,
            row_group_bytes=int(row_group_bytes) if row_group_bytes else DEFAULT_ROW_GROUP_BYTES,
            target_file_bytes=(
                int(target_file_bytes) if target_file_bytes else DEFAULT_TARGET_FILE_BYTES
            ),
        )

    def recovered_result(self, stats: dict[str, Any]) -> JobResult:
        """The report of a run whose output an earlier attempt committed."""
        done = self.record
        return JobResult(
            output_snapshot_id=done.id,
            rows_out=done.entries,
            bytes_out=done.bytes,
            stats={**stats, "recovered": True, "output_location": done.location},
        )

    def metadata(
        self,
        template: SnapshotMetadata,
        outputs: Sequence[RangeOutput],
        operator_state_files: Mapping[str, Sequence[SnapshotFile]] | None = None,
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
                rng = (parts[0].range.first, parts[-1].range.last)
                sub.append(SubtaskSnapshot(index, rng, paths))
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
            job=self.record.job,
            checkpoint_id=self.record.checkpoint_id,
            kind=self.kind,
            format=SnapshotFormat.CANONICAL,
            max_parallelism=self.record.max_parallelism,
            parallelism=self.record.parallelism,
            operators=tuple(operators),
            files=tuple(files),
        )

    def copy_operator_state(
        self, src: SnapshotDir, meta: SnapshotMetadata
    ) -> dict[str, list[SnapshotFile]]:
        """Copy every operator-state file of ``meta`` into the output directory (they are small)."""
        copied: dict[str, list[SnapshotFile]] = {}
        by_path = {f.path: f for f in meta.files}
        for op in meta.operators:
            paths = list(op.operator_state_files) + [
                p for st in op.subtasks for p in st.files if by_path[p].kind is FileKind.OPERATOR
            ]
            for path in dict.fromkeys(paths):
                f = by_path[path]
                with src.open_input(path) as fh:
                    data = fh.read()
                name = self.snapshot.new_file_name(f"operator-{op.operator_id}", ".parquet")
                info = self.snapshot.write_file(name, data)
                copied.setdefault(op.operator_id, []).append(
                    SnapshotFile(info.path, info.size, info.checksum, FileKind.OPERATOR, f.rows)
                )
        return copied

    def commit(self, meta: SnapshotMetadata, outputs: Iterable[RangeOutput]) -> SnapshotRecord:
        """Attach the files and key-group statistics, write ``_metadata``, complete by CAS."""
        stats: dict[str, dict[int, KeyGroupStatRow]] = {}
        for o in outputs:
            per_op = stats.setdefault(o.range.operator, {})
            for kg, s in o.key_group_stats.items():
                per_op[kg] = KeyGroupStatRow(o.range.operator, kg, s.rows, s.bytes)
        rows = [row for per_op in stats.values() for _, row in sorted(per_op.items())]
        self.pending.attach(meta, rows)
        self.record = self.pending.complete(meta)
        self.committed = True
        return self.record


def previous_output(catalog: Catalog, job: str, tag: str) -> SnapshotRecord | None:
    """The COMPLETED snapshot an earlier attempt of the run committed; abandons any other.

    An attempt that died after reserving its snapshot leaves it PENDING (or FAILED) with files:
    those are failed, forgotten and removed here, so the retry writes the output once (never
    the directory of the COMPLETED output, when attempts share a fixed savepoint directory).
    """
    done = None
    for snap in catalog.list_snapshots(job):
        if snap.trigger != tag:
            continue
        if snap.status is SnapshotStatus.COMPLETED:
            done = snap
        elif snap.status in UNFINISHED_STATUSES:
            abandon(catalog, snap, "abandoned by an earlier attempt of its run")
    return done


def begin_output(
    catalog: Catalog,
    storage: CheckpointStorage,
    job: str,
    *,
    tag: str,
    kind: SnapshotKind | str,
    parallelism: int,
    max_parallelism: int,
    savepoint_dir: str | None = None,
    parent_id: int | None = None,
    metadata_format: str = "statekeeper",
) -> OutputSnapshot:
    """Reserve the job's next checkpoint id and directory for an output tagged ``tag`` (PENDING);
    the caller commits or aborts it (jobs use :func:`output_snapshot`, which does both).
    ``parent_id``: the snapshot it was made from (a conversion's input)."""
    try:
        kind_ = SnapshotKind(str(kind).upper())
    except ValueError:
        raise InvalidJobParams(
            f"output kind {kind!r} is unknown; use CHECKPOINT or SAVEPOINT"
        ) from None
    if savepoint_dir is not None and kind_ is not SnapshotKind.SAVEPOINT:
        raise InvalidJobParams("savepoint_dir is only for kind SAVEPOINT")
    pending = reserve(
        catalog,
        storage,
        job,
        kind=kind_,
        format=SnapshotFormat.CANONICAL,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        trigger=tag,
        savepoint_dir=savepoint_dir,
        parent_id=parent_id,
        metadata_format=metadata_format,
    )
    return OutputSnapshot(pending.record, pending)


@contextmanager
def output_snapshot(
    catalog: Catalog,
    job: str,
    *,
    tag: str,
    kind: SnapshotKind | str,
    parallelism: int,
    max_parallelism: int,
    savepoint_dir: str | None = None,
    storage: CheckpointStorage | None = None,
    settings: Settings | None = None,
    parent_id: int | None = None,
    metadata_format: str = "statekeeper",
) -> Iterator[OutputSnapshot]:
    """The run's output snapshot (see the module docstring); aborted if the body raises."""
    done = previous_output(catalog, job, tag)
    if done is not None:
        yield OutputSnapshot(done, None)
        return
    out = begin_output(
        catalog,
        storage or storage_for(catalog, job, settings),
        job,
        tag=tag,
        kind=kind,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        savepoint_dir=savepoint_dir,
        parent_id=parent_id,
        metadata_format=metadata_format,
    )
    try:
        yield out
    except BaseException as exc:
        if not out.committed:
            out.pending.abort(str(exc))
        raise
    if not out.committed:
        out.pending.abort("the job wrote no output")
        raise InvalidSnapshotRequest(
            f"output snapshot {out.snapshot.url} of job {job!r} was reserved but not "
            "committed; it is removed"
        )
