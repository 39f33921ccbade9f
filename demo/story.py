"""``make demo``: the fraud-detection job end to end, and proof that nothing is lost.

On the embedded defaults (local files and a SQLite catalog under ``STATEKEEPER_HOME``, Spark
``local[*]``, an Airflow home under ``$STATEKEEPER_HOME/airflow``):

1. fresh state: a previous demo's job, checkpoints and Airflow database are cleared (nothing
   else), the catalog is migrated;
2. the reference: the alerts of an uninterrupted run (heap backend, no checkpoints);
3. the fraud job at parallelism 2 on RocksDB with incremental checkpoints, killed midway;
4. maintenance through Airflow (``airflow dags test``): the maintenance DAG (compaction, expire,
   orphan cleanup), a savepoint of the last checkpoint, TTL cleanup of that savepoint at the
   job's own time, a rescale to parallelism 3;
5. the job resumes from the rescaled snapshot at parallelism 3 and finishes; its alerts must
   equal the reference's exactly;
6. the catalog's summary, and what to try next.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from demo.airflow_cli import REPO, AirflowCli, DemoAirflowError, failure_message
from state_engine.backends.rocksdb import RocksDBBackendFactory
from state_engine.catalog import Catalog, RunRecord, SnapshotRecord
from state_engine.catalog.engine import parse_url, sqlite_path
from state_engine.catalog.migrate import upgrade
from state_engine.config import Settings
from state_engine.errors import NotFound, StatekeeperError
from state_engine.examples import fraud
from state_engine.formatting import format_table, human_bytes
from state_engine.runtime import FileSink, JobRunner
from state_engine.snapshot.storage import FileStore
from state_engine.snapshot_enums import SnapshotFormat, SnapshotStatus

JOB = fraud.JOB_NAME
STAGES = 6
RULES = ("amount_spike", "impossible_travel", "merchant_burst")
PROGRESS_STEP = 5_000  # records between progress updates on a terminal


class DemoFailed(StatekeeperError):
    """The demo found something wrong; the message says what."""


# --- output ---


#: Off a terminal (a log, CI), a long step still prints a line at least this often.
HEARTBEAT_S = 10.0


class Console:
    """Stage lines with timings; a progress bar or elapsed counter when stdout is a terminal, and
    a line every :data:`HEARTBEAT_S` during a long step when it is not (nobody waits in silence)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty()
        self._live = False
        self._lock = threading.RLock()  # the heartbeat thread writes too
        self._last_line = time.monotonic()

    def line(self, text: str = "", indent: int = 6) -> None:
        with self._lock:
            self._clear_live()
            print(" " * indent + text if text else "", file=self.out, flush=True)
            self._last_line = time.monotonic()

    def _clear_live(self) -> None:
        if self._live:
            self.out.write("\r\x1b[2K")
            self._live = False

    def live(self, text: str) -> None:
        """A line that the next output replaces (terminals only)."""
        if self.tty:
            with self._lock:
                self.out.write("\r\x1b[2K      " + text)
                self.out.flush()
                self._live = True

    def progress(self, done: int, total: int, label: str) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        if self.tty:
            self.live(f"[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} {label}")
        elif time.monotonic() - self._last_line >= HEARTBEAT_S:
            self.line(f"... {done:,}/{total:,} {label}")

    @contextmanager
    def ticking(self, label: str) -> Iterator[None]:
        """While the block runs: an elapsed counter on a terminal, else a line every 10 s."""
        done = threading.Event()
        started = time.perf_counter()

        def beat() -> None:
            while not done.wait(1.0 if self.tty else 0.5):
                elapsed = time.perf_counter() - started
                if self.tty:
                    self.live(f"{label} ... {elapsed:.0f} s")
                elif time.monotonic() - self._last_line >= HEARTBEAT_S:
                    self.line(f"... {label}: running for {seconds(elapsed)}")

        thread = threading.Thread(target=beat, name="demo-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    @contextmanager
    def stage(self, number: int, title: str) -> Iterator[None]:
        with self._lock:
            self._clear_live()
            print(f"[{number}/{STAGES}] {title}", file=self.out, flush=True)
            self._last_line = time.monotonic()
        started = time.perf_counter()
        yield
        self.line(f"({seconds(time.perf_counter() - started)})")


def seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 90 else f"{int(s // 60)} min {s % 60:04.1f} s"


def when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def by_rule(alerts: Iterable[dict[str, Any]]) -> Counter[str]:
    return Counter(a["rule"] for a in alerts)


# --- the story ---


@dataclass(frozen=True)
class StreamSize:
    partitions: int
    records_per_partition: int
    cards_per_partition: int
    checkpoint_every: int
    kill_at: int  # records read before the kill

    @property
    def total(self) -> int:
        return self.partitions * self.records_per_partition

    def stream(self) -> fraud.StreamSize:
        return {
            "partitions": self.partitions,
            "records_per_partition": self.records_per_partition,
            "cards_per_partition": self.cards_per_partition,
        }


@dataclass
class KilledRun:
    records_in: int
    checkpoints: list[SnapshotRecord]
    last: SnapshotRecord
    time_at_last: int  # the job's processing time (watermark) at the last checkpoint's barrier
    committed: int


@dataclass
class Maintenance:
    savepoint: SnapshotRecord
    cleaned: SnapshotRecord
    rescaled: SnapshotRecord


@dataclass
class Step:
    """One maintenance step (a DAG run, or the same jobs run in-process) and its catalog runs."""

    name: str
    runs: dict[str, RunRecord]
    skipped: list[str] = field(default_factory=list)


def _stats(run: RunRecord) -> dict[str, Any]:
    """The job's own statistics inside a run's recorded report."""
    return dict((run.stats or {}).get("stats") or {})


def _output(step: Step, kind: str) -> int:
    run = step.runs[kind]
    if run.output_snapshot_id is None:
        raise DemoFailed(f"{step.name}: the {kind} run {run.run_id} wrote no snapshot")
    return run.output_snapshot_id


class Maintainer(Protocol):
    def prepare(self, console: Console) -> None: ...

    def run(
        self, dag_id: str, conf: dict[str, Any], jobs: list[tuple[str, dict[str, Any]]]
    ) -> Step:
        """Run DAG ``dag_id`` with ``conf``, whose maintenance jobs are ``jobs``."""
        ...


class AirflowMaintainer:
    """The demo's way: every step is one ``airflow dags test`` of the DAG."""

    def __init__(self, settings: Settings, catalog: Catalog, log_dir: Path) -> None:
        self.settings, self.catalog, self.log_dir = settings, catalog, log_dir
        self.console: Console | None = None
        self.cli: AirflowCli | None = None

    def prepare(self, console: Console) -> None:
        self.console = console
        self.cli = AirflowCli(self.settings, self.log_dir)
        with console.ticking("airflow db migrate"):
            took = self.cli.migrate()
        console.line(f"airflow db migrate ({self.cli.home}): {seconds(took)}")

    def run(
        self, dag_id: str, conf: dict[str, Any], jobs: list[tuple[str, dict[str, Any]]]
    ) -> Step:
        assert self.cli is not None and self.console is not None, "prepare() first"
        with self.console.ticking(f"airflow dags test {dag_id}"):
            test = self.cli.dags_test(dag_id, conf)
        if not test.succeeded:
            raise DemoAirflowError(failure_message(test))
        runs: dict[str, RunRecord] = {}
        for run in self.catalog.list_runs(job=JOB, limit=None):
            if run.dag_id == dag_id and run.airflow_run_id == test.run_id:
                runs.setdefault(run.kind, run)
        for kind, _ in jobs:
            found = runs.get(kind)
            if found is None or found.status != "SUCCEEDED":
                state = (
                    "no run in the catalog" if found is None else f"{found.status}: {found.error}"
                )
                raise DemoAirflowError(
                    failure_message(test, f": its {kind} run for {JOB!r} has {state}")
                )
        self.console.line(
            f"airflow dags test {dag_id} -c '{json.dumps(conf)}': {test.state} in "
            f"{seconds(test.seconds)}"
        )
        return Step(dag_id, runs, test.skipped)


class SparkMaintainer:
    """The same maintenance jobs with the same parameters, on an in-process SparkSession: no
    Airflow (the test suite covers the DAGs under tests/airflow and runs the story this way)."""

    def __init__(self, settings: Settings, catalog: Catalog, spark: Any = None) -> None:
        self.settings, self.catalog, self.spark = settings, catalog, spark
        self.console: Console | None = None
        self._started_here = False

    def prepare(self, console: Console) -> None:
        self.console = console
        if self.spark is None:
            from state_engine.jobs.spark import build_spark

            self.spark = build_spark(master=self.settings.spark_master)
            self._started_here = True
        console.line(f"Spark {self.spark.version} in-process ({self.settings.spark_master})")

    def run(
        self, dag_id: str, conf: dict[str, Any], jobs: list[tuple[str, dict[str, Any]]]
    ) -> Step:
        from state_engine.jobs.commands import JOBS

        assert self.console is not None, "prepare() first"
        runs: dict[str, RunRecord] = {}
        skipped: list[str] = []
        if dag_id == "statekeeper_maintenance":
            latest = self.catalog.latest_snapshot(JOB)
            if latest is not None and latest.format is not SnapshotFormat.DELTA:
                skipped.append(
                    f"latest snapshot {latest.id} is {latest.format}, not a heap delta chain: "
                    "no compaction"
                )
        started = time.perf_counter()
        for kind, params in jobs:
            with self.console.ticking(kind):
                report = JOBS[kind].runner()(
                    self.spark, self.catalog, settings=self.settings, job=JOB, **params
                )
            runs[kind] = self.catalog.get_run(report["run_id"])
            if runs[kind].status != "SUCCEEDED":
                raise DemoFailed(f"{kind} of {JOB!r}: {runs[kind].status}: {runs[kind].error}")
        self.console.line(
            f"{', '.join(k for k, _ in jobs)} (as {dag_id} would): "
            f"{seconds(time.perf_counter() - started)}"
        )
        return Step(dag_id, runs, skipped)

    def close(self) -> None:
        if self._started_here and self.spark is not None:
            self.spark.stop()


class Demo:
    def __init__(self, settings: Settings, size_: StreamSize, console: Console) -> None:
        self.settings = settings
        self.size = size_
        self.console = console
        self.work = settings.home / "demo"  # the demo's own scratch: RocksDB, alerts, logs
        self.sink = FileSink(self.work / "alerts")
        self.catalog: Catalog | None = None

    # 1
    def reset(self) -> None:
        c, s = self.console, self.settings
        cleared = self._clear_previous_demo()
        c.line("cleared: " + (", ".join(cleared) if cleared else "nothing (first run)"))
        before, after = upgrade(s.catalog_url)
        c.line(f"catalog {s.catalog_url}: migrated {before or 'empty'} -> {after}")
        c.line(f"checkpoints under {s.checkpoint_root}")
        self.catalog = Catalog.from_settings(s)

    def _clear_previous_demo(self) -> list[str]:
        """Remove what an earlier demo left: its job, checkpoints, scratch and Airflow database.

        The catalog has no way to delete one job's rows, so a catalog holding the demo's job
        is removed whole, and only when the demo's job is all it holds (a SQLite file under the
        demo's home); anything else stops the demo before it touches a file.
        """
        s = self.settings
        cleared: list[str] = []
        db = sqlite_path(parse_url(s.catalog_url))
        if db is not None and db.exists():
            upgrade(s.catalog_url)
            with Catalog.from_settings(s) as catalog:
                others = sorted(j.name for j in catalog.list_jobs() if j.name != JOB)
                has_job = len(others) < len(catalog.list_jobs())
            if has_job and others:
                raise DemoFailed(
                    f"the catalog {s.catalog_url} holds a previous demo's job {JOB!r} and other "
                    f"jobs ({', '.join(others)}); the demo removes only its own state and the "
                    "catalog cannot delete one job: set STATEKEEPER_HOME to another directory"
                )
            if has_job:
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{db}{suffix}").unlink(missing_ok=True)
                cleared.append(str(db))
        elif db is None:
            upgrade(s.catalog_url)
            with Catalog.from_settings(s) as catalog:
                try:
                    catalog.get_job(JOB)
                except NotFound:
                    pass
                else:
                    raise DemoFailed(
                        f"the catalog {s.catalog_url} already holds a job {JOB!r} (an earlier "
                        "demo?) and the catalog cannot delete one job: point "
                        "STATEKEEPER_CATALOG_URL at an empty database, or use the embedded default"
                    )
        store, root = FileStore.at(s.checkpoint_root.rstrip("/") + "/" + JOB)
        if store.delete_tree(root):
            cleared.append(f"{s.checkpoint_root.rstrip('/')}/{JOB}")
        if self.work.exists():
            shutil.rmtree(self.work)
            cleared.append(str(self.work))
        airflow_home = s.home / "airflow"
        # the database and logs only: airflow.cfg and the UI's generated password stay
        for name in ("airflow.db", "airflow.db-wal", "airflow.db-shm", "logs"):
            path = airflow_home / name
            if path.is_dir():
                shutil.rmtree(path)
                cleared.append(str(path))
            elif path.exists():
                path.unlink()
                cleared.append(str(path))
        return cleared

    # 2
    def reference(self) -> list[dict[str, Any]]:
        started = time.perf_counter()
        with self.console.ticking("the reference run"):
            alerts = fraud.reference_alerts(**self.size.stream())
        took = time.perf_counter() - started
        counts = by_rule(alerts)
        self.console.line(
            f"{self.size.total:,} records -> {len(alerts):,} alerts ("
            + ", ".join(f"{r} {counts.get(r, 0):,}" for r in RULES)
            + f") at {self.size.total / took:,.0f} records/s"
        )
        return alerts

    def _job(self, parallelism: int) -> Any:
        return fraud.build_job(
            parallelism,
            RocksDBBackendFactory(self.work / "rocksdb"),
            checkpoint_every=self.size.checkpoint_every,
            format=SnapshotFormat.NATIVE.option,
            incremental=True,
            sink=self.sink,
            **self.size.stream(),
        )

    # 3
    def run_and_kill(self) -> KilledRun:
        c, size_, catalog = self.console, self.size, self._catalog()
        every = size_.checkpoint_every
        marks = sorted(
            {*range(PROGRESS_STEP, size_.kill_at, PROGRESS_STEP)}
            | {*range(every, size_.kill_at + 1, every)}
            | {size_.kill_at}
        )
        watermarks: dict[int, int] = {}  # barrier -> the job's watermark when it was cut
        shown: set[int] = set()
        runner = JobRunner(self._job(2), catalog=catalog, storage=self.settings.checkpoint_root)
        started = time.perf_counter()
        for mark in marks:
            last = mark == size_.kill_at
            result = runner.run_until(mark, kill=last)
            if mark % every == 0:
                # run_until stops right after the barrier of record `mark` was cut (a kill lets
                # that checkpoint complete): the watermark is the one the barrier saw
                watermarks[mark // every] = result.watermark
            self._show_checkpoints(result.checkpoints, shown)
            c.progress(mark, size_.total, "records (killed at " + f"{size_.kill_at:,})")
        took = time.perf_counter() - started
        result = runner.result()
        self._show_checkpoints(result.checkpoints, shown)
        if result.failed_checkpoints:
            raise DemoFailed("checkpoints failed: " + "; ".join(result.failed_checkpoints))
        if len(result.checkpoints) != len(watermarks) or not result.checkpoints:
            raise DemoFailed(
                f"expected {len(watermarks)} completed checkpoints (one every {every:,} records "
                f"up to {size_.kill_at:,}), the job reports {len(result.checkpoints)}: "
                "make --kill-at at least one --checkpoint-every"
            )
        committed = len(self.sink.read_committed())
        last_cp = result.checkpoints[-1]
        c.line(
            f"KILLED after {result.records_in:,} of {size_.total:,} records "
            f"({result.records_in / took:,.0f} records/s): {len(result.checkpoints)} checkpoints "
            f"completed, the last chk-{last_cp.checkpoint_id} at record {len(watermarks) * every:,}"
        )
        c.line(
            f"{committed:,} alerts committed by notified checkpoints; the rest of the output "
            "(after the last checkpoint, or not yet committed) is discarded with the process"
        )
        return KilledRun(
            records_in=result.records_in,
            checkpoints=list(result.checkpoints),
            last=last_cp,
            time_at_last=watermarks[len(watermarks)],
            committed=committed,
        )

    def _show_checkpoints(self, completed: list[SnapshotRecord], shown: set[int]) -> None:
        for snap in completed:
            if snap.id in shown:
                continue
            shown.add(snap.id)
            files = self._catalog().snapshot_files(snap.id)
            unique = {f.path: f for f in files}.values()
            shared = [f for f in unique if f.shared]
            new = [f for f in unique if f.created_by_snapshot_id == snap.id]
            reused = [f for f in shared if f.created_by_snapshot_id != snap.id]
            self.console.line(
                f"chk-{snap.checkpoint_id}  {snap.format.lower()}  {human_bytes(snap.bytes):>9} in "
                f"{len(unique)} files, uploaded {human_bytes(sum(f.size for f in new)):>9}; "
                f"{len(shared)} shared SSTs: {len(shared) - len(reused)} new, {len(reused)} reused"
            )

    # 4
    def maintain(self, killed: KilledRun, maintainer: Maintainer) -> Maintenance:
        c, catalog = self.console, self._catalog()
        maintainer.prepare(c)
        last = killed.last

        # compaction folds heap delta chains; RocksDB's incremental checkpoints share SST files
        # instead, so the compaction step is expected to skip (and says why)
        maint = maintainer.run(
            "statekeeper_maintenance",
            {"retain_last": 2},
            [("expire", {"retain_last": 2}), ("orphan_cleanup", {"older_than": "3d"})],
        )
        if "compaction" in maint.runs:
            r = maint.runs["compaction"]
            c.line(f"  compaction: {r.status}, snapshot {r.output_snapshot_id}")
        else:
            reason = next((s for s in maint.skipped if "compaction" in s), "skipped")
            c.line(f"  compaction: skipped: {reason}")
            c.line("    (RocksDB checkpoints share SST files instead of chaining deltas)")
        st = _stats(maint.runs["expire"])
        expired = ", ".join(f"chk-{e['checkpoint_id']}" for e in st.get("expired", [])) or "none"
        c.line(
            f"  expire (retain_last=2): expired {expired}; deleted {st.get('files_deleted', 0)} "
            f"files ({human_bytes(st.get('bytes_deleted', 0))}) that no retained checkpoint uses"
        )
        st = _stats(maint.runs["orphan_cleanup"])
        c.line(
            f"  orphan cleanup: {st.get('files_listed', 0)} files listed, "
            f"{st.get('files_found', 0)} unreferenced and older than 3d, "
            f"{st.get('files_deleted', 0)} deleted"
        )

        sp = maintainer.run(
            "statekeeper_savepoint",
            {"job": JOB, "source_snapshot": last.id},
            [("savepoint", {"snapshot": last.id})],
        )
        savepoint = catalog.get_snapshot(_output(sp, "savepoint"))
        c.line(
            f"  snapshot {savepoint.id}: {savepoint.kind} {savepoint.format} of chk-"
            f"{last.checkpoint_id} ({last.format}): {savepoint.entries:,} rows, "
            f"{human_bytes(savepoint.bytes)}, relocatable, at {savepoint.location}"
        )

        # The job's TTL runs on record time, not the wall clock: "now" would expire every entry
        # and change the alerts. Its watermark at the checkpoint's barrier is below the time of
        # every record and timer after the barrier, so what expired then stays expired for it.
        at = killed.time_at_last
        ttl = maintainer.run(
            "statekeeper_ttl_cleanup",
            {"at": at},
            [("ttl_cleanup", {"snapshot": savepoint.id, "at": at})],
        )
        run = ttl.runs["ttl_cleanup"]
        if run.input_snapshot_id != savepoint.id:
            raise DemoFailed(
                f"the TTL cleanup cleaned snapshot {run.input_snapshot_id}, not the savepoint "
                f"{savepoint.id}: another snapshot of {JOB!r} appeared in between"
            )
        cleaned = catalog.get_snapshot(_output(ttl, "ttl_cleanup"))
        st = _stats(run)
        per_state = ", ".join(
            f"{name.split('/')[-1]} {v['dropped']:,}"
            for name, v in st.get("states", {}).items()
            if v.get("dropped")
        )
        c.line(
            f"  at {when(at)}, the job's record time at chk-{last.checkpoint_id} (the wall clock "
            f"would expire everything): dropped "
            f"{st.get('dropped', 0):,} expired entries ({per_state or 'none'}), kept "
            f"{st.get('kept', 0):,} -> snapshot {cleaned.id} ({cleaned.kind} {cleaned.format}, "
            f"{human_bytes(cleaned.bytes)})"
        )

        rs = maintainer.run(
            "statekeeper_rescale",
            {"job": JOB, "parallelism": 3, "source_snapshot": cleaned.id},
            [("rescale", {"snapshot": cleaned.id, "parallelism": 3})],
        )
        rescaled = catalog.get_snapshot(_output(rs, "rescale"))
        st = _stats(rs.runs["rescale"])
        how = (
            "same max parallelism: a new _metadata over the same files"
            if st.get("metadata_only")
            else "state rewritten"
        )
        c.line(
            f"  snapshot {rescaled.id}: parallelism {cleaned.parallelism} -> "
            f"{rescaled.parallelism} at max parallelism {rescaled.max_parallelism} ({how})"
        )
        return Maintenance(savepoint, cleaned, rescaled)

    # 5
    def resume(self, snapshot: SnapshotRecord) -> tuple[int, int]:
        c, size_ = self.console, self.size
        job = self._job(3)
        runner = JobRunner(
            job, catalog=self._catalog(), storage=self.settings.checkpoint_root,
            restore_from=snapshot.id,
        )  # fmt: skip
        started = time.perf_counter()
        done = 0
        with runner:
            remaining = (
                size_.total - size_.kill_at // size_.checkpoint_every * size_.checkpoint_every
            )
            for mark in range(PROGRESS_STEP, remaining, PROGRESS_STEP):
                result = runner.run_until(mark, kill=False)
                if result.finished:
                    break
                c.progress(size_.total - remaining + mark, size_.total, "records")
            result = runner.run()
            done = result.records_in
            took = time.perf_counter() - started
        c.line(
            f"restored snapshot {snapshot.id} at parallelism 3 "
            f"(partitions per subtask: {runner.partitions()}); read the remaining "
            f"{done:,} records at {done / took:,.0f} records/s, "
            f"{len(result.checkpoints)} more checkpoints, finished: {result.finished}"
        )
        return done, len(result.checkpoints)

    def compare(self, reference: list[dict[str, Any]], killed: KilledRun) -> bool:
        c = self.console
        alerts = self.sink.read_committed()
        ref, got = by_rule(reference), by_rule(alerts)
        rows = [
            (
                r,
                f"{ref.get(r, 0):,}",
                f"{got.get(r, 0):,}",
                "=" if ref.get(r) == got.get(r) else "!",
            )
            for r in RULES
        ]
        rows.append(("total", f"{len(reference):,}", f"{len(alerts):,}", ""))
        for line in format_table(("rule", "reference", "killed+resumed", ""), rows).splitlines():
            c.line(line)
        want, have = fraud.alert_counts(reference), fraud.alert_counts(alerts)
        if want != have:
            missing = sum((want - have).values())
            extra = sum((have - want).values())
            c.line(
                f"MISMATCH: {missing:,} reference alerts missing, {extra:,} extra or duplicated "
                f"(alerts in {self.sink.directory})"
            )
            return False
        c.line(
            f"IDENTICAL: every one of the {len(reference):,} alerts exactly once "
            f"({killed.committed:,} committed before the kill, "
            f"{len(alerts) - killed.committed:,} after the restore)"
        )
        return True

    # 6
    def summary(self) -> None:
        c, catalog = self.console, self._catalog()
        c.line("jobs:")
        rows: list[tuple[object, ...]] = []  # three tables, each row a tuple of its cells
        for j in catalog.list_jobs():
            latest = catalog.latest_snapshot(j.name)
            rows.append(
                (
                    j.name,
                    j.max_parallelism,
                    "-" if latest is None else f"{latest.id} (chk-{latest.checkpoint_id})",
                    "-" if latest is None else latest.parallelism,
                )
            )
        for line in format_table(("job", "max p", "latest snapshot", "p"), rows).splitlines():
            c.line(line, indent=8)
        c.line(f"snapshots of {JOB}:")
        snaps = sorted(catalog.list_snapshots(JOB), key=lambda s: s.id)
        rows = [
            (s.id, s.checkpoint_id, s.kind, s.format, s.status, s.parallelism, s.bytes,
             f"{s.entries:,}", s.trigger)
            for s in snaps
        ]  # fmt: skip
        header = ("id", "chk", "kind", "format", "status", "p", "bytes", "entries", "trigger")
        for line in format_table(header, rows, sizes={"bytes"}).splitlines():
            c.line(line, indent=8)
        files, total = self._storage_size()
        live = [s for s in snaps if s.status is SnapshotStatus.COMPLETED]
        c.line(
            f"sizes: {len(live)} live snapshots; {files} files, {human_bytes(total)} on storage "
            f"under {self.settings.checkpoint_root.rstrip('/')}/{JOB} (shared SSTs counted once)"
        )
        c.line("maintenance runs:")
        runs = sorted(catalog.list_runs(job=JOB, limit=None), key=lambda r: r.id)
        rows = [
            (r.kind, r.status, r.dag_id or "-",
             "-" if r.finished_at is None
             else seconds((r.finished_at - r.started_at).total_seconds()),
             f"{r.input_snapshot_id or '-'} -> {r.output_snapshot_id or '-'}")
            for r in runs
        ]  # fmt: skip
        run_header = ("kind", "status", "dag_id", "duration", "snapshots")
        for line in format_table(run_header, rows).splitlines():
            c.line(line, indent=8)

    def next_steps(self, maintenance: Maintenance, reference: list[dict[str, Any]]) -> None:
        c = self.console
        busiest = Counter(a["card"] for a in reference).most_common(1)
        card = busiest[0][0] if busiest else fraud.card_id(0, 0)
        port = os.environ.get("AIRFLOW_PORT", "8080")
        home = self.settings.home
        make = "make airflow"
        if home != REPO / ".statekeeper":
            make += f" SK_HOME={home}"
        c.line("")
        c.line("Next:", indent=0)
        c.line(f"The Airflow UI over this catalog and these DAG runs: {make}", 2)
        c.line(f"  then http://localhost:{port}/ (Statekeeper pages: Browse > Statekeeper)", 2)
        c.line("  login admin; the password is generated on first start into", 2)
        c.line(f"  {home / 'airflow' / 'simple_auth_manager_passwords.json.generated'}", 2)
        c.line("The catalog from the command line (.venv/bin/statectl):", 2)
        for cmd in (
            "statectl jobs",
            f"statectl snapshots {JOB}",
            f"statectl runs --job {JOB}",
            "statectl verify",
            f"statectl state show {maintenance.savepoint.id} --key {card}"
            "   (the savepoint; the busiest card)",
        ):
            c.line(cmd, 4)
        c.line(f"Logs of the Airflow runs: {self.work / 'logs'}", 2)

    def _storage_size(self) -> tuple[int, int]:
        store, root = FileStore.at(self.settings.checkpoint_root.rstrip("/") + "/" + JOB)
        files = store.find(root)
        return len(files), sum(f.size for f in files)

    def _catalog(self) -> Catalog:
        if self.catalog is None:
            raise DemoFailed("the catalog is not open: reset() first")
        return self.catalog

    def close(self) -> None:
        if self.catalog is not None:
            self.catalog.close()


def run(args: argparse.Namespace, out: TextIO | None = None, *, spark: Any = None) -> int:
    """The story with ``args`` (see :func:`parser`); ``spark``: a session for ``--maintenance
    spark`` to reuse instead of starting one."""
    console = Console(out)
    total = args.partitions * args.records_per_partition
    size_ = StreamSize(
        partitions=args.partitions,
        records_per_partition=args.records_per_partition,
        cards_per_partition=args.cards_per_partition,
        checkpoint_every=args.checkpoint_every,
        kill_at=args.kill_at if args.kill_at is not None else int(total * 0.55),
    )
    if not args.checkpoint_every <= size_.kill_at < size_.total:
        console.line(
            f"--kill-at must be between --checkpoint-every ({args.checkpoint_every:,}) and the "
            f"stream's {size_.total:,} records, got {size_.kill_at:,}",
            indent=0,
        )
        return 2
    settings = Settings.from_env()
    demo = Demo(settings, size_, console)
    maintainer: AirflowMaintainer | SparkMaintainer | None = None
    started = time.perf_counter()
    console.line(
        f"Statekeeper demo: fraud detection over {size_.total:,} card transactions "
        f"({size_.partitions} partitions, {size_.partitions * size_.cards_per_partition:,} cards),"
        f" killed at {size_.kill_at:,}, maintained through "
        f"{'Airflow' if args.maintenance == 'airflow' else 'Spark'}, resumed at parallelism 3",
        indent=0,
    )
    console.line(f"home: {settings.home}", indent=2)
    try:
        with console.stage(1, "Fresh state"):
            demo.reset()
        with console.stage(2, "Reference: the uninterrupted run (heap backend, no checkpoints)"):
            reference = demo.reference()
        with console.stage(
            3,
            "The fraud job at parallelism 2 on RocksDB, incremental checkpoints every "
            f"{size_.checkpoint_every:,} records, killed at record {size_.kill_at:,}",
        ):
            killed = demo.run_and_kill()
        if args.maintenance == "airflow":
            title = "Maintenance through Airflow (airflow dags test, Spark in-process local[*])"
            maintainer = AirflowMaintainer(settings, demo._catalog(), demo.work / "logs")
        else:
            title = "Maintenance on Spark in-process (the DAGs' jobs, without Airflow)"
            maintainer = SparkMaintainer(settings, demo._catalog(), spark)
        with console.stage(4, title):
            maintenance = demo.maintain(killed, maintainer)
        with console.stage(
            5, f"Resume from the rescaled snapshot {maintenance.rescaled.id} at parallelism 3"
        ):
            demo.resume(maintenance.rescaled)
            same = demo.compare(reference, killed)
        if not same:
            console.line("FAILED: the alerts differ from the uninterrupted run's", indent=0)
            return 1
        with console.stage(6, "The catalog"):
            demo.summary()
        demo.next_steps(maintenance, reference)
    except StatekeeperError as exc:
        console.line(f"FAILED: {exc}", indent=0)
        return 1
    finally:
        if isinstance(maintainer, SparkMaintainer):
            maintainer.close()
        demo.close()
    console.line("")
    console.line(f"Demo done in {seconds(time.perf_counter() - started)}.", indent=0)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--partitions", type=int, default=4, help="source partitions (default 4)")
    p.add_argument(
        "--records-per-partition",
        type=int,
        default=125_000,
        help="transactions per partition (default 125,000: 500,000 in all)",
    )
    p.add_argument(
        "--cards-per-partition", type=int, default=2_500, help="cards per partition (2,500)"
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=40_000, help="records between checkpoints (40,000)"
    )
    p.add_argument(
        "--maintenance",
        choices=("airflow", "spark"),
        default="airflow",
        help="airflow (default): the DAGs through `airflow dags test`; spark: the same jobs on "
        "an in-process SparkSession, without Airflow",
    )
    p.add_argument(
        "--kill-at",
        type=int,
        default=None,
        help="records read before the job is killed (default: 55%% of the stream)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
