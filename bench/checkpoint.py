"""Checkpoints of running state: full, incremental and rescaled restore, on heap and RocksDB.

For each backend, a job at parallelism 2 holds one value state over N keys (1M; 100k with
``--quick``), and a real catalog (SQLite) records every snapshot:

- full checkpoint (canonical) vs plain pyarrow Parquet writing the same rows in the same run
  (both read the same snapshot view; plain = columns -> Arrow table -> ``pq.write_table``);
- incremental checkpoint after changing 1% of the keys: heap delta (base + delta files) and RocksDB
  native (SSTs uploaded once); time vs the full checkpoint above, bytes vs the first (full)
  checkpoint of the same incremental manager (the time vs that one is reported too);
- restore of one subtask at parallelism 3 from the canonical checkpoint: bytes read vs that
  key-group range's share of the snapshot, and time vs a full restore (everything into one
  subtask).

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.rocksdb import RocksDBBackendFactory
from state_engine.catalog import Catalog, upgrade
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import SubtaskState
from state_engine.keygroups import (
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from state_engine.snapshot.canonical import KEYED_SCHEMA
from state_engine.snapshot.metadata import FileKind, read_metadata
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.state import ValueStateDescriptor

MAX_P = 128
P = 2
OP = "agg"
VALUE = ValueStateDescriptor("value", bytes)


def make_job(kind: str, base: Path) -> list[SubtaskState]:
    factory: Any = (
        HeapBackendFactory(track_changes=True) if kind == "heap" else RocksDBBackendFactory(base)
    )
    out = []
    for i in range(P):
        rng = compute_key_group_range_for_operator_index(MAX_P, P, i)
        out.append(SubtaskState(i, {OP: factory.create(OP, i, str, MAX_P, rng, None)}))
    return out


def write(job: list[SubtaskState], keys: list[str], rnd: random.Random) -> None:
    states = [st.keyed[OP].get_state(VALUE) for st in job]
    for k in keys:
        i = assign_to_key_group(k, MAX_P) * P // MAX_P
        job[i].keyed[OP].set_current_key(k)
        states[i].update(rnd.randbytes(24))


def plain_parquet(job: list[SubtaskState], out: Path) -> tuple[float, int]:
    """The baseline: the same rows from the same kind of view, written by plain pyarrow."""
    t = time.perf_counter()
    rows = 0
    for st in job:
        with (
            st.keyed[OP].snapshot_view() as view,
            pq.ParquetWriter(out / f"plain-{st.subtask_index}.parquet", KEYED_SCHEMA) as writer,
        ):
            it = view.iter_entries()
            while chunk := list(itertools.islice(it, 65536)):
                arrays = [
                    pa.array(c, type=f.type)
                    for c, f in zip(zip(*chunk, strict=True), KEYED_SCHEMA, strict=True)
                ]
                writer.write_table(pa.Table.from_arrays(arrays, schema=KEYED_SCHEMA))
                rows += len(chunk)
    return time.perf_counter() - t, rows


def timed_checkpoint(m: CheckpointManager, job: list[SubtaskState]) -> tuple[float, Any, Any]:
    t = time.perf_counter()
    pending = m.trigger(job)
    record = pending.result()
    return time.perf_counter() - t, pending, record


def run_backend(kind: str, n: int, root: Path, catalog: Catalog) -> dict[str, Any]:
    rnd = random.Random(7)
    keys = [f"key-{i:08d}" for i in range(n)]
    job = make_job(kind, root / f"{kind}-db")
    write(job, keys, rnd)
    storage = CheckpointStorage((root / f"{kind}-checkpoints").as_uri())
    out: dict[str, Any] = {"backend": kind, "keys": n}

    plain_s, rows = plain_parquet(job, root)
    # smaller row groups than the 1 MiB default: this state is small per key group, and a
    # rescaled subtask over-reads at most one row group at each end of its range per file
    canon = CheckpointManager(
        catalog,
        storage,
        f"{kind}-canonical",
        max_parallelism=MAX_P,
        parallelism=P,
        row_group_bytes=128 * 1024,
    )
    full_s, _, full = timed_checkpoint(canon, job)
    out.update(
        rows=rows,
        plain_seconds=round(plain_s, 3),
        full_seconds=round(full_s, 3),
        full_vs_plain=round(plain_s / full_s, 3),
        full_bytes=full.bytes,
    )

    # incremental: heap delta or RocksDB native, first (full) vs after changing 1% of the keys
    fmt = "delta" if kind == "heap" else "native"
    inc = CheckpointManager(
        catalog,
        storage,
        f"{kind}-{fmt}",
        max_parallelism=MAX_P,
        parallelism=P,
        format=fmt,
        incremental=True,
    )
    first_s, first, _ = timed_checkpoint(inc, job)
    write(job, rnd.sample(keys, n // 100), rnd)
    second_s, second, _ = timed_checkpoint(inc, job)
    out[f"{fmt}_first_seconds"] = round(first_s, 3)
    out[f"{fmt}_first_bytes"] = first.stats.bytes_written
    out[f"{fmt}_incremental_seconds"] = round(second_s, 3)
    out[f"{fmt}_incremental_bytes"] = second.stats.bytes_written
    out[f"{fmt}_incremental_sync_ms"] = round(second.stats.sync_ms, 1)
    out[f"{fmt}_incremental_async_ms"] = round(second.stats.async_ms, 1)
    out[f"{fmt}_time_ratio_vs_first"] = round(second_s / first_s, 4)
    out[f"{fmt}_time_ratio"] = round(second_s / full_s, 4)
    out[f"{fmt}_bytes_ratio"] = round(second.stats.bytes_written / first.stats.bytes_written, 4)
    inc.close()

    # restore one subtask of 3 from the canonical checkpoint, vs everything into one subtask
    snap = storage.snapshot(full.location)
    meta = read_metadata(snap)
    keyed_bytes = sum(f.size for f in meta.files if f.kind is FileKind.KEYED)
    stats = {s.key_group: s.rows for s in catalog.key_group_stats(full.id, OP)}
    total_rows = sum(stats.values())
    factory: Any = HeapBackendFactory() if kind == "heap" else RocksDBBackendFactory(root / "r")
    t = time.perf_counter()
    whole = canon.restore(full.id, parallelism=1, factory=factory)
    whole_s = time.perf_counter() - t
    for st in whole.subtasks:
        st.keyed[OP].close()
    t = time.perf_counter()
    one = canon.restore(full.id, parallelism=3, factory=factory, subtask_indexes=[1])
    one_s = time.perf_counter() - t
    rng = compute_key_group_range_for_operator_index(MAX_P, 3, 1)
    share = keyed_bytes * sum(stats.get(kg, 0) for kg in rng) / total_rows
    out.update(
        restore_full_seconds=round(whole_s, 3),
        restore_one_of_3_seconds=round(one_s, 3),
        restore_time_ratio=round(one_s / whole_s, 3),
        restore_bytes_read=one.read_stats[0].bytes_read,
        restore_share_bytes=round(share),
        restore_bytes_vs_share=round(one.read_stats[0].bytes_read / share, 4),
    )
    for st in one.subtasks:
        st.keyed[OP].close()
    canon.close()
    for st in job:
        st.keyed[OP].close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k keys instead of 1M")
    parser.add_argument("--keys", type=int, default=None)
    args = parser.parse_args()
    n = args.keys or (100_000 if args.quick else 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="sk-bench-checkpoint-"))
    try:
        upgrade(f"sqlite:///{root}/catalog.db")
        with Catalog.open(f"sqlite:///{root}/catalog.db") as catalog:
            results = [run_backend(kind, n, root, catalog) for kind in ("heap", "rocksdb")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    targets = []
    for r in results:
        b = r["backend"]
        fmt = "delta" if b == "heap" else "native"
        targets += [
            {
                "name": f"{b}_full_vs_plain_parquet",
                "value": r["full_vs_plain"],
                "op": ">=",
                "target": 0.7,
            },
            {
                "name": f"{b}_{fmt}_incremental_time_vs_full",
                "value": r[f"{fmt}_time_ratio"],
                "op": "<=",
                "target": 0.05,
            },
            {
                "name": f"{b}_{fmt}_incremental_bytes_vs_full",
                "value": r[f"{fmt}_bytes_ratio"],
                "op": "<=",
                "target": 0.05,
            },
            {
                "name": f"{b}_restore_one_subtask_bytes_vs_share",
                "value": r["restore_bytes_vs_share"],
                "op": "<=",
                "target": 1.1,
            },
        ]
    # restore_time_ratio (one subtask of 3 vs everything into one) is reported in results; the
    # issue sets no target for it
    print(json.dumps({"bench": "checkpoint", "keys": n, "results": results, "targets": targets}))


if __name__ == "__main__":
    main()
