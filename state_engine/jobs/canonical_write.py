"""Spark tasks write canonical files; the driver commits them (see :mod:`state_engine.jobs.commit`).

A job splits the key-group space into *write ranges*: each subtask's Flink key-group range cut
into ``m`` contiguous pieces, so there are enough tasks to keep every core busy even when the
snapshot has one subtask. A subtask's files are then its pieces' files in key-group order, which
is the order a restore reads them in. Each Spark task writes one write range with
:class:`CanonicalWriter` through fsspec (never through Spark's writers: the files must be
key-group-aligned and indexed) and sends back the :class:`SnapshotFile` entries, the key-group
statistics and the job's own counters. Nothing of a task's output is visible until the driver
writes ``_metadata`` and the catalog completes the snapshot.

Two ways to feed the tasks:
- :func:`run_range_tasks`: a task per write range that reads its own input (e.g. the input
  snapshot's row groups of that range, through the key-group index): no shuffle at all.
- :func:`write_frame`: rows from any DataFrame in the canonical schema (e.g. re-bucketed to a new
  max parallelism), shuffled so that one partition holds exactly one write range.
"""

from __future__ import annotations

import math
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from state_engine.checkpoint.canonical import (
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_TARGET_FILE_BYTES,
    KEYED_SCHEMA,
    CanonicalWriter,
    KeyGroupStats,
    arrow_array,
)
from state_engine.checkpoint.metadata import SnapshotFile
from state_engine.checkpoint.storage import SnapshotDir
from state_engine.errors import InvalidJobParams, SparkTaskFailed
from state_engine.faults import pause_point
from state_engine.keygroups import compute_key_group_range_for_operator_index

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")
R = TypeVar("R")
_RESULT_SCHEMA = "task long, result binary"


@dataclass(frozen=True)
class TargetSpec:
    """Where the tasks write: a snapshot directory URL (fsspec) and the writer's sizing."""

    url: str
    max_parallelism: int
    allow_shared: bool = True
    storage_options: dict[str, Any] = field(default_factory=dict)
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES

    def open(self) -> SnapshotDir:
        return SnapshotDir.from_url(
            self.url, self.storage_options or None, allow_shared=self.allow_shared
        )


@dataclass(frozen=True)
class WriteRange:
    """Key groups ``first..last`` of ``operator``, written as part of ``subtask``'s files."""

    operator: str
    subtask: int
    first: int
    last: int


@dataclass(frozen=True)
class RangeOutput:
    """What one task wrote for one write range."""

    range: WriteRange
    files: tuple[SnapshotFile, ...]
    key_group_stats: dict[int, KeyGroupStats]
    rows_in: int = 0
    bytes_in: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_out(self) -> int:
        return sum(f.rows or 0 for f in self.files)

    @property
    def bytes_out(self) -> int:
        return sum(f.size for f in self.files)


