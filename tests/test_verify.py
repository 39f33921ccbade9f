"""``statectl verify``: a clean job passes; each kind of damage is found with a clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint import RocksDBBackendFactory
from state_engine.cli import main
from state_engine.examples import fraud
from state_engine.runtime import JobRunner
from state_engine.verify import EXIT_INCONSISTENT, verify

STREAM: fraud.StreamSize = {
    "partitions": 4,
    "records_per_partition": 600,
    "cards_per_partition": 40,
}


@dataclass
class Checkpointed:
    catalog: Catalog
    url: str
    root: Path  # the job's checkpoint directory
    snapshots: list[SnapshotRecord]  # COMPLETED, newest first

    def data_file(self, snapshot: SnapshotRecord, *, shared: bool) -> Path:
        """The largest file of ``snapshot`` that is (or is not) in shared/, as a local path."""
        files = [
            f
            for f in self.catalog.snapshot_files(snapshot.id)
            if f.shared == shared and not f.path.endswith("/_metadata")
        ]
        assert files, f"snapshot {snapshot.id} has no {'shared' if shared else 'own'} file"
        return Path(max(files, key=lambda f: f.size).path.removeprefix("file://"))


@pytest.fixture
def job(
    catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Checkpointed]:
    """The fraud job killed after three RocksDB native incremental checkpoints."""
    url = catalog_url
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", url)
    with Catalog.open(url) as catalog:
        built = fraud.build_job(
            2, RocksDBBackendFactory(tmp_path / "rocksdb"), checkpoint_every=600, **STREAM
        )
        storage = (tmp_path / "checkpoints").as_uri()
        JobRunner(built, catalog=catalog, storage=storage).run_until(2_000)
        snaps = catalog.list_snapshots(fraud.JOB_NAME, status="COMPLETED")
        assert [s.checkpoint_id for s in snaps] == [3, 2, 1]
        yield Checkpointed(catalog, url, tmp_path / "checkpoints" / fraud.JOB_NAME, snaps)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["verify", *args])
    return code, capsys.readouterr().out


def test_a_clean_job_passes(job: Checkpointed, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, fraud.JOB_NAME)
    assert code == 0, out
    assert "3 COMPLETED, 0 PENDING" in out and "result: consistent (0 warning(s))" in out
    code, out = run_cli(capsys, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["errors"] == 0
    assert report["jobs"][0]["files_checked"] > 10


def test_the_installed_command_exits_non_zero_on_damage(job: Checkpointed) -> None:
    job.data_file(job.snapshots[0], shared=True).unlink()
    statectl = Path(sys.executable).with_name("statectl")
    done = subprocess.run(
        [str(statectl), "verify"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == EXIT_INCONSISTENT, done.stdout + done.stderr
    assert "is missing from storage" in done.stdout


def test_a_deleted_file_is_found(job: Checkpointed, capsys: pytest.CaptureFixture[str]) -> None:
    victim = job.data_file(job.snapshots[1], shared=False)
    victim.unlink()
    code, out = run_cli(capsys, "--quick")
    assert code == EXIT_INCONSISTENT
    line = next(ln for ln in out.splitlines() if "ERROR" in ln)
    assert f"chk-2 (snapshot {job.snapshots[1].id}, COMPLETED)" in line
    assert f"{victim.as_posix()} is missing from storage" in line
    assert "INCONSISTENT: 1 error(s)" in out


def test_a_truncated_file_is_found(job: Checkpointed, capsys: pytest.CaptureFixture[str]) -> None:
    victim = job.data_file(job.snapshots[0], shared=True)
    size = victim.stat().st_size
    with victim.open("r+b") as f:
        f.truncate(size // 2)
    code, out = run_cli(capsys, "--quick")
    assert code == EXIT_INCONSISTENT
    assert (
        f"{victim.as_posix()} has {size // 2} bytes in storage, the catalog recorded {size}" in out
    )


def test_a_flipped_byte_is_found_by_the_deep_check_only(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = job.data_file(job.snapshots[0], shared=False)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    assert run_cli(capsys, "--quick")[0] == 0  # same size: sizes alone cannot see it
    code, out = run_cli(capsys)
    assert code == EXIT_INCONSISTENT
    assert f"{victim.as_posix()} has checksum crc32:" in out and "content is corrupt" in out


def test_an_edited_metadata_is_found_even_by_the_quick_check(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone 'fixes' a recorded checksum by hand, keeping the length: the document still
    parses, but no longer agrees with the catalog."""
    snap = job.snapshots[0]
    path = Path(snap.location.removeprefix("file://")) / "_metadata"
    doc = json.loads(path.read_bytes())
    raw = path.read_text()
    old = doc["files"][0]["checksum"]
    new = old[:-1] + ("0" if old[-1] != "0" else "1")
    path.write_text(raw.replace(old, new, 1))
    code, out = run_cli(capsys, "--quick")
    assert code == EXIT_INCONSISTENT
    assert "_metadata disagrees with the catalog: it records" in out and new in out
    code, out = run_cli(capsys)
    assert "_metadata has checksum" in out  # and the deep check sees the bytes changed


def test_unreadable_metadata_is_found(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Path(job.snapshots[2].location.removeprefix("file://")) / "_metadata"
    path.write_bytes(path.read_bytes()[:-20])
    code, out = run_cli(capsys, "--quick")
    assert code == EXIT_INCONSISTENT
    assert "chk-1" in out and "_metadata cannot be read:" in out


def test_an_orphan_is_a_warning_and_an_error_when_strict(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    orphan = job.root / "shared" / "sst-left-behind.sst"
    orphan.write_bytes(b"x" * 100)
    code, out = run_cli(capsys)
    assert code == 0
    assert f"WARNING orphan file {orphan.as_uri()} (100 B): no snapshot references it" in out
    assert "result: consistent (1 warning(s))" in out
    code, out = run_cli(capsys, "--strict")
    assert code == EXIT_INCONSISTENT and "ERROR   orphan file" in out


def test_a_pending_snapshot_is_reported_apart(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    location = (job.root / "chk-9").as_uri()
    pending = job.catalog.begin_snapshot(
        fraud.JOB_NAME, location=location, parallelism=2, checkpoint_id=9
    )
    report = verify(job.catalog, fraud.JOB_NAME)
    assert report.ok
    lines = [f for f in report.findings if f.level == "PENDING"]
    assert [f.snapshot_id for f in lines] == [pending.id]
    assert "not restorable" in lines[0].message
    code, out = run_cli(capsys)
    assert code == 0 and "3 COMPLETED, 1 PENDING" in out and "PENDING chk-9" in out


def test_an_unknown_job_is_one_error_line(
    job: Checkpointed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "no-such-job"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("statectl: error:") and "no-such-job" in err and len(err.splitlines()) == 1
    )
