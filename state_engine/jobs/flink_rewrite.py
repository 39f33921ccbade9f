"""A Flink job's snapshot rewritten into a Flink savepoint on Spark: rescale (new parallelism and
max parallelism), TTL cleanup, state surgery (``statectl flink rewrite``).

The writer (:mod:`state_engine.flink.rewrite`) plans read tasks (a source handle and key-group
range each) and output parts (one canonical key-group file per output subtask). Spark runs the
read tasks (``mapInArrow`` over :func:`read_records`), shuffles the records by output part, sorts
each partition by (part, key group, state, key) and streams each part into
:func:`write_part`, one key group in memory at a time; the driver commits ``_metadata`` once
every part is written (:func:`state_engine.flink.maintain.commit_savepoint`). The output is a
catalog SAVEPOINT of the same job, in the maintenance framework's output snapshot: a retry with
the same run id returns the first result, a failure leaves no ``_metadata`` and no COMPLETED row.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from state_engine.catalog import Catalog
from state_engine.config import Settings
from state_engine.errors import InvalidSnapshotPath, StatekeeperError
from state_engine.flink.maintain import (
    FlinkRewrite,
    commit_savepoint,
    prepare,
    restore_instructions,
    targets_flink,
)
from state_engine.flink.rewrite import (
    PartWritten,
    RewritePlan,
    read_records,
    write_metadata,
    write_part,
)
from state_engine.jobs.spark_job import maintenance_job
from state_engine.maintenance.output import output_snapshot
from state_engine.maintenance.preflight import earlier_run, record_refusal, refused_job
from state_engine.maintenance.run import JobResult, RunContext, RunTarget
from state_engine.snapshot.storage import (
    METADATA_FILE,
    FileStore,
    SnapshotDir,
    forget_object_store_clients,
)
from state_engine.snapshot_enums import SnapshotKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: What each write task hands back: one row per part it wrote.
_WRITTEN = pa.schema([("part", pa.int32()), ("written", pa.binary())])
_WRITTEN_DDL = "part int, written binary"
#: The writer's record columns (:data:`state_engine.flink.rewrite.records.SCHEMA`) for Spark.
_RECORDS_DDL = "part int, key_group int, state smallint, key binary, value binary"


class _Written:
    """A file of the output being written through :meth:`SnapshotDir.create` (exclusive, flushed
    to the disk on close), as the writer's ``with store.open_write(path) as f`` expects."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def write(self, data: bytes) -> int:
        return int(self._writer.write(data))

    def __enter__(self) -> _Written:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self._writer.close()
        else:
            self._writer.abort()


class _Held:
    """``_metadata`` as the writer writes it, kept in memory: the driver commits it itself."""

    def __init__(self, store: OutputStore) -> None:
        self._store = store
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self._store.metadata = b"".join(self._chunks)


class OutputStore(FileStore):
    """The output savepoint's directory as the writer's store: its files are snapshot files
    (never overwritten, durable before the commit), and ``_metadata`` is held back in
    :attr:`metadata` until the catalog knows every file it references."""

    def __init__(self, snap: SnapshotDir) -> None:
        super().__init__(snap.store.filesystem)
        self.snap = snap
        self.metadata: bytes | None = None

    def open_write(self, path: str) -> Any:
        root = self.snap.path.rstrip("/") + "/"
        if not path.startswith(root):
            raise InvalidSnapshotPath(f"{path} is outside the output savepoint {self.snap.url}")
        rel = path[len(root) :]
        if rel == METADATA_FILE:
            return _Held(self)
        return _Written(self.snap.create(rel))


def _resolver(kind: str) -> Any:
    def resolve(catalog: Catalog, params: dict[str, Any]) -> RunTarget:
        rewrite = prepare(catalog, kind, params)
        params["snapshot"] = rewrite.source.id  # a retry reads what the first attempt read
        return RunTarget(job=rewrite.job, input_snapshot_id=rewrite.source.id)

    return resolve


#: The object store settings of the driver that its tasks use too (fsspec's s3fs reads them).
STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
)


def _storage_env() -> dict[str, str]:
    return {name: os.environ[name] for name in STORAGE_ENV if name in os.environ}


def _use_storage_env(env: dict[str, str]) -> None:
    """In a task: the driver's object store settings, not those its Python worker started with
    (a reused worker may have started before they were set)."""
    if all(os.environ.get(name) == value for name, value in env.items()):
        return
    os.environ.update(env)
    forget_object_store_clients()


def _records(spark: SparkSession, plan: RewritePlan) -> DataFrame:
    """Every read task's records (:data:`rewrite_records.SCHEMA`), one Spark task per read task."""
    shipped = spark.sparkContext.broadcast(plan)
    n = len(plan.read_tasks)
    env = _storage_env()

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _use_storage_env(env)
        p: RewritePlan = shipped.value
        for batch in batches:
            for task in batch.column(0).to_pylist():
                yield from read_records(p, p.read_tasks[int(task)], None)

    return spark.range(0, n, 1, max(n, 1)).mapInArrow(read, _RECORDS_DDL)


