"""Any COMPLETED canonical snapshot (checkpoint or savepoint) as a readable Spark DataFrame.

One Spark task per keyed Parquet file reads it through the snapshot's own storage (fsspec, as every
other job does: no Hadoop file system, so ``s3://`` needs no Hadoop jars) and rebuilds the key and
state serializers from their snapshots in ``_metadata`` to decode every row. Columns: ``operator``,
``key_group``, ``state``, ``key``, ``namespace``, ``user_key``, ``value``, ``expires_at``. A
decoded string is shown as is, any other value as JSON (bytes as hex); the void namespace is null;
a list element's ``user_key`` is its position.

A key filter turns the key into its key group first: only the files and row groups whose index
holds that key group are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from state_engine.catalog import Catalog
from state_engine.maintenance.inputs import InputSnapshot, load_input
from state_engine.maintenance.source import open_source
from state_engine.maintenance.state_decode import (
    COLUMNS,
    StateDecoder,
    decoder_specs,
    operators_to_read,
    read_plan,
)
from state_engine.snapshot.canonical import read_key_groups

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = (
    "operator string, key_group int, state string, key string, namespace string, "
    "user_key string, value string, expires_at long"
)


def snapshot_frame(
    spark: SparkSession,
    catalog: Catalog,
    snapshot_id: int,
    *,
    state: str | None = None,
    key: str | None = None,
    operator: str | None = None,
) -> DataFrame:
    """The decoded keyed state of a COMPLETED canonical snapshot (see the module docstring)."""
    from pyspark.sql import functions as F

    inp = load_input(catalog, snapshot_id)
    specs = decoder_specs(inp.meta)
    operators = operators_to_read(snapshot_id, specs, operator, state)
    frames = []
    for op in operators:
        frame = _operator_frame(spark, inp, op, specs, state, key)
        if frame is not None:
            frames.append(frame)
    if not frames:
        return spark.createDataFrame([], SCHEMA)
    result = frames[0]
    for f in frames[1:]:
        result = result.unionByName(f)
    return result.orderBy(F.col("operator"), F.col("key_group"), F.col("key"), F.col("state"))


def _operator_frame(
    spark: SparkSession,
    inp: InputSnapshot,
    op: str,
    specs: dict[str, dict[str, Any]],
    state: str | None,
    key: str | None,
) -> DataFrame | None:
    files, key_groups, key_bytes = read_plan(inp, op, specs, key)
    if not files:
        return None
    url, kind, meta = inp.url, inp.record.kind, inp.meta

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = StateDecoder(specs)
        snapshot = open_source(url, kind)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                for rows in read_key_groups(snapshot, meta, key_groups, files=[files[i]]):
                    rows = _matching(rows, state, key_bytes)
                    if rows.num_rows:
                        yield decoder.batch(op, rows)

    return spark.range(0, len(files), 1, len(files)).mapInArrow(decode, SCHEMA)


def _matching(batch: pa.RecordBatch, state: str | None, key: bytes | None) -> pa.RecordBatch:
    mask = None
    if state is not None:
        mask = pc.equal(batch.column("state"), state)
    if key is not None:
        by_key = pc.equal(batch.column("key"), pa.scalar(key, pa.binary()))
        mask = by_key if mask is None else pc.and_(mask, by_key)
    return batch if mask is None else batch.filter(mask)


def show_rows(
    spark: SparkSession,
    catalog: Catalog,
    snapshot_id: int,
    *,
    state: str | None = None,
    key: str | None = None,
    operator: str | None = None,
    limit: int | None = 100,
) -> list[dict[str, Any]]:
    """The first ``limit`` decoded rows, as dicts in :data:`COLUMNS` order."""
    df = snapshot_frame(spark, catalog, snapshot_id, state=state, key=key, operator=operator)
    if limit is not None:
        df = df.limit(limit)
    return [{c: row[c] for c in COLUMNS} for row in df.collect()]
