"""The process the fault suite kills: ``python sk_fault_driver.py job ...`` runs the fraud job
against a catalog URL and a checkpoint root given on the command line, restoring from the job's
latest COMPLETED snapshot when there is one, and prints one JSON line when it finished.

Started with ``STATEKEEPER_CRASH_AT=<point>`` it dies by SIGKILL at that point instead. Other
programs the suite kills get their own subcommand: ``maintain KIND`` runs one maintenance job
(``state_engine.jobs.<KIND>.run``) with a run id and JSON params, on a local Spark session that is
started only when the job first touches it, and prints its report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.errors import NotFound
from state_engine.examples import fraud
from state_engine.runtime import FileSink, JobRunner

#: backend and checkpoint format of each configuration the suite runs the job in
CONFIGS: dict[str, tuple[str, str, bool]] = {
    "rocksdb-native": ("rocksdb", "native", True),
    "heap-delta": ("heap", "delta", True),
    "heap-canonical": ("heap", "canonical", False),
}


def stream_args(args: argparse.Namespace) -> fraud.StreamSize:
    return {
        "partitions": args.partitions,
        "records_per_partition": args.records_per_partition,
        "cards_per_partition": args.cards_per_partition,
    }


def run_job(args: argparse.Namespace) -> dict[str, Any]:
    backend, fmt, incremental = CONFIGS[args.config]
    work = Path(args.work)
    factory: Any = (
        RocksDBBackendFactory(work / "rocksdb")
        if backend == "rocksdb"
        else HeapBackendFactory(track_changes=fmt == "delta")
    )
    job = fraud.build_job(
        args.parallelism,
        factory,
        checkpoint_every=args.every,
        format=fmt,
        incremental=incremental,
        sink=FileSink(args.out),
        **stream_args(args),
    )
    if args.max_parallelism is not None:
        job = job.with_(max_parallelism=args.max_parallelism)
    with Catalog.open(args.catalog) as catalog:
        try:
            latest = catalog.latest_snapshot(job.name)
        except NotFound:
            latest = None  # the job never registered: nothing to restore
        restore = "latest" if latest is not None else None
        with JobRunner(job, catalog=catalog, storage=args.storage, restore_from=restore) as r:
            # --until: stop abruptly mid-stream (no final checkpoint), leaving state to maintain
            result = r.run() if args.until is None else r.run_until(args.until, kill=True)
    restored = result.restored_from
    return {
        "finished": result.finished,
        "records_in": result.records_in,
        "restored_from": None if restored is None else restored.checkpoint_id,
        "checkpoints": [c.checkpoint_id for c in result.checkpoints],
    }


class LazySpark:
    """A local SparkSession started on first use: a retry that finds its output committed never
    touches Spark, and the report says whether it did (``spark_started``)."""

    def __init__(self, master: str) -> None:
        self.master = master
        self.session: Any = None

    def __getattr__(self, name: str) -> Any:
        if self.session is None:
            from state_engine.jobs.spark import build_spark

            self.session = build_spark(
                master=self.master,
                extra={
                    "spark.sql.shuffle.partitions": "2",
                    # a JVM that lives for seconds: skip the optimising compiler, one GC thread
                    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                },
            )
        return getattr(self.session, name)


def run_maintenance(args: argparse.Namespace) -> dict[str, Any]:
    if args.lease_ttl is not None:
        from state_engine.maintenance import deletion

        # A crashed deleter's lease blocks its retry until it expires: LEASE_TTL_S (120 s) in
        # production. The job has no TTL parameter, so the default of FileLease is shortened.
        defaults = deletion.FileLease.__init__.__kwdefaults__
        assert defaults is not None and "ttl" in defaults
        defaults["ttl"] = args.lease_ttl
    runner = importlib.import_module(f"state_engine.jobs.{args.kind}").run
    spark = LazySpark(args.master)
    try:
        with Catalog.open(args.catalog) as catalog:
            report = runner(spark, catalog, run_id=args.run_id, **json.loads(args.params))
    finally:
        if spark.session is not None:
            spark.session.stop()
    return {**report, "spark_started": spark.session is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    job = commands.add_parser("job", help="run the fraud job (restoring from latest if any)")
    job.add_argument("--catalog", required=True, help="catalog database URL")
    job.add_argument("--storage", required=True, help="checkpoint root URL")
    job.add_argument("--work", required=True, help="local directory for RocksDB")
    job.add_argument("--out", required=True, help="directory of the alerts FileSink")
    job.add_argument("--config", choices=sorted(CONFIGS), default="rocksdb-native")
    job.add_argument("--parallelism", type=int, default=2)
    job.add_argument("--every", type=int, default=300, help="records between checkpoints")
    job.add_argument("--partitions", type=int, default=4)
    job.add_argument("--records-per-partition", type=int, default=600)
    job.add_argument("--cards-per-partition", type=int, default=40)
    job.add_argument("--max-parallelism", type=int, help="default: the fraud job's")
    job.add_argument("--until", type=int, help="kill the job after this many records")
    job.set_defaults(run=run_job)
    maintain = commands.add_parser("maintain", help="run one maintenance job (a retry: same id)")
    maintain.add_argument("kind", help="module of state_engine.jobs: compaction, expire, ...")
    maintain.add_argument("--catalog", required=True, help="catalog database URL")
    maintain.add_argument("--run-id", required=True)
    maintain.add_argument("--params", default="{}", help="the job's parameters as JSON")
    maintain.add_argument("--master", default="local[1]")
    maintain.add_argument("--lease-ttl", type=float, help="file lease TTL in seconds")
    for unused in ("--storage", "--work", "--out"):  # the suite passes every path to every program
        maintain.add_argument(unused, help=argparse.SUPPRESS)
    maintain.set_defaults(run=run_maintenance)
    args = parser.parse_args(argv)
    report = args.run(args)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