def _split_by_part(
    batches: Iterator[pa.RecordBatch],
) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """``(part, its batches)`` of a stream sorted by part; each part's batches are consumed
    before the next part is yielded (nothing is held but the current batch)."""
    pending: list[pa.RecordBatch] = []
    source = iter(batches)

    def next_batch() -> pa.RecordBatch | None:
        if pending:
            return pending.pop()
        for b in source:
            if b.num_rows:
                return b
        return None

    while True:
        first = next_batch()
        if first is None:
            return
        part = int(first.column("part")[0].as_py())

        def same_part(head: pa.RecordBatch = first, part: int = part) -> Iterator[pa.RecordBatch]:
            batch: pa.RecordBatch | None = head
            while batch is not None:
                parts = batch.column("part").to_numpy()
                if parts[-1] == part:
                    yield batch
                    batch = next_batch()
                    continue
                cut = int((parts != part).argmax())
                if cut:
                    yield batch.slice(0, cut)
                pending.append(batch.slice(cut))
                return

        body = same_part()
        yield part, body
        for _ in body:  # what the writer did not read of its part (it reads all): skipped
            pass


def _write_parts(
    records: DataFrame, plan: RewritePlan, out_url: str, partitions: int
) -> dict[int, tuple[PartWritten, Counter[int]]]:
    """Shuffle the records to their parts and write each part in one task; per part what was
    written and its records per key group."""
    shuffled = records.repartition(partitions, "part").sortWithinPartitions(
        "part", "key_group", "state", "key"
    )

    env = _storage_env()

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _use_storage_env(env)
        out = SnapshotDir.from_url(out_url, allow_shared=False)
        store = OutputStore(out)
        for part, body in _split_by_part(batches):
            rows: Counter[int] = Counter()

            def counted(
                body: Iterator[pa.RecordBatch] = body, rows: Counter[int] = rows
            ) -> Iterator[pa.RecordBatch]:
                for batch in body:
                    kgs, counts = _value_counts(batch.column("key_group"))
                    rows.update(dict(zip(kgs, counts, strict=True)))
                    yield batch

            name = plan.outputs[part].file_name
            if out.has_file(name):
                # an earlier attempt of this Spark task died writing it: nobody else writes it
                out.remove_file(name)
            written = write_part(plan, part, counted(), store, out_url)
            blob = pickle.dumps((written, rows), protocol=5)
            yield pa.RecordBatch.from_arrays(
                [pa.array([part], pa.int32()), pa.array([blob], pa.binary())], schema=_WRITTEN
            )

    done: dict[int, tuple[PartWritten, Counter[int]]] = {}
    for row in shuffled.mapInArrow(write, _WRITTEN_DDL).collect():
        done[int(row["part"])] = pickle.loads(row["written"])
    return done


def _value_counts(column: pa.Array) -> tuple[list[int], list[int]]:
    import pyarrow.compute as pc

    counts = pc.value_counts(column)
    return counts.field("values").to_pylist(), counts.field("counts").to_pylist()


def rewrite_on_spark(
    spark: SparkSession, plan: RewritePlan, out: SnapshotDir
) -> tuple[bytes, list[PartWritten], dict[tuple[str, int], int]]:
    """Every part of ``plan`` written into ``out`` (parts no record reached written empty, on
    the driver), then its operator state and the ``_metadata`` bytes (not written: see
    :func:`commit_savepoint`); also the records per (operator uid, key group)."""
    partitions = max(1, min(len(plan.outputs), spark.sparkContext.defaultParallelism * 2))
    done = _write_parts(_records(spark, plan), plan, out.url, partitions) if plan.outputs else {}
    store = OutputStore(out)
    parts: list[PartWritten] = []
    rows: dict[tuple[str, int], int] = {}
    for index, output in enumerate(plan.outputs):
        if index in done:
            written, counts = done[index]
        else:
            written, counts = write_part(plan, index, iter(()), store, out.url), Counter()
        parts.append(written)
        op = plan.operators[output.op]
        uid = op.uid or op.operator_id
        for kg, n in counts.items():
            rows[(uid, int(kg))] = rows.get((uid, int(kg)), 0) + int(n)
    write_metadata(plan, parts, store, out.url)
    if store.metadata is None:
        raise InvalidSnapshotPath(f"the writer wrote no _metadata for {out.url}")
    return store.metadata, parts, rows


def _report(rewrite: FlinkRewrite) -> dict[str, Any]:
    return dict(rewrite.plan.report())


