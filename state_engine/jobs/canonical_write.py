"""Spark tasks write canonical files; the driver commits them (see
:mod:`state_engine.maintenance.output`).

Each Spark task writes one write range (:mod:`state_engine.maintenance.ranges`) with
:class:`CanonicalWriter` through fsspec (never through Spark's writers: the files must be
key-group-aligned and indexed) and sends back the :class:`SnapshotFile` entries, the key-group
statistics and the job's own counters. Nothing of a task's output is visible until the driver
writes ``_metadata`` and the catalog completes the snapshot.

:func:`run_range_tasks` feeds the tasks: a task per write range that reads its own input (e.g.
the input snapshot's row groups of that range, through the key-group index): no shuffle at all.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from state_engine.errors import SparkTaskFailed
from state_engine.faults import pause_point
from state_engine.maintenance.ranges import RangeOutput, TargetSpec, WriteRange
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    CanonicalWriter,
    arrow_array,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
R = TypeVar("R")
_RESULT_SCHEMA = "task long, result binary"


def open_writer(target: TargetSpec, wr: WriteRange) -> CanonicalWriter:
    """Task side: the writer of one write range's files (a context manager; aborts on error)."""
    return CanonicalWriter(
        target.open(),
        subtask=wr.subtask,
        max_parallelism=target.max_parallelism,
        key_group_range=(wr.first, wr.last),
        file_prefix=f"keyed-{wr.subtask}-{wr.first}",
        row_group_bytes=target.row_group_bytes,
        target_file_bytes=target.target_file_bytes,
    )


def write_range(
    target: TargetSpec,
    wr: WriteRange,
    batches: Iterable[pa.RecordBatch],
    *,
    extra: Callable[[], dict[str, Any]] | None = None,
    counters: Callable[[], tuple[int, int]] | None = None,
) -> RangeOutput:
    """Task side: stream ``batches`` (canonical columns, key-group order) into ``wr``'s files.

    ``counters`` and ``extra`` are read after the input is exhausted (rows_in, bytes_in; the
    job's own statistics), so a lazy input can count as it goes.
    """
    with open_writer(target, wr) as writer:
        for batch in batches:
            writer.write_batch(as_canonical(batch))
        written = writer.finish()
    rows_in, bytes_in = counters() if counters is not None else (written.rows, 0)
    return RangeOutput(
        wr,
        written.files,
        written.key_group_stats,
        rows_in,
        bytes_in,
        dict(extra() if extra is not None else {}),
    )


def as_canonical(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch holding (at least) the canonical columns, as exactly the canonical schema."""
    if batch.schema.equals(KEYED_SCHEMA):
        return batch
    columns = []
    for fld in KEYED_SCHEMA:
        col = batch.column(fld.name)
        columns.append(col if col.type == fld.type else col.cast(fld.type))
    return pa.RecordBatch.from_arrays(columns, schema=KEYED_SCHEMA)


def run_range_tasks(spark: SparkSession, tasks: Sequence[T], fn: Callable[[T], R]) -> list[R]:
    """Run ``fn(task)`` for every task, one Spark task each; results in the order of ``tasks``.

    ``fn`` and the tasks travel pickled (cloudpickle); results come back pickled.

    A task that raises does not fail its Spark task: it hands its error back like a result, so
    the Spark job ends only when every task has ended. The first error is then raised as
    :class:`SparkTaskFailed`; by that time no task is still writing, so the caller's cleanup
    of the output cannot race a sibling task that is still creating files.
    """
    if not tasks:
        return []
    payload = list(tasks)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column(0).to_pylist()
            results = [pickle.dumps(_outcome(fn, payload[i]), protocol=5) for i in ids]
            yield pa.RecordBatch.from_arrays(
                [arrow_array(np.array(ids, dtype=np.int64)), arrow_array(results)],
                names=["task", "result"],
            )

    n = len(payload)
    rows = spark.range(0, n, 1, n).mapInArrow(run, _RESULT_SCHEMA).collect()
    by_id = {int(r["task"]): pickle.loads(r["result"]) for r in rows}
    outcomes = [by_id[i] for i in range(n)]
    failed = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, _TaskError)]
    if failed:
        i, err = failed[0]
        more = f" (and {len(failed) - 1} more task(s))" if len(failed) > 1 else ""
        error = SparkTaskFailed(f"task {i} of {n} ({_brief(payload[i])}) failed{more}: {err.line}")
        error.add_note(f"the task's traceback:\n{err.traceback}")
        raise error
    return outcomes


def _brief(task: object) -> str:
    text = repr(task)
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(frozen=True)
class _TaskError:
    """A task's exception, carried back as text (exceptions need not be picklable)."""

    line: str
    traceback: str


def _outcome(fn: Callable[[T], R], task: T) -> R | _TaskError:
    pause_point("spark.task.started")
    try:
        return fn(task)
    except Exception as exc:
        return _TaskError(f"{type(exc).__name__}: {exc}"[:2000], traceback.format_exc())
