"""Every crash point, SIGKILLed in a subprocess, then a fresh process recovers. After each:

- ``verify`` passes (unreferenced files are allowed: a crash may leave some), after the crash
  and after the recovery;
- the recovered job restored the latest COMPLETED snapshot (or started over when there was
  none) and its committed alerts equal the uninterrupted run's, each exactly once;
- no file of a snapshot that was COMPLETED before the recovery is gone, and those snapshots are
  still COMPLETED.

The maintenance jobs' crash points (:class:`Maintenance` rows) start from state a fraud job left
when it was killed mid-stream (prepared once per configuration, copied back before each case).
The job is killed at the point, then a fresh process retries the same run id. Checked besides the
above: the run is SUCCEEDED on its second attempt with one output (a producing job's earlier
attempt's snapshot is FAILED and its directory gone); no file that was in storage before the
crash is gone unless the job exists to delete it (expire: files of the snapshots it expired or
already releasable ones; orphan cleanup: the planted orphans, all gone after the retry); and the
fraud job restored from the latest COMPLETED snapshot (a rescale's output at its new
parallelism) finishes with exactly the uninterrupted run's alerts.

Adding a crash point is a row in :data:`CASES` (a new program to kill: a subcommand of the
driver and a :class:`Scenario`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from state_engine import faults
from state_engine.catalog import Catalog
from state_engine.errors import NotFound
from state_engine.examples import fraud
from state_engine.maintenance.run import run_tag
from state_engine.runtime import FileSink
from state_engine.verify import verify

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("sk_fault_driver.py")
STREAM: fraud.StreamSize = {
    "partitions": 4,
    "records_per_partition": 600,
    "cards_per_partition": 40,
}
EVERY = 300  # 8 checkpoints over the stream, so retention releases files (retained=3)
TIMEOUT_S = 180


@dataclass(frozen=True)
class Scenario:
    """How to run the program that is killed and the one that recovers (driver arguments)."""

    crash: tuple[str, ...]
    recover: tuple[str, ...]


def fraud_job(config: str, crash_p: int = 2, recover_p: int = 3) -> Scenario:
    common = ("job", "--config", config, "--every", str(EVERY)) + tuple(
        a for k, v in STREAM.items() for a in (f"--{k.replace('_', '-')}", str(v))
    )
    return Scenario(
        (*common, "--parallelism", str(crash_p)), (*common, "--parallelism", str(recover_p))
    )


@dataclass(frozen=True)
class Maintenance:
    """A maintenance job run on prepared state, killed, then retried with the same run id.

    ``params``: the job's parameters; ``"snapshot": "latest"`` is the latest COMPLETED snapshot
    before the crash. ``deletes``: what the job may delete ("nothing", "expired", "orphans").
    ``retry_spark``: whether the retry must start Spark (False: it only finds its committed
    output; None: the job has no Spark work at this size). ``restore``: parallelism and max
    parallelism the fraud job is restored at afterwards.
    """

    kind: str
    state: str  # a driver CONFIGS name: the fraud job's backend and checkpoint format
    params: dict[str, Any]
    deletes: str = "nothing"
    retry_spark: bool | None = True
    restore: tuple[int, int | None] = (3, None)
    orphans: bool = False


@dataclass(frozen=True)
class Case:
    point: str  # "name" or "name:N" (the N-th hit), as STATEKEEPER_CRASH_AT takes it
    scenario: Scenario | Maintenance
    why: str = ""

    @property
    def name(self) -> str:
        return self.point.partition(":")[0]

    @property
    def id(self) -> str:
        if isinstance(self.scenario, Maintenance):
            return f"{self.scenario.kind}@{self.point}"
        return self.point


NATIVE = fraud_job("rocksdb-native")
DELTA = fraud_job("heap-delta")
CANONICAL = fraud_job("heap-canonical", crash_p=3, recover_p=1)

CASES = [
    Case("checkpoint.after_data_files:2", NATIVE, "data files written, nothing in the catalog"),
    Case("checkpoint.after_attach:2", NATIVE, "files attached, snapshot PENDING, no _metadata"),
    Case("commit.after_metadata:2", NATIVE, "_metadata written, catalog still PENDING"),
    Case("checkpoint.after_complete:2", NATIVE, "COMPLETED, sink not yet committed"),
    Case("checkpoint.during_release", NATIVE, "a released file deleted, catalog not told"),
    Case("checkpoint.native.after_shared_upload:7", NATIVE, "a shared SST uploaded, no commit"),
    Case("checkpoint.delta.after_write:5", DELTA, "a heap delta written on its chain"),
    Case("checkpoint.after_attach:1", CANONICAL, "the first checkpoint: recovery starts over"),
]

LATEST = {"snapshot": "latest"}
COMPACT = Maintenance("compaction", "heap-delta", LATEST)
SAVEPOINT = Maintenance("savepoint", "rocksdb-native", LATEST)
RESCALE_SAME = Maintenance(
    "rescale", "heap-canonical", {**LATEST, "parallelism": 3}, retry_spark=None
)
NEW_MAX_P = 256
RESCALE_NEW = Maintenance(
    "rescale",
    "rocksdb-native",
    {**LATEST, "parallelism": 3, "max_parallelism": NEW_MAX_P},
    restore=(3, NEW_MAX_P),
)
# the lease a killed deleter leaves blocks its retry until it expires; the retry waits for it
DELETING = {"wait": 120}
EXPIRE = Maintenance(
    "expire",
    "rocksdb-native",
    {"job": fraud.JOB_NAME, "retain_last": 1, **DELETING},
    deletes="expired",
    retry_spark=None,
)
ORPHANS = Maintenance(
    "orphan_cleanup",
    "rocksdb-native",
    {"job": fraud.JOB_NAME, "older_than": "3d", **DELETING},
    deletes="orphans",
    retry_spark=None,
    orphans=True,
)

CASES += [
    Case("compaction.after_tasks", COMPACT, "chain folded into files, nothing attached"),
    Case(
        "compaction.after_complete",
        replace(COMPACT, retry_spark=False),  # the retry only releases the chain
        "output COMPLETED, chain not yet subsumed",
    ),
    Case("savepoint.after_tasks", SAVEPOINT, "native subtasks captured, nothing attached"),
    Case("commit.after_metadata", SAVEPOINT, "savepoint _metadata written, PENDING"),
    Case("commit.after_metadata", RESCALE_SAME, "metadata-only: _metadata, PENDING"),
    Case("rescale.after_spill", RESCALE_NEW, "rows spilled by new key group, nothing written"),
    Case("rescale.after_write", RESCALE_NEW, "re-bucketed files written, spill still there"),
    Case(
        "rescale.after_complete",
        replace(RESCALE_NEW, retry_spark=False),  # the retry only sets the max parallelism
        "savepoint COMPLETED, job max parallelism not yet updated",
    ),
    Case("expire.after_discard", EXPIRE, "snapshots DISCARDED, their files still known"),
    Case("deletion.after_forget", EXPIRE, "a batch forgotten by the catalog, none deleted"),
    Case("deletion.after_delete_one:2", EXPIRE, "expired files half deleted"),
    Case("deletion.after_delete_one:1", ORPHANS, "one orphan deleted of three"),
    Case("orphan_cleanup.after_delete", ORPHANS, "orphans deleted, empty dirs not removed"),
]


# The Flink points run in test_flink_crash_points.py (their own driver and fixtures).
from tests.faults.test_flink_crash_points import FLINK_CASES  # noqa: E402

CASES += FLINK_CASES  # type: ignore[arg-type]  # both kinds of case, one table


def test_every_crash_point_in_the_engine_is_in_the_table_and_in_its_module() -> None:
    assert {c.name for c in CASES} >= set(faults.CRASH_POINTS)
    import importlib
    import inspect

    for name, module in faults.CRASH_POINTS.items():
        source = inspect.getsource(importlib.import_module(module))
        assert f'crash_point("{name}")' in source, f"{name} is not in {module}"


def test_every_maintenance_job_is_killed_at_a_point_of_its_own() -> None:
    # points in checkpoint.commit and maintenance.deletion are shared; they do not count for a job
    kinds = {c.scenario.kind for c in CASES if isinstance(c.scenario, Maintenance)}
    assert kinds >= {"compaction", "savepoint", "rescale", "expire", "orphan_cleanup"}
    for kind in kinds:
        own = [
            c.point
            for c in CASES
            if isinstance(c.scenario, Maintenance)
            and c.scenario.kind == kind
            and faults.CRASH_POINTS.get(c.name) == f"state_engine.jobs.{kind}"
        ]
        assert own, f"no crash point of state_engine.jobs.{kind} is in CASES for {kind}"


@pytest.fixture(scope="module")
def reference() -> Counter[str]:
    return fraud.alert_counts(fraud.reference_alerts(**STREAM))


def _run(argv: tuple[str, ...], paths: dict[str, str], crash_at: str | None):
    env = {k: v for k, v in os.environ.items() if k != faults.ENV_VAR}
    if crash_at is not None:
        env[faults.ENV_VAR] = crash_at
    cmd = [sys.executable, str(DRIVER), argv[0]]
    cmd += [a for k, v in paths.items() for a in (f"--{k}", v)] + list(argv[1:])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _completed_files(catalog: Catalog, job: str) -> dict[int, dict[str, int]]:
    """Snapshot id -> {path: size} of every COMPLETED snapshot, from the catalog."""
    try:
        snaps = catalog.list_snapshots(job, status="COMPLETED")
    except NotFound:
        return {}
    return {s.id: {f.path: f.size for f in catalog.snapshot_files(s.id)} for s in snaps}


def _pending(catalog: Catalog, job: str) -> list[int]:
    try:
        return [s.id for s in catalog.list_snapshots(job, status="PENDING")]
    except NotFound:
        return []


def _assert_verifies(catalog: Catalog, when: str) -> None:
    report = verify(catalog, deep=True)
    assert report.ok, f"verify failed {when}:\n{report.render()}"


FRAUD_CASES = [c for c in CASES if isinstance(c.scenario, Scenario)]
JOB_CASES = [c for c in CASES if isinstance(c.scenario, Maintenance)]


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=pytest.mark.crash_point(c.point)) for c in cases]


@pytest.mark.parametrize("case", _params(FRAUD_CASES))
def test_crash_then_recover(
    case: Case, tmp_path: Path, catalog_url: str, reference: Counter[str]
) -> None:
    paths = {
        "catalog": catalog_url,
        "storage": (tmp_path / "checkpoints").as_uri(),
        "work": str(tmp_path / "work"),
        "out": str(tmp_path / "alerts"),
    }
    scenario = case.scenario
    assert isinstance(scenario, Scenario)  # FRAUD_CASES
    crashed = _run(scenario.crash, paths, case.point)
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected death by SIGKILL at {case.point}, got exit {crashed.returncode} "
        f"(the crash point was never reached?)\n{crashed.stdout}\n{crashed.stderr}"
    )
    assert f"crash point {case.name} " in crashed.stderr

    with Catalog.open(catalog_url) as catalog:
        before = _completed_files(catalog, fraud.JOB_NAME)
        _assert_verifies(catalog, f"right after the crash at {case.point}")
        left_pending = _pending(catalog, fraud.JOB_NAME)

    recovered = _run(scenario.recover, paths, None)
    assert recovered.returncode == 0, f"recovery failed:\n{recovered.stdout}\n{recovered.stderr}"
    result = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert result["finished"]

    with Catalog.open(catalog_url) as catalog:
        if before:
            newest = max(catalog.get_snapshot(sid).checkpoint_id for sid in before)
            assert result["restored_from"] == newest
        else:
            assert result["restored_from"] is None
        _assert_verifies(catalog, f"after recovering from {case.point}")
        # the killed run's unfinished commit is nobody's: the recovering run (its writer lease
        # taken over from the dead process at once) failed it, so nothing pins files any more
        assert _pending(catalog, fraud.JOB_NAME) == []
        for sid in left_pending:
            failed = catalog.get_snapshot(sid)
            assert failed.status == "FAILED", (sid, failed.status)
            assert "its run stopped before completing it" in (failed.error or "")
            assert not Path(failed.location.removeprefix("file://")).exists()
        for sid, files in before.items():
            assert catalog.get_snapshot(sid).status == "COMPLETED"
            for path, size in files.items():
                local = Path(path.removeprefix("file://"))
                assert local.is_file(), f"{path} of COMPLETED snapshot {sid} is gone"
                assert local.stat().st_size == size, f"{path} of snapshot {sid} changed size"

    alerts = FileSink(tmp_path / "alerts").read_committed()
    assert fraud.alert_counts(alerts) == reference  # every alert exactly once


# --- the maintenance jobs ---

JOB = fraud.JOB_NAME
PREPARE_UNTIL = 1500  # records: 5 checkpoints (the newest 3 retained), 900 left to process
# the killed attempt's lease lives this long, so its retry (default TTL) waits seconds, not minutes
CRASH_LEASE_TTL_S = 3.0


@dataclass(frozen=True)
class Prepared:
    """State a killed fraud job left. Every case runs in ``live`` (the catalog records absolute
    URLs under it), reset from ``template`` first."""

    live: Path
    template: Path

    @property
    def paths(self) -> dict[str, str]:
        return {
            "catalog": f"sqlite:///{self.live / 'catalog.db'}",
            "storage": (self.live / "checkpoints").as_uri(),
            "work": str(self.live / "work"),
            "out": str(self.live / "alerts"),
        }

    def reset(self) -> None:
        shutil.rmtree(self.live)
        shutil.copytree(self.template, self.live)  # copy2: modification times kept


def _stream_args() -> tuple[str, ...]:
    return tuple(a for k, v in STREAM.items() for a in (f"--{k.replace('_', '-')}", str(v)))


@pytest.fixture(scope="session")
def prepared(
    tmp_path_factory: pytest.TempPathFactory, sqlite_catalog_template: Path
) -> Callable[[str], Prepared]:
    base = tmp_path_factory.mktemp("faults-prepared")
    made: dict[str, Prepared] = {}

    def get(config: str) -> Prepared:
        if config not in made:
            prep = Prepared(base / config / "live", base / config / "template")
            prep.live.mkdir(parents=True)
            shutil.copyfile(sqlite_catalog_template, prep.live / "catalog.db")
            argv: tuple[str, ...] = ("job", "--config", config, "--parallelism", "2")
            argv += ("--every", str(EVERY), "--until", str(PREPARE_UNTIL), *_stream_args())
            done = _run(argv, prep.paths, None)
            assert done.returncode == 0, f"preparing {config} failed:\n{done.stderr}"
            shutil.copytree(prep.live, prep.template)
            made[config] = prep
        else:
            made[config].reset()
        return made[config]

    return get


def _local(url: str) -> Path:
    return Path(url.removeprefix("file://"))


def _stored(root: Path) -> dict[str, int]:
    """Every file under ``root``: its file:// URL (as the catalog writes them) -> size."""
    return {p.as_uri(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _plant_orphans(job_dir: Path, latest_checkpoint: int) -> set[str]:
    """Files no snapshot knows: a lost shared upload, the directory of a checkpoint that died
    before it registered, a stray file in a COMPLETED checkpoint's directory. Every file of the
    job is aged ten days, so only the catalog tells the orphans from the snapshots' files."""
    aged = time.time() - 10 * 86400
    for path in job_dir.rglob("*"):
        os.utime(path, (aged, aged))
    planted = [
        job_dir / "shared" / "orphan-lost-upload.sst",
        job_dir / "chk-99" / "keyed-0-never-registered.parquet",
        job_dir / f"chk-{latest_checkpoint}" / "operator-9-never-attached.parquet",
    ]
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(256))
        os.utime(path, (aged, aged))
    return {p.as_uri() for p in planted}


@pytest.mark.parametrize("case", _params(JOB_CASES))
def test_maintenance_crash_then_retry(
    case: Case,
    tmp_path: Path,
    prepared: Callable[[str], Prepared],
    reference: Counter[str],
) -> None:
    job = case.scenario
    assert isinstance(job, Maintenance)
    prep = prepared(job.state)
    paths = prep.paths
    storage = prep.live / "checkpoints"
    with Catalog.open(paths["catalog"]) as catalog:
        latest = catalog.latest_snapshot(JOB)
        assert latest is not None and latest.status == "COMPLETED"
        orphans = _plant_orphans(storage / JOB, latest.checkpoint_id) if job.orphans else set()
        before = _completed_files(catalog, JOB)
        releasable = {f.path for f in catalog.releasable_files(JOB)}
        by_age = sorted(before, key=lambda sid: -catalog.get_snapshot(sid).checkpoint_id)
    stored = _stored(storage)
    params = {k: latest.id if v == "latest" else v for k, v in job.params.items()}
    run_id = f"faults-{job.kind}"
    argv: tuple[str, ...] = (
        "maintain",
        job.kind,
        "--run-id",
        run_id,
        "--params",
        json.dumps(params),
    )

    crashed = _run((*argv, "--lease-ttl", str(CRASH_LEASE_TTL_S)), paths, case.point)
    assert crashed.returncode == -signal.SIGKILL, (
        f"expected death by SIGKILL at {case.point}, got exit {crashed.returncode} "
        f"(the crash point was never reached?)\n{crashed.stdout}\n{crashed.stderr[-3000:]}"
    )
    assert f"crash point {case.name} " in crashed.stderr
    with Catalog.open(paths["catalog"]) as catalog:
        _assert_verifies(catalog, f"right after the crash at {case.point}")

    retried = _run(argv, paths, None)
    assert retried.returncode == 0, f"the retry failed:\n{retried.stdout}\n{retried.stderr[-3000:]}"
    report = json.loads(retried.stdout.strip().splitlines()[-1])
    assert report["status"] == "SUCCEEDED" and report["attempt"] == 2, report
    if job.retry_spark is not None:
        assert report["spark_started"] is job.retry_spark, report

    with Catalog.open(paths["catalog"]) as catalog:
        _assert_verifies(catalog, f"after retrying from {case.point}")
        run = catalog.get_run(run_id)
        assert (run.status, run.attempts) == ("SUCCEEDED", 2)
        tagged = [s for s in catalog.list_snapshots(JOB) if s.trigger == run_tag(run_id)]
        if job.deletes == "nothing":
            # one output; what the killed attempt left is FAILED and its directory removed
            assert run.output_snapshot_id is not None
            out = catalog.get_snapshot(run.output_snapshot_id)
            assert out.status == "COMPLETED" and out.trigger == run_tag(run_id)
            for s in tagged:
                if s.id != out.id:
                    assert s.status == "FAILED", s
                    assert not _local(s.location).exists(), f"{s.location} of {s} left behind"
            restore_from = out
        else:
            assert not tagged
            restore_from = latest
        newest = catalog.latest_snapshot(JOB)
        assert newest is not None and newest.id == restore_from.id

        status = {sid: catalog.get_snapshot(sid).status for sid in before}
        expired = {sid for sid, st in status.items() if st == "DISCARDED"}
        if job.deletes == "expired":
            assert expired == set(by_age[job.params["retain_last"] :]), status
        else:
            assert not expired, status
        # compaction releases the chain it folded: SUBSUMED, files kept
        alive = ("COMPLETED", "SUBSUMED") if job.kind == "compaction" else ("COMPLETED",)
        for sid, files in before.items():
            if sid in expired:
                continue
            assert status[sid] in alive, f"snapshot {sid} is {status[sid]}"
            for path, size in files.items():
                local = _local(path)
                assert local.is_file(), f"{path} of snapshot {sid} (COMPLETED before) is gone"
                assert local.stat().st_size == size, f"{path} of snapshot {sid} changed size"
        if job.params.get("max_parallelism"):
            assert catalog.get_job(JOB).max_parallelism == job.params["max_parallelism"]

    gone = set(stored) - set(_stored(storage))
    # expire deletes what its snapshots leave unreferenced, orphan cleanup only files no one knows
    may_go = orphans | (releasable if job.deletes == "expired" else set())
    may_go |= {p for sid in expired for p in before[sid]}
    assert gone <= may_go, f"deleted without cause: {sorted(gone - may_go)}"
    assert orphans <= gone, f"orphans left after the retry: {sorted(orphans - gone)}"

    p, max_p = job.restore
    argv = ("job", "--config", job.state, "--parallelism", str(p), "--every", str(EVERY))
    argv += _stream_args() + (() if max_p is None else ("--max-parallelism", str(max_p)))
    done = _run(argv, {**paths, "work": str(tmp_path / "work")}, None)
    assert done.returncode == 0, f"the restored fraud job failed:\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["finished"] and result["restored_from"] == restore_from.checkpoint_id, result
    alerts = FileSink(prep.live / "alerts").read_committed()
    assert fraud.alert_counts(alerts) == reference  # every alert exactly once