def plan_write_ranges(
    max_parallelism: int, parallelism: int, operators: Sequence[str], min_tasks: int = 1
) -> list[WriteRange]:
    """Every operator's subtask ranges, each cut into enough pieces for ``min_tasks`` tasks.

    The pieces are the Flink ranges at parallelism ``parallelism * m``: since
    ``floor(floor(x * m) / m) == floor(x)``, each piece lies inside one subtask's range.
    """
    if not 1 <= parallelism <= max_parallelism:
        raise InvalidJobParams(
            f"parallelism {parallelism} is not within 1..{max_parallelism} (max parallelism)"
        )
    if not operators:
        raise InvalidJobParams("no operator to write: the snapshot holds no keyed operator")
    per_op = max(1, math.ceil(min_tasks / len(operators)))
    m = max(1, min(math.ceil(per_op / parallelism), max_parallelism // parallelism))
    pieces = parallelism * m
    out = []
    for op in operators:
        for i in range(pieces):
            rng = compute_key_group_range_for_operator_index(max_parallelism, pieces, i)
            out.append(WriteRange(op, i // m, rng.start, rng.end))
    return out


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


def _partition_keys(spark: SparkSession, partitions: int) -> list[int] | None:
    """For each partition j a long whose Spark hash lands in partition j (None if one is missing).

    ``repartition(n, col)`` places a row in ``pmod(murmur3(col, 42), n)``, the same as
    ``pmod(hash(col), n)``; keying rows by these values gives one write range per partition.
    """
    from pyspark.sql import functions as F

    found = (
        spark.range(0, 64 * partitions)
        .select("id", F.expr(f"pmod(hash(id), {partitions})").alias("p"))
        .groupBy("p")
        .agg(F.min("id").alias("id"))
        .collect()
    )
    by_p = {int(r["p"]): int(r["id"]) for r in found}
    if len(by_p) < partitions:
        return None
    return [by_p[j] for j in range(partitions)]


def write_frame(
    df: DataFrame,
    target: TargetSpec,
    ranges: Sequence[WriteRange],
    *,
    operator: str,
) -> list[RangeOutput]:
    """Write the canonical rows of ``df`` (one operator) as ``ranges``' files.

    ``ranges`` must be this operator's pieces from :func:`plan_write_ranges` (``W`` equal pieces
    of the key-group space, in order), so a row's piece is ``key_group * W div max_parallelism``.
    """
    from pyspark.sql import functions as F

    mine = [r for r in ranges if r.operator == operator]
    pieces = len(mine)
    max_p = target.max_parallelism
    expected = [compute_key_group_range_for_operator_index(max_p, pieces, i) for i in range(pieces)]
    if pieces == 0 or [(r.first, r.last) for r in mine] != [(e.start, e.end) for e in expected]:
        raise InvalidJobParams(
            f"write ranges of operator {operator!r} are not the {pieces} equal pieces of "
            f"0..{max_p - 1}; plan them with plan_write_ranges"
        )
    keys = _partition_keys(df.sparkSession, pieces)
    piece = F.expr(f"CAST((CAST(key_group AS BIGINT) * {pieces}) DIV {max_p} AS INT)")
    shaped = df.select(*KEYED_SCHEMA.names).withColumn("_piece", piece)
    if keys is not None:
        shaped = shaped.withColumn(
            "_pkey", F.element_at(F.array(*[F.lit(k) for k in keys]), F.col("_piece") + 1)
        ).repartition(pieces, "_pkey")
    else:
        shaped = shaped.repartition(pieces, "_piece")
    shaped = shaped.sortWithinPartitions("_piece", "key_group")

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np

        outputs: list[RangeOutput] = []
        current: int | None = None
        writer: CanonicalWriter | None = None
        rows = 0

        def finish() -> None:
            if writer is not None and current is not None:
                written = writer.finish()
                outputs.append(
                    RangeOutput(mine[current], written.files, written.key_group_stats, rows)
                )

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                ids = batch.column("_piece").to_numpy(zero_copy_only=False)
                starts = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1])
                ends = np.append(starts[1:], batch.num_rows)
                for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                    pid = int(ids[start])
                    if pid != current:
                        finish()
                        current, rows = pid, 0
                        writer = open_writer(target, mine[pid])
                    assert writer is not None
                    writer.write_batch(as_canonical(batch.slice(start, end - start)))
                    rows += end - start
            finish()
        except BaseException:
            if writer is not None:
                writer.abort()
            # files of ranges finished in this task are not in any _metadata: remove them too
            snap = target.open()
            for o in outputs:
                for f in o.files:
                    snap.remove_file(f.path)
            raise
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([mine.index(o.range) for o in outputs], pa.int64()),
                pa.array([pickle.dumps(o, protocol=5) for o in outputs], pa.binary()),
            ],
            names=["task", "result"],
        )

    results = shaped.mapInArrow(write, _RESULT_SCHEMA).collect()
    by_piece = {int(r["task"]): pickle.loads(r["result"]) for r in results}
    # a piece with no rows has no partition data: it writes no files but keeps its range
    return [by_piece.get(i, RangeOutput(mine[i], (), {})) for i in range(pieces)]