def _body(kind: str) -> Any:
    def body(
        spark: SparkSession | None,
        catalog: Catalog,
        ctx: RunContext,
        **params: Any,
    ) -> JobResult:
        rewrite = prepare(catalog, kind, params, ctx.settings)
        stats: dict[str, Any] = {
            "source_location": rewrite.source.location,
            "parallelism": rewrite.parallelism,
            "max_parallelism": rewrite.max_parallelism,
            "source_max_parallelism": rewrite.source.max_parallelism,
            "rewrite": _report(rewrite),
        }
        if not rewrite.plan.needs_rewrite:
            restore = restore_instructions(rewrite, rewrite.source.location)
            return JobResult(
                stats={
                    **stats,
                    "no_rewrite_needed": True,
                    "message": (
                        f"no rewrite needed: Flink restores snapshot {rewrite.source.id} at "
                        f"parallelism {rewrite.parallelism} as it is"
                    ),
                    "output_location": None,
                    "restore": restore,
                }
            )
        with output_snapshot(
            catalog,
            rewrite.job,
            tag=ctx.tag,
            settings=ctx.settings,
            kind=SnapshotKind.SAVEPOINT,
            parallelism=rewrite.parallelism,
            max_parallelism=rewrite.max_parallelism,
            savepoint_dir=params.get("savepoint_dir"),
            parent_id=rewrite.source.id,
            metadata_format="flink",
        ) as out:
            if out.recovered:
                result = out.recovered_result(stats)
                result.stats["restore"] = restore_instructions(rewrite, out.record.location)
                return result
            if spark is None:
                raise StatekeeperError("a Flink rewrite runs on Spark: no session was given")
            data, parts, rows = rewrite_on_spark(spark, rewrite.plan, out.snapshot)
            record = commit_savepoint(out, data, rows)
        restore = restore_instructions(rewrite, record.location)
        return JobResult(
            output_snapshot_id=record.id,
            rows_in=sum(rows.values()),
            rows_out=record.entries,
            bytes_in=rewrite.source.bytes or 0,
            bytes_out=record.bytes,
            stats={
                **stats,
                "tasks": len(rewrite.plan.read_tasks),
                "parts": len(parts),
                "output_checkpoint_id": record.checkpoint_id,
                "output_location": record.location,
                "restore": restore,
            },
        )

    body.__name__ = f"flink_{kind}"
    return body


def runner(kind: str) -> Any:
    """The recorded Spark run of a ``kind`` rewrite of a Flink job (``rescale``, ``ttl_cleanup``
    or ``flink_rewrite``): ``run(spark, catalog, *, run_id=None, ..., **params) -> report``."""
    return maintenance_job(kind, _resolver(kind))(_body(kind))


run = runner("flink_rewrite")


def run_flink_job(
    kind: str,
    params: dict[str, Any],
    ids: dict[str, Any],
    *,
    settings: Settings,
    name: str,
) -> dict[str, Any] | None:
    """Run a ``kind`` rewrite of a Flink job's snapshot (None when ``params`` name no Flink job):
    checked against the catalog first (a refusal is recorded FAILED with its job, before any
    Spark session starts); a change that needs no rewrite is answered without Spark."""
    with Catalog.from_settings(settings) as catalog:
        if not targets_flink(catalog, kind, params):
            return None
        checked = check_before_spark(kind, catalog, params, settings=settings, **ids)
        needs_spark = checked.pop("_needs_spark")
    spark = None
    if needs_spark:
        from state_engine.jobs.spark import build_spark

        spark = build_spark(settings, name=name)
    with Catalog.from_settings(settings) as catalog:
        report: dict[str, Any] = runner(kind)(spark, catalog, settings=settings, **ids, **checked)
        return report


def check_before_spark(
    kind: str,
    catalog: Catalog,
    params: dict[str, Any],
    *,
    settings: Settings,
    run_id: str | None = None,
    dag_id: str | None = None,
    airflow_run_id: str | None = None,
    task_id: str | None = None,
) -> dict[str, Any]:
    """``params`` of a Flink rewrite checked (:func:`prepare`) with the input pinned, plus
    ``_needs_spark``; a refusal is recorded as a FAILED run of the job and raised (one that
    names no job the catalog knows is not a run: nothing is recorded)."""
    params = {k: v for k, v in params.items() if v is not None}
    earlier = earlier_run(catalog, run_id)
    if earlier is not None and earlier.input_snapshot_id is not None:
        params.setdefault("snapshot", earlier.input_snapshot_id)
    if earlier is not None and earlier.status == "SUCCEEDED":
        return {**params, "_needs_spark": False}  # the run hands back its recorded report
    try:
        rewrite = prepare(catalog, kind, params, settings)
    except StatekeeperError as exc:
        if refused_job(catalog, params)[0] is None:
            raise
        record_refusal(
            catalog,
            kind,
            run_id or f"{kind}-{uuid.uuid4().hex}",
            params,
            str(exc),
            dag_id=dag_id,
            airflow_run_id=airflow_run_id,
            task_id=task_id,
        )
        raise
    return {**params, "snapshot": rewrite.source.id, "_needs_spark": rewrite.plan.needs_rewrite}
