"""The Flink crash points (import, expire, orphan cleanup), SIGKILLed in a subprocess on a copy of
the real PyFlink RocksDB job (incremental checkpoints sharing SSTs), then a fresh process retries.

After the crash and after the retry ``verify`` passes (unreferenced files are allowed: a crash may
leave some). After the retry: the import holds every snapshot once, COMPLETED; expire and orphan
cleanup are SUCCEEDED on their second attempt, every file a retained snapshot uses is still
there, and exactly the files the job exists to delete are gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from state_engine import faults
from state_engine.catalog import Catalog
from state_engine.flink.metadata import read_metadata
from state_engine.verify import verify

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("sk_flink_fault_driver.py")
ARCHIVE = Path(os.environ.get("STATEKEEPER_FLINK_FIXTURES", "/work/shared/flink")) / (
    "flink-2.3-pyflink-snapshots.tar.gz"
)
JOB_ID = "92444c5a6956ad1f4e7301b84f30217c"
JOB = "pyflink"
TIMEOUT_S = 120
CRASH_LEASE_TTL_S = 3.0
OLD = 1_700_000_000


@dataclass(frozen=True)
class FlinkCase:
    """One Flink crash point: ``program`` is ``import``, ``expire`` or ``orphan_cleanup``."""

    point: str
    program: str
    why: str = ""

    @property
    def name(self) -> str:
        return self.point.partition(":")[0]

    @property
    def scenario(self) -> str:  # the shape test_crash_points' table reads
        return self.program

    @property
    def id(self) -> str:
        return f"flink-{self.program}@{self.point}"


FLINK_CASES = [
    FlinkCase("flink.import.after_attach", "import", "files attached, in the transaction"),
    FlinkCase("flink.import.after_commit", "import", "every snapshot COMPLETED, none vanished"),
    FlinkCase("flink.expire.after_discard", "expire", "checkpoints DISCARDED, files all there"),
    FlinkCase("deletion.after_delete_one:1", "expire", "one released file deleted"),
    FlinkCase("flink.orphan_cleanup.after_delete", "orphan_cleanup", "orphans gone, dirs left"),
]


def test_every_flink_crash_point_has_a_case() -> None:
    flink_points = {n for n, m in faults.CRASH_POINTS.items() if m.startswith("state_engine.flink")}
    assert flink_points and flink_points <= {c.name for c in FLINK_CASES}


@pytest.fixture(scope="module")
def pyflink_rocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ARCHIVE.exists():
        pytest.skip(f"Flink fixture archive {ARCHIVE} is missing (set STATEKEEPER_FLINK_FIXTURES)")
    root = tmp_path_factory.mktemp("pyflink")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / "rocks"


def _run(args: list[str], crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV_VAR}
    if crash_at is not None:
        env[faults.ENV_VAR] = crash_at
    cmd = [sys.executable, str(DRIVER), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _ok(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _killed(proc: subprocess.CompletedProcess[str], case: FlinkCase) -> None:
    assert proc.returncode == -signal.SIGKILL, (
        f"expected death by SIGKILL at {case.point}, got exit {proc.returncode}\n"
        f"{proc.stdout}\n{proc.stderr[-3000:]}"
    )
    assert f"crash point {case.name} " in proc.stderr


def _verifies(url: str, when: str) -> None:
    with Catalog.open(url) as catalog:
        report = verify(catalog, JOB, deep=True)
    assert report.ok, f"verify failed {when}:\n{report.render()}"


def _used(snapshot_dirs: list[Path], job_dir: Path) -> set[Path]:
    out: set[Path] = set()
    for d in snapshot_dirs:
        out.add(d / "_metadata")
        meta = read_metadata(str(d), job_dir=str(job_dir))
        out.update(Path(h.location) for h in meta.files().values() if h.location)
    return out


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=pytest.mark.crash_point(c.point)) for c in FLINK_CASES]
)
def test_flink_crash_then_retry(
    case: FlinkCase, pyflink_rocks: Path, tmp_path: Path, catalog_url: str
) -> None:
    job_dir = tmp_path / "checkpoints" / JOB_ID
    shutil.copytree(pyflink_rocks / "checkpoints" / JOB_ID, job_dir, copy_function=shutil.copy2)
    sps = tmp_path / "savepoints"
    shutil.copytree(pyflink_rocks / "savepoints-native", sps, copy_function=shutil.copy2)
    imp = ["import", str(job_dir), str(sps), "--catalog", catalog_url, "--job", JOB]

    if case.program == "import":
        _killed(_run(imp, case.point), case)
        with Catalog.open(catalog_url) as catalog:
            kept = len(catalog.list_snapshots(JOB)) if catalog.list_jobs() else 0
            jobs = [j.name for j in catalog.list_jobs()]
        # the job, its directories and its snapshots are written in one transaction: all of
        # them or none
        if case.name == "flink.import.after_attach":
            assert jobs == [] and kept == 0
        else:
            _verifies(catalog_url, f"right after the crash at {case.point}")
            assert kept == 4
        report = _ok(_run(imp, None))
        with Catalog.open(catalog_url) as catalog:
            snaps = catalog.list_snapshots(JOB)
        assert sorted(s.checkpoint_id for s in snaps) == [2, 3, 5, 6]
        assert {s.status for s in snaps} == {"COMPLETED"}
        assert report["resumed"] == []
        assert len(report["added"] if kept == 0 else report["unchanged"]) == 4
        _verifies(catalog_url, f"after retrying from {case.point}")
        return

    _ok(_run(imp, None))
    run_id = f"faults-flink-{case.program}"
    if case.program == "expire":
        params: dict[str, Any] = {"job": JOB, "retain_last": 1, "wait": 60}
        keep = _used([job_dir / "chk-5", *sps.iterdir()], job_dir)
        goes = _used([job_dir / "chk-2", job_dir / "chk-3"], job_dir) - keep
        planted: set[Path] = set()
    else:
        params = {"job": JOB, "older_than": "1d", "wait": 60}
        keep = {f for f in job_dir.rglob("*") if f.is_file()} | set(sps.rglob("*"))
        planted = set()
        for rel in ("shared/lost-1", "shared/lost-2", "chk-6/aborted", "chk-6/again"):
            p = job_dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"orphan")
            os.utime(p, (OLD, OLD))
            planted.add(p)
        goes = planted
    argv = ["maintain", case.program, "--catalog", catalog_url, "--run-id", run_id]
    argv += ["--params", json.dumps(params)]
    _killed(_run([*argv, "--lease-ttl", str(CRASH_LEASE_TTL_S)], case.point), case)
    _verifies(catalog_url, f"right after the crash at {case.point}")
    assert all(p.exists() for p in keep if p.is_file() or p in keep), "a kept file is gone"

    report = _ok(_run(argv, None))
    assert (report["status"], report["attempt"]) == ("SUCCEEDED", 2), report
    _verifies(catalog_url, f"after retrying from {case.point}")
    missing = sorted(str(p) for p in keep if not p.exists())
    assert missing == [], f"files a retained snapshot uses are gone: {missing}"
    left = sorted(str(p) for p in goes if p.exists())
    if left and case.name == "deletion.after_delete_one":
        # Killed between forgetting a batch and deleting it: the rest of the batch is unknown
        # to the catalog now (by design, see state_engine.maintenance.deletion); orphan cleanup
        # takes it.
        with Catalog.open(catalog_url) as catalog:
            known = catalog.known_paths(JOB)
        assert not {f"file://{p}" for p in left} & known
        sweep = ["maintain", "orphan_cleanup", "--catalog", catalog_url, "--run-id", "sweep"]
        _ok(_run([*sweep, "--params", json.dumps({"job": JOB, "older_than": "0s"})], None))
        left = sorted(str(p) for p in goes if p.exists())
    assert left == [], f"files the job exists to delete are still there: {left}"
    if case.program == "orphan_cleanup":
        # the killed run emptied chk-6 (its mtime is now): a later run past the cut-off removes
        # the empty directory; an empty chk-N newer than that may be one Flink just started
        assert not any(p.is_file() for p in (job_dir / "chk-6").rglob("*"))
    else:
        assert not (job_dir / "chk-2").exists() and not (job_dir / "chk-3").exists()
