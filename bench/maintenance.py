"""Maintenance jobs on Spark against the baselines of the issue, measured in the same run.

1. Generates canonical state (~1 GB; ``--quick``: ~25 MB) with ``CanonicalWriter`` and registers
   it as a COMPLETED checkpoint in a fresh SQLite catalog: two states per key, ``count`` (value
   with a processing-time TTL, ~40% of it expired at the cleanup time) and ``seen`` (a one-element
   list, no TTL), 100-byte incompressible values.
2. (a) ttl_cleanup against a plain Spark read-filter-write of the same Parquet files (same
   filter, ``spark.read.parquet(...).where(...).write.parquet(...)``): rows per second of each.
3. (b) Spark's own offline state repartition: a streaming ``groupBy(k).count()`` on the RocksDB
   state store over as many keys, run once with ``availableNow``, then
   ``spark._streamingCheckpointManager.repartition(checkpoint, n)``: keys per second (the
   baseline the rescale job will be measured against).
4. compaction of a delta chain (the generated snapshot as its base plus one delta rewriting 1% of
   the ``count`` entries) and savepoint capture (expired entries dropped) against the same plain
   read-filter-write: rows per second of each.
5. rescale at the same max parallelism (4 -> 6, metadata only) of the generated state and of a
   state 10x smaller: both times and their ratio (nothing is rewritten, so nearly flat).
6. rescale to a new max parallelism (128 -> 256, 4 -> 8 subtasks) against (b), on the same number
   of keys: keys per second of each.

Prints one JSON object on its last line; ``targets`` holds each job against its baseline.

``--master spark://HOST:PORT`` instead times every job on ``local[2]`` and on that standalone
cluster over the same data (on this machine's disk, which a cluster on this machine shares) and
prints the cluster / local[2] ratio of each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.catalog import Catalog, upgrade
from state_engine.checkpoint.commit import reserve
from state_engine.config import Settings
from state_engine.hashing import key_hashes
from state_engine.jobs import compaction, rescale, savepoint, ttl_cleanup
from state_engine.jobs.spark import build_spark
from state_engine.keygroups import compute_key_group_range_for_operator_index, key_groups_for_hashes
from state_engine.maintenance.inputs import load_input
from state_engine.maintenance.output import OutputSnapshot, begin_output
from state_engine.maintenance.ranges import RangeOutput, WriteRange
from state_engine.maintenance.reachable import spark_url
from state_engine.serde import BytesSerializer, StrSerializer
from state_engine.snapshot.canonical import KEYED_SCHEMA, CanonicalWriter, read_key_groups
from state_engine.snapshot.delta import CLEAR, DELTA_SCHEMA, PUT, DeltaWriter
from state_engine.snapshot.metadata import (
    OperatorSnapshot,
    SnapshotFile,
    SnapshotFormat,
    SnapshotKind,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
)
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.state import StateKind, StateMetaInfo, StateTtlConfig
from state_engine.state.namespace import NamespaceSerializer

MAX_P = 128
PARALLELISM = 4
OP = "agg"
T0 = 1_700_000_000_000
TTL_MS = 3_600_000
VALUE_BYTES = 100
AT = T0 + TTL_MS + int(0.8 * TTL_MS)  # expires_at uniform in T0+TTL .. T0+3*TTL: ~40% expired


def _binary(n: int, width: int, rng: np.random.Generator) -> pa.Array:
    data = rng.integers(0, 256, size=n * width, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32).tobytes()
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def subtask_table(keys: list[str], rng: np.random.Generator) -> pa.Table:
    """Both states of ``keys``, sorted by key group (the subtask's canonical rows)."""
    n = len(keys)
    key_arr = pa.array(keys, pa.string())
    hashes = key_hashes(key_arr)
    kgs = key_groups_for_hashes(hashes, MAX_P)
    key_bytes = key_arr.cast(pa.binary())
    ser = StrSerializer()
    assert ser.serialize(keys[0]) == key_bytes[0].as_py()  # keys are stored as UTF-8
    empty = pa.array([b""] * n, pa.binary())
    count = pa.table(
        {
            "key_group": pa.array(kgs, pa.int32()),
            "key_hash": pa.array(hashes, pa.int32()),
            "key": key_bytes,
            "namespace": empty,
            "state": pa.array(["count"] * n, pa.string()),
            "user_key": pa.nulls(n, pa.binary()),
            "value": _binary(n, VALUE_BYTES, rng),
            "expires_at": pa.array(T0 + TTL_MS + rng.integers(0, 2 * TTL_MS, size=n), pa.int64()),
        },
        schema=KEYED_SCHEMA,
    )
    seen = pa.table(
        {
            "key_group": pa.array(kgs, pa.int32()),
            "key_hash": pa.array(hashes, pa.int32()),
            "key": key_bytes,
            "namespace": empty,
            "state": pa.array(["seen"] * n, pa.string()),
            "user_key": pa.array([b"\x00\x00\x00\x00"] * n, pa.binary()),
            "value": _binary(n, VALUE_BYTES, rng),
            "expires_at": pa.nulls(n, pa.int64()),
        },
        schema=KEYED_SCHEMA,
    )
    return pa.concat_tables([count, seen]).sort_by([("key_group", "ascending")])


def state_metas() -> dict[str, Any]:
    ns = NamespaceSerializer()
    return {
        "count": StateMetaInfo(
            "count",
            StateKind.VALUE,
            {"value": BytesSerializer(), "namespace": ns},
            StateTtlConfig(TTL_MS),
        ).to_dict(),
        "seen": StateMetaInfo(
            "seen", StateKind.LIST, {"value": BytesSerializer(), "namespace": ns}
        ).to_dict(),
    }


def generate(
    catalog: Catalog, storage: CheckpointStorage, keys: int, rg_bytes: int, job: str = "bench"
) -> Any:
    """Write and commit the input snapshot; returns its catalog record."""
    catalog.register_job(job, max_parallelism=MAX_P, location=storage.url_of(job))
    out = begin_output(
        catalog,
        storage,
        job,
        kind="CHECKPOINT",
        parallelism=PARALLELISM,
        max_parallelism=MAX_P,
        tag="periodic",
    )
    rng = np.random.default_rng(7)
    names = np.array([f"user-{i:010d}" for i in range(keys)], dtype=object)
    all_kgs = key_groups_for_hashes(key_hashes(pa.array(names, pa.string())), MAX_P)
    outputs = []
    for index in range(PARALLELISM):
        r = compute_key_group_range_for_operator_index(MAX_P, PARALLELISM, index)
        mine = names[(all_kgs >= r.start) & (all_kgs <= r.end)].tolist()
        table = subtask_table(mine, rng)
        with CanonicalWriter(
            out.snapshot,
            subtask=index,
            max_parallelism=MAX_P,
            key_group_range=(r.start, r.end),
            row_group_bytes=rg_bytes,
        ) as w:
            w.write_batch(table)
        written = w.finish()
        outputs.append(
            RangeOutput(
                WriteRange(OP, index, r.start, r.end), written.files, written.key_group_stats
            )
        )
    template = SnapshotMetadata(
        job=job,
        checkpoint_id=out.record.checkpoint_id,
        kind=out.kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=MAX_P,
        parallelism=PARALLELISM,
        operators=(OperatorSnapshot(OP, StrSerializer().snapshot().to_dict(), state_metas(), ()),),
        files=(),
    )
    return out.commit(out.metadata(template, outputs), outputs)


def generate_delta(catalog: Catalog, storage: CheckpointStorage, base: Any, every: int) -> Any:
    """A DELTA checkpoint: ``base``'s files (``../chk-<n>/``) plus one delta that rewrites every
    ``every``-th ``count`` entry (CLEAR + PUT of a new value), as a heap delta would."""
    src = SnapshotDir.from_url(base.location)
    meta = read_metadata(src)
    pending = reserve(
        catalog, storage, base.job, kind=SnapshotKind.CHECKPOINT, format=SnapshotFormat.DELTA,
        parallelism=meta.parallelism, max_parallelism=MAX_P, trigger="periodic",
    )  # fmt: skip
    record = pending.record
    out = OutputSnapshot(record, pending)
    rng = np.random.default_rng(3)
    op = meta.operator(OP)
    by_path = {f.path: f for f in meta.files}
    subtasks, files = [], []
    for st in op.subtasks:
        reused = [
            SnapshotFile(f"../chk-{base.checkpoint_id}/{p}", by_path[p].size, by_path[p].checksum,
                         by_path[p].kind, by_path[p].rows, by_path[p].key_groups)
            for p in st.files
        ]  # fmt: skip
        t = pa.Table.from_batches(list(read_key_groups(src, meta, st.key_group_range, operator=OP)))
        t = t.filter(pc.equal(t.column("state"), "count")).take(
            pa.array(np.arange(0, 0, 1) if t.num_rows == 0 else np.arange(0, t.num_rows // 2,
                                                                        every))
        )  # fmt: skip
        n = t.num_rows
        seq = np.arange(n, dtype=np.int64) * 2
        clear = t.set_column(5, "user_key", pa.nulls(n, pa.binary())).set_column(
            6, "value", pa.array([b""] * n, pa.binary())
        ).append_column("op", pa.array(np.full(n, CLEAR, np.int8))).append_column(
            "seq", pa.array(seq)
        )  # fmt: skip
        put = t.set_column(6, "value", _binary(n, VALUE_BYTES, rng)).append_column(
            "op", pa.array(np.full(n, PUT, np.int8))
        ).append_column("seq", pa.array(seq + 1))  # fmt: skip
        delta = pa.concat_tables([clear.cast(DELTA_SCHEMA), put.cast(DELTA_SCHEMA)]).sort_by(
            [("key_group", "ascending"), ("seq", "ascending")]
        )
        with DeltaWriter(out.snapshot, chain_index=1, subtask=st.index, max_parallelism=MAX_P,
                         key_group_range=st.key_group_range) as w:  # fmt: skip
            w.write_batch(delta)
        written = w.finish()
        files.extend(reused + list(written.files))
        subtasks.append(
            SubtaskSnapshot(
                st.index, st.key_group_range, tuple(f.path for f in reused + list(written.files))
            )
        )
    new_meta = SnapshotMetadata(
        job=base.job, checkpoint_id=record.checkpoint_id, kind=SnapshotKind.CHECKPOINT,
        format=SnapshotFormat.DELTA, max_parallelism=MAX_P, parallelism=meta.parallelism,
        operators=(OperatorSnapshot(OP, op.key_serializer, op.states, tuple(subtasks)),),
        files=tuple(files),
    )  # fmt: skip
    return out.commit(new_meta, [])


def keyed_urls(inp: Any) -> list[str]:
    """The snapshot's keyed files as Spark (Hadoop) URLs, for the plain Spark baseline."""
    snap = inp.snapshot
    return [spark_url(snap.fs.unstrip_protocol(snap.resolve(f.path))) for f in inp.keyed_files(OP)]


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def plain_read_filter_write(spark: Any, urls: list[str], out_dir: Path) -> float:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    expired = (
        (F.col("state") == "count") & F.col("expires_at").isNotNull() & (F.col("expires_at") <= AT)
    )
    spark.read.parquet(*urls).where(~expired).write.mode("overwrite").option(
        "compression", "zstd"
    ).parquet(out_dir.as_uri())
    return time.perf_counter() - started


def streaming_repartition(spark: Any, keys: int, work: Path) -> dict[str, Any]:
    """Spark's offline state repartition over ``keys`` keys in RocksDB state (4 -> 8 partitions)."""
    src = work / "stream-src"
    spark.range(0, keys, 1, 4).selectExpr("concat('user-', lpad(id, 10, '0')) AS k").write.parquet(
        src.as_uri()
    )
    checkpoint = (work / "stream-chk").as_uri()
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        started = time.perf_counter()
        query = (
            spark.readStream.schema("k string")
            .parquet(src.as_uri())
            .groupBy("k")
            .count()
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        spark._streamingCheckpointManager.repartition(checkpoint, 8)
        repartition_s = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    return {
        "keys": keys,
        "state_build_seconds": round(build_s, 3),
        "repartition_seconds": round(repartition_s, 3),
        "repartition_keys_per_s": round(keys / repartition_s),
    }


def job_times(spark: Any, catalog: Catalog, settings: Settings, record: Any, delta: Any,
              repeats: int) -> dict[str, float]:  # fmt: skip
    """The median time of each maintenance job on ``spark``, over the same input."""
    kw = {"settings": settings}
    runs = {
        "ttl_cleanup": lambda: ttl_cleanup.run(spark, catalog, snapshot=record.id, at=AT, **kw),
        "compaction": lambda: compaction.run(
            spark, catalog, snapshot=delta.id, release=False, **kw
        ),
        "savepoint": lambda: savepoint.run(spark, catalog, snapshot=record.id, at=AT, **kw),
        "rescale_same_max_p": lambda: rescale.run(
            spark, catalog, snapshot=record.id, parallelism=6, **kw
        ),
    }
    times = {name: statistics.median(timed(run)[0] for _ in range(repeats))
             for name, run in runs.items()}  # fmt: skip
    # last: it moves the job to max parallelism 256
    times["rescale_new_max_p"] = timed(
        lambda: rescale.run(
            spark, catalog, snapshot=record.id, parallelism=8, max_parallelism=256, **kw
        )
    )[0]
    return times


def compare_masters(master: str, keys: int, repeats: int, rg_bytes: int) -> dict[str, Any]:
    """Each job on ``local[2]`` and on the cluster at ``master`` (same data, one job each, files
    on this machine's disk, which the cluster's workers share): the cluster / local[2] ratios."""
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="sk-bench-maint-cluster-"))
    try:
        catalog_url = f"sqlite:///{work / 'catalog.db'}"
        upgrade(catalog_url)
        storage = CheckpointStorage((work / "checkpoints").as_uri())
        times: dict[str, dict[str, float]] = {}
        with Catalog.open(catalog_url) as catalog:
            for where in ("local[2]", master):
                job = "local" if where == "local[2]" else "cluster"
                record = generate(catalog, storage, keys, rg_bytes, job=job)
                delta = generate_delta(catalog, storage, record, 100)
                settings = Settings.from_env(
                    {"STATEKEEPER_HOME": str(work), "STATEKEEPER_CATALOG_URL": catalog_url,
                     "STATEKEEPER_CHECKPOINT_ROOT": storage.root_url,
                     "STATEKEEPER_SPARK_MASTER": where}
                )  # fmt: skip
                spark = build_spark(settings, data_bytes=record.bytes, name=f"bench-{job}")
                spark.sparkContext.setLogLevel("ERROR")
                job_times(spark, catalog, settings, record, delta, 1)  # warm-up: JVMs, workers
                record = generate(catalog, storage, keys, rg_bytes, job=f"{job}-timed")
                delta = generate_delta(catalog, storage, record, 100)
                times[job] = job_times(spark, catalog, settings, record, delta, repeats)
                spark.stop()
                SparkSession._instantiatedSession = None  # the next master gets a new session
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = {name: round(times["cluster"][name] / times["local"][name], 3)
              for name in times["local"]}  # fmt: skip
    return {
        "bench": "maintenance-cluster",
        "master": master,
        "keys": keys,
        "seconds": {k: {n: round(t, 3) for n, t in v.items()} for k, v in times.items()},
        "cluster_over_local2": ratios,
        "targets": [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small state (CI smoke run)")
    parser.add_argument("--keys", type=int, help="keys (2 rows each); default by --quick")
    parser.add_argument("--repeats", type=int, help="timed runs of each job (median)")
    parser.add_argument("--no-streaming", action="store_true", help="skip baseline (b)")
    parser.add_argument(
        "--master",
        help="a standalone master (spark://host:7077): time every job there and on local[2], "
        "same data, and report the cluster / local[2] ratio of each",
    )
    args = parser.parse_args()
    keys = args.keys or (100_000 if args.quick else 4_000_000)
    repeats = args.repeats or (3 if args.quick else 2)
    rg_bytes = (128 << 10) if args.quick else (1 << 20)
    if args.master:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        print(json.dumps(compare_masters(args.master, keys, repeats, rg_bytes)))
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="sk-bench-maint-"))
    try:
        catalog_url = f"sqlite:///{work / 'catalog.db'}"
        upgrade(catalog_url)
        storage = CheckpointStorage((work / "checkpoints").as_uri())
        settings = Settings.from_env(
            {
                "STATEKEEPER_HOME": str(work),
                "STATEKEEPER_CATALOG_URL": catalog_url,
                "STATEKEEPER_CHECKPOINT_ROOT": storage.root_url,
                "STATEKEEPER_SPARK_MASTER": os.environ.get("STATEKEEPER_SPARK_MASTER", "local[*]"),
            }
        )
        with Catalog.open(catalog_url) as catalog:
            started = time.perf_counter()
            record = generate(catalog, storage, keys, rg_bytes)
            gen_s = time.perf_counter() - started
            rows = record.entries
            spark = build_spark(
                settings, data_bytes=record.bytes, extra={"spark.driver.memory": "4g"}
            )
            spark.sparkContext.setLogLevel("ERROR")
            urls = keyed_urls(load_input(catalog, record.id))
            # warm-up: JVM, Python workers and the Parquet reader, so neither side pays for them
            spark.read.parquet(*urls).limit(1000).mapInArrow(lambda it: it, spark.read.parquet(
                *urls).schema).count()  # fmt: skip
            # rescale first, while both jobs hold one snapshot each: the catalog work a run does
            # (listing the job's snapshots) then differs by state size only
            kw = {"settings": settings}
            small = generate(catalog, storage, max(keys // 10, 1000), rg_bytes, job="bench-small")
            resc_big, resc_small = [], []
            for _ in range(max(repeats, 5)):
                t, rescaled = timed(lambda: rescale.run(
                    spark, catalog, snapshot=record.id, parallelism=6, **kw))  # fmt: skip
                resc_big.append(t)
                t, _ = timed(lambda: rescale.run(
                    spark, catalog, snapshot=small.id, parallelism=6, **kw))  # fmt: skip
                resc_small.append(t)
            plain_s, ttl_s, reports = [], [], []
            for i in range(repeats):
                plain_s.append(plain_read_filter_write(spark, urls, work / f"plain-{i}"))
                started = time.perf_counter()
                reports.append(ttl_cleanup.run(spark, catalog, settings=settings,
                                               snapshot=record.id, at=AT))  # fmt: skip
                ttl_s.append(time.perf_counter() - started)
            delta = generate_delta(catalog, storage, record, 100)
            compact_s, save_s = [], []
            for _ in range(repeats):
                # release=False: the chain stays COMPLETED, so every repeat folds the same input
                t, compacted = timed(lambda: compaction.run(
                    spark, catalog, snapshot=delta.id, release=False, **kw))  # fmt: skip
                compact_s.append(t)
                t, saved = timed(lambda: savepoint.run(
                    spark, catalog, snapshot=record.id, at=AT, **kw))  # fmt: skip
                save_s.append(t)
            # last: it moves the job to max parallelism 256
            new_max_s, new_max = timed(lambda: rescale.run(spark, catalog, snapshot=record.id,
                                                           parallelism=8, max_parallelism=256,
                                                           **kw))  # fmt: skip
            streaming = None if args.no_streaming else streaming_repartition(spark, keys, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p, t = statistics.median(plain_s), statistics.median(ttl_s)
    c, sv = statistics.median(compact_s), statistics.median(save_s)
    rb, rs = statistics.median(resc_big), statistics.median(resc_small)
    last = reports[-1]
    result = {
        "bench": "maintenance",
        "quick": args.quick,
        "cores": os.cpu_count(),
        "rows": rows,
        "input_bytes": record.bytes,
        "generate_seconds": round(gen_s, 2),
        "plain_read_filter_write": {
            "seconds": [round(s, 3) for s in plain_s],
            "rows_per_s": round(rows / p),
            "mb_per_s": round(record.bytes / p / 1e6, 1),
        },
        "ttl_cleanup": {
            "seconds": [round(s, 3) for s in ttl_s],
            "rows_per_s": round(rows / t),
            "mb_per_s": round(record.bytes / t / 1e6, 1),
            "rows_out": last["rows_out"],
            "bytes_out": last["bytes_out"],
            "dropped": last["stats"]["dropped"],
            "tasks": last["stats"]["tasks"],
        },
        "compaction": {
            "seconds": [round(x, 3) for x in compact_s],
            "rows_per_s": round(rows / c),
            "rows_out": compacted["rows_out"],
            "output_files": compacted["stats"]["output_files"],
            "tasks": compacted["stats"]["tasks"],
        },
        "savepoint": {
            "seconds": [round(x, 3) for x in save_s],
            "rows_per_s": round(rows / sv),
            "rows_out": saved["rows_out"],
            "dropped": sum(saved["stats"]["dropped"].values()),
        },
        "rescale_same_max_p": {
            "big": {"rows": rows, "seconds": [round(x, 3) for x in resc_big]},
            "small": {"rows": small.entries, "seconds": [round(x, 3) for x in resc_small]},
            "size_ratio": round(rows / small.entries, 2),
            "time_ratio": round(rb / rs, 3),
            "files_reused": rescaled["stats"]["files_reused"],
            "files_written": rescaled["stats"]["files_written"],
        },
        "rescale_new_max_p": {
            "keys": keys,
            "seconds": round(new_max_s, 3),
            "keys_per_s": round(keys / new_max_s),
            "rows_out": new_max["rows_out"],
        },
        "spark_state_repartition": streaming,
        "targets": [
            {
                "name": "ttl_cleanup_vs_plain_read_filter_write",
                "value": round(p / t, 3),
                "op": ">=",
                "target": 0.7,
            },
            {
                "name": "compaction_vs_plain_read_filter_write",
                "value": round(p / c, 3),
                "op": ">=",
                "target": 0.7,
            },
            {
                "name": "savepoint_vs_plain_read_filter_write",
                "value": round(p / sv, 3),
                "op": ">=",
                "target": 0.7,
            },
            {
                "name": "rescale_same_max_p_time_ratio_at_10x_state",
                "value": round(rb / rs, 3),
                "op": "<=",
                "target": 1.5,
            },
        ]
        + (
            [
                {
                    "name": "rescale_new_max_p_vs_spark_state_repartition_keys_per_s",
                    "value": round((keys / new_max_s) / streaming["repartition_keys_per_s"], 3),
                    "op": ">=",
                    "target": 1.0,
                }
            ]
            if streaming
            else []
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
