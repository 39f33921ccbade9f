"""End-to-end records/s of the fraud job (the demo's job), with checkpoints every 10,000 records
and without, on each backend.

Configurations, all at parallelism 2 over the same generated stream:

- heap, checkpoints off / canonical (full Parquet) / delta (heap incremental), the files written
  by a forked child (the default) and, for comparison, on the checkpoint thread (``*_thread``);
- RocksDB, checkpoints off / native incremental (SSTs uploaded once into shared/).

With ``--storage s3`` the checkpoints go to an S3 endpoint instead of local files: moto's server
(a dev dependency, the one the cluster tests run) started on 127.0.0.1 for the run. There a
forked child writes the heap files into a local spool that the checkpoint thread uploads
(``*_thread``: the checkpoint thread writes them itself, the path before the spool existed).

A checkpointed run includes everything a job pays: the synchronous phase on the task thread, the
asynchronous write on the checkpoint thread (sharing the GIL), the catalog commit (SQLite) and
retention. Target from the issue: checkpointing costs at most 20% of throughput, i.e. records/s
with checkpoints / records/s without >= 0.8 per backend. Each configuration runs ``--repeat``
times, interleaved, and the best run counts (other load on the machine only slows runs down).

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from state_engine.catalog import Catalog, upgrade
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.examples import fraud
from state_engine.runtime import CollectedOutput, CollectSink, JobRunner

EVERY = 10_000
TARGET_RATIO = 0.8

# name -> (backend, checkpoint format or None for off, incremental, files written by a fork)
CONFIGS: dict[str, tuple[str, str | None, bool, bool]] = {
    "heap_off": ("heap", None, False, True),
    "heap_canonical": ("heap", "canonical", False, True),
    "heap_delta": ("heap", "delta", True, True),
    "heap_canonical_thread": ("heap", "canonical", False, False),
    "heap_delta_thread": ("heap", "delta", True, False),
    "rocksdb_off": ("rocksdb", None, False, True),
    "rocksdb_native_incremental": ("rocksdb", "native", True, True),
}
BASELINE = {"heap": "heap_off", "rocksdb": "rocksdb_off"}


def run_once(
    name: str, stream: dict[str, int], work: Path, run: int, storage_root: str | None = None
) -> dict[str, Any]:
    backend, fmt, incremental, fork_writer = CONFIGS[name]
    base = work / f"{name}-{run}"
    base.mkdir(parents=True)
    factory: Any = (
        RocksDBBackendFactory(base / "rocksdb")
        if backend == "rocksdb"
        else HeapBackendFactory(track_changes=fmt == "delta")
    )
    job = fraud.build_job(
        2,
        factory,
        checkpoint_every=EVERY if fmt is not None else None,
        format=fmt or "canonical",
        incremental=incremental,
        sink=CollectSink(CollectedOutput()),
        name=f"bench-{name}-{run}".replace("_", "-"),
        **stream,
    ).with_(fork_writer=fork_writer)
    catalog = None
    kwargs: dict[str, Any] = {}
    if fmt is not None:
        url = f"sqlite:///{base / 'catalog.db'}"
        upgrade(url)
        catalog = Catalog.open(url)
        where = (base / "checkpoints").as_uri() if storage_root is None else storage_root
        kwargs = {"catalog": catalog, "storage": f"{where}/{name}-{run}"}
    try:
        started = time.perf_counter()
        with JobRunner(job, **kwargs) as runner:
            result = runner.run()
        seconds = time.perf_counter() - started
    finally:
        if catalog is not None:
            catalog.close()
        shutil.rmtree(base, ignore_errors=True)
    assert result.finished and not result.failed_checkpoints, result
    sync_ms = result.timings.get("checkpoint_sync_ms", [])
    return {
        "config": name,
        "records": result.records_in,
        "alerts": result.records_out,
        "seconds": round(seconds, 3),
        "records_per_s": round(result.records_in / seconds),
        "checkpoints": len(result.checkpoints),
        "checkpoint_bytes": sum(c.bytes for c in result.checkpoints),
        "sync_ms_max": round(max(sync_ms), 2) if sync_ms else None,
    }


def start_s3(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server on a free local port with a bucket; (process, checkpoint root URL)."""
    import s3fs

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    moto = str(Path(sys.executable).with_name("moto_server"))
    with open(work / "moto.log", "wb") as log:  # the server keeps its own descriptor
        server = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_ENDPOINT_URL=url,
        AWS_DEFAULT_REGION="us-east-1",
    )
    deadline = time.monotonic() + 60
    while True:  # the server answers once it listens
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"moto_server did not start; see {work / 'moto.log'}") from None
            time.sleep(0.1)
    s3fs.S3FileSystem(endpoint_url=url, key="bench", secret="bench").mkdir("bench")
    return server, "s3://bench/checkpoints"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller stream, one run each")
    parser.add_argument("--repeat", type=int, default=None, help="runs per configuration")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated configurations to run (a ratio needs its backend's baseline)",
    )
    parser.add_argument(
        "--storage",
        choices=("local", "s3"),
        default="local",
        help="where checkpoints go: local files, or S3 on a local moto server started here",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    if args.quick:
        stream = {"partitions": 4, "records_per_partition": 10_000, "cards_per_partition": 500}
        repeat = args.repeat or 1
    else:
        stream = {"partitions": 8, "records_per_partition": 25_000, "cards_per_partition": 2_000}
        repeat = args.repeat or 3
    records = stream["partitions"] * stream["records_per_partition"]
    print(
        f"fraud job, parallelism 2, {records:,} records, checkpoints every {EVERY:,} records; "
        f"best of {repeat} run(s) per configuration",
        file=sys.stderr,
    )
    best: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="statekeeper-bench-demo-"))
    s3 = start_s3(work) if args.storage == "s3" else None
    try:
        for run in range(repeat):
            for name in names:
                r = run_once(name, stream, work, run, s3[1] if s3 else None)
                print(
                    f"  run {run + 1} {name:<28} {r['records_per_s']:>8,} records/s "
                    f"({r['checkpoints']} checkpoints, {r['alerts']:,} alerts)",
                    file=sys.stderr,
                )
                if name not in best or r["records_per_s"] > best[name]["records_per_s"]:
                    best[name] = r
    finally:
        if s3 is not None:
            s3[0].terminate()
            s3[0].wait()
        shutil.rmtree(work, ignore_errors=True)
    alerts = {r["alerts"] for r in best.values()}
    if len(alerts) != 1:
        print(f"configurations disagree on the number of alerts: {alerts}", file=sys.stderr)
        return 1
    targets = []
    for name in names:
        backend, fmt, _, _ = CONFIGS[name]
        if fmt is None or BASELINE[backend] not in best:
            continue
        ratio = best[name]["records_per_s"] / best[BASELINE[backend]]["records_per_s"]
        best[name]["ratio_vs_off"] = round(ratio, 3)
        targets.append(
            {
                "name": f"{name}_throughput_vs_checkpoints_off",
                "value": round(ratio, 3),
                "op": ">=",
                "target": TARGET_RATIO,
            }
        )
    print(
        json.dumps(
            {
                "bench": "demo",
                "quick": args.quick,
                "storage": args.storage,
                "records": records,
                "checkpoint_every": EVERY,
                "results": list(best.values()),
                "targets": targets,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
