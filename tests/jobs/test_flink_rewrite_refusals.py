"""Bad input to a Flink rewrite (``statectl maintain rescale|ttl_cleanup``, ``statectl flink
rewrite``) is refused before any Spark session starts: one line saying what was wrong and what to
do, the run recorded FAILED with its job, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.cli import main
from state_engine.jobs import spark as spark_module
from tests.flink.conftest import flink_fixtures  # noqa: F401  (fixture)
from tests.jobs.flinkdata import FlinkJob, import_java_job


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "statekeeper"
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", root.as_uri())
    return root


@pytest.fixture
def job(
    catalog: Catalog,
    catalog_url: str,
    flink_fixtures: Any,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> FlinkJob:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)

    def no_spark(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a SparkSession was started for input that is refused")

    # a tripwire: every entry point builds its session through build_spark
    monkeypatch.setattr(spark_module, "build_spark", no_spark)
    return import_java_job(catalog, flink_fixtures, tmp_path)


def _written(root: Path, job: FlinkJob) -> list[Path]:
    """Every file written under the checkpoint root or next to the job's Flink directories."""
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    flink_files = {p for p in job.root.rglob("*") if p.is_file()}
    return files + sorted(flink_files - job_files(job))


_KNOWN: dict[Path, set[Path]] = {}


def job_files(job: FlinkJob) -> set[Path]:
    return _KNOWN.setdefault(job.root, {p for p in job.root.rglob("*") if p.is_file()})


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statectl: error: "), err
    assert "Traceback" not in err
    return lines[0]


