"""The run template of the maintenance jobs that rewrite one snapshot into a new one.

Its shape: the input snapshot is loaded; the job plans what to write from it (:class:`Rewrite`);
the output snapshot is reserved, or found committed by an earlier attempt of the same run (then
nothing is written again); the job's tasks write their key-group ranges into it; the driver
commits it once every part is durable; the report is built from what the tasks handed back.
Compaction, savepoint, TTL cleanup and rescale fill it in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.maintenance.inputs import InputSnapshot, load_input
from state_engine.maintenance.output import OutputSnapshot, output_snapshot
from state_engine.maintenance.ranges import RangeOutput
from state_engine.maintenance.run import JobResult, RunContext
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind


@dataclass
class Written:
    """What a rewrite's tasks wrote into the output, for the commit and the report.

    ``meta`` None: the output's ``_metadata`` is the input's operators and states over the new
    files, with the input's operator state copied. A counter left None is the outputs' sum
    (``bytes_out``: the output snapshot's bytes as the catalog records them).
    """

    outputs: Sequence[RangeOutput]
    meta: SnapshotMetadata | None = None
    tasks: int | None = None
    rows_in: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class Finish(Protocol):
    def __call__(self, output: SnapshotRecord, /, *, recovered: bool) -> dict[str, Any]: ...


def _nothing_more(record: SnapshotRecord, *, recovered: bool) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Rewrite:
    """What a job writes from its input: the output snapshot and the steps that fill it.

    ``stats`` is in every report, a recovered run's too. ``write`` runs the tasks into the
    reserved output. ``finish`` runs once the output is COMPLETED, after the commit or when an
    earlier attempt committed it (``recovered``); what it returns joins the report's stats.
    """

    kind: SnapshotKind | str
    parallelism: int
    max_parallelism: int
    write: Callable[[OutputSnapshot], Written]
    stats: dict[str, Any] = field(default_factory=dict)
    savepoint_dir: str | None = None
    finish: Finish = _nothing_more


def rewrite_run(
    catalog: Catalog,
    ctx: RunContext,
    snapshot: int,
    *,
    reads: tuple[SnapshotFormat, ...],
    plan: Callable[[InputSnapshot], Rewrite],
    hold: AbstractContextManager[object] | None = None,
) -> JobResult:
    """Rewrite snapshot ``snapshot`` (of one of the formats ``reads``) as ``plan`` says.

    ``hold`` is held from loading the input until the output is committed (a lease that keeps
    the input's files from being deleted meanwhile).
    """
    with hold if hold is not None else contextlib.nullcontext():
        inp = load_input(catalog, snapshot, allow=reads)
        rewrite = plan(inp)
        with output_snapshot(
            catalog,
            inp.record.job,
            tag=ctx.tag,
            settings=ctx.settings,
            kind=rewrite.kind,
            parallelism=rewrite.parallelism,
            max_parallelism=rewrite.max_parallelism,
            savepoint_dir=rewrite.savepoint_dir,
        ) as out:
            if out.recovered:
                more = rewrite.finish(out.record, recovered=True)
                return out.recovered_result({**rewrite.stats, **more})
            written = rewrite.write(out)
            meta = written.meta
            if meta is None:
                copied = out.copy_operator_state(inp.snapshot, inp.meta)
                meta = out.metadata(inp.meta, written.outputs, copied)
            record = out.commit(meta, written.outputs)
    more = rewrite.finish(record, recovered=False)
    outputs = written.outputs
    tasks = {} if written.tasks is None else {"tasks": written.tasks}
    return JobResult(
        output_snapshot_id=record.id,
        rows_in=sum(o.rows_in for o in outputs) if written.rows_in is None else written.rows_in,
        rows_out=record.entries,
        bytes_in=sum(o.bytes_in for o in outputs) if written.bytes_in is None else written.bytes_in,
        bytes_out=record.bytes if written.bytes_out is None else written.bytes_out,
        stats={
            **rewrite.stats,
            **written.stats,
            **tasks,
            "output_checkpoint_id": record.checkpoint_id,
            "output_location": record.location,
            **more,
        },
    )