CASES = [
    pytest.param(
        ["maintain", "rescale", "--job", "nope", "--parallelism", "2"],
        "job 'nope' is not in the catalog", None, id="unknown-job",
    ),
    pytest.param(
        ["maintain", "rescale", "--job", "fraud", "--snapshot", "999", "--parallelism", "2"],
        "snapshot 999 is not in the catalog", "fraud", id="unknown-snapshot",
    ),
    pytest.param(
        ["maintain", "rescale", "--job", "fraud", "--parallelism", "2", "--max-parallelism", "0"],
        "max_parallelism 0 is out of range", "fraud", id="max-parallelism-0",
    ),
    pytest.param(
        ["maintain", "rescale", "--job", "fraud", "--parallelism", "2",
         "--max-parallelism", "40000"],
        "max_parallelism 40000 is out of range: use a number between 1 and 32768", "fraud",
        id="max-parallelism-above-32768",
    ),
    pytest.param(
        ["maintain", "rescale", "--job", "fraud", "--parallelism", "8", "--max-parallelism", "4"],
        "parallelism 8 is above the max parallelism 4", "fraud", id="max-below-parallelism",
    ),
    pytest.param(
        ["maintain", "ttl_cleanup", "--job", "fraud"],
        "needs the TTL of each state to clean: --ttl STATE=MS", "fraud", id="ttl-missing",
    ),
    pytest.param(
        ["maintain", "ttl_cleanup", "--job", "fraud", "--ttl", "nosuch=1000"],
        "--ttl state 'nosuch' is not a keyed state", "fraud", id="ttl-unknown-state",
    ),
    pytest.param(
        ["maintain", "ttl_cleanup", "--job", "fraud", "--ttl", "total=1000"],
        "has no TTL serializer", "fraud", id="ttl-without-ttl-serializer",
    ),
    pytest.param(
        ["maintain", "ttl_cleanup", "--job", "fraud", "--ttl", "lastSeen"],
        "--ttl 'lastSeen' is not NAME=VALUE", "fraud", id="ttl-malformed",
    ),
    pytest.param(
        ["flink", "rewrite", "--job", "fraud", "--uid", "nosuch=new-uid"],
        "operator uid 'nosuch' is not in snapshot", "fraud", id="uid-not-in-snapshot",
    ),
    pytest.param(
        ["flink", "rewrite", "--job", "fraud", "--drop-operator", "nosuch"],
        "operator uid 'nosuch' to drop is not in snapshot", "fraud", id="drop-unknown-operator",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message", "recorded_job"), CASES)
def test_bad_input_is_refused_before_spark_with_nothing_written(
    catalog: Catalog,
    job: FlinkJob,
    root: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
    recorded_job: str | None,
) -> None:
    job_files(job)
    snapshots = len(catalog.list_snapshots(job.name))
    line = _refused(capsys, *argv, "--json", "--run-id", "bad")
    assert message in line
    if recorded_job is None:  # named no job the catalog knows: not a run (issue 33)
        assert [r.run_id for r in catalog.list_runs()] == []
    else:
        run = catalog.get_run("bad")
        assert run.status == "FAILED" and run.job == recorded_job
        assert message in (run.error or "")
    assert len(catalog.list_snapshots(job.name)) == snapshots
    assert _written(root, job) == []


def test_a_snapshot_that_is_not_completed_is_refused(
    catalog: Catalog, job: FlinkJob, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pending = catalog.begin_snapshot(
        job.name, location=(root / "elsewhere").as_uri(), parallelism=2, kind="SAVEPOINT",
        format="CANONICAL", max_parallelism=128, trigger="test",
    )  # fmt: skip
    line = _refused(
        capsys, "flink", "rewrite", "--snapshot", str(pending.id), "--max-parallelism", "256",
        "--run-id", "pending",
    )  # fmt: skip
    assert f"snapshot {pending.id} of job 'fraud' is PENDING, not COMPLETED" in line
    run = catalog.get_run("pending")
    assert (run.status, run.job) == ("FAILED", "fraud")


def test_an_output_directory_that_exists_or_lies_in_a_snapshot_is_refused(
    catalog: Catalog, job: FlinkJob, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_files(job)
    taken = root / "taken"
    taken.mkdir(parents=True)
    argv = ["maintain", "rescale", "--job", "fraud", "--parallelism", "2",
            "--max-parallelism", "256"]  # fmt: skip
    line = _refused(capsys, *argv, "--savepoint-dir", str(taken), "--run-id", "exists")
    assert f"savepoint_dir {taken.as_uri()} exists" in line
    taken.rmdir()
    inside = Path(catalog.get_snapshot(job["canonical"].id).location.removeprefix("file://"))
    monkey_allowed = f"{inside}/new"
    line = _refused(
        capsys, *argv, "--savepoint-dir", monkey_allowed, "--run-id", "inside",
    )  # fmt: skip
    assert "outside job 'fraud''s storage roots" in line or "lies inside" in line
    for run_id in ("exists", "inside"):
        assert (catalog.get_run(run_id).status, catalog.get_run(run_id).job) == ("FAILED", "fraud")
    assert _written(root, job) == []


def test_an_output_inside_another_snapshot_is_refused_even_under_an_allowed_root(
    catalog: Catalog,
    job: FlinkJob,
    root: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_files(job)
    monkeypatch.setenv("STATEKEEPER_ALLOWED_SAVEPOINT_DIRS", job.root.as_uri())
    inside = Path(catalog.get_snapshot(job["canonical"].id).location.removeprefix("file://"))
    line = _refused(
        capsys, "flink", "rewrite", "--job", "fraud", "--max-parallelism", "256",
        "--savepoint-dir", f"{inside}/new", "--run-id", "inside",
    )  # fmt: skip
    assert "lies inside" in line
    assert _written(root, job) == []


def test_a_parallelism_only_change_prints_no_rewrite_needed_and_the_restore_command(
    catalog: Catalog, job: FlinkJob, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = job["canonical"].id
    code = main(["maintain", "rescale", "--snapshot", str(sid), "--parallelism", "4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["output_snapshot_id"] is None and report["stats"]["no_rewrite_needed"]
    assert err.startswith("no rewrite needed")
    assert "flink run -s " in err
    assert _written(root, job) == []
