"""``statectl flink forget-directory``: a claimed Flink directory deleted on purpose leaves the
catalog cleanly, and only then; nothing on storage is touched."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from state_engine import cli
from state_engine.catalog import Catalog
from state_engine.errors import FlinkImportError
from state_engine.flink.forget import forget_directory
from state_engine.flink.import_job import import_flink
from state_engine.flink.retention import run_maintenance
from state_engine.verify import verify

from .conftest import FlinkFixtures
from .test_data_safety import _age, _live_files
from .test_retention import _url


def test_a_deleted_savepoint_directory_is_forgotten_and_the_job_is_whole_again(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    savepoints = flink_copy(flink_fixtures.java_savepoints("hashmap"))
    first = import_flink(catalog, [str(job_dir), str(savepoints)], "hm")
    in_savepoints = sorted(
        a["snapshot_id"] for a in first.added if a["location"].startswith(_url(savepoints))
    )
    assert in_savepoints
    shutil.rmtree(savepoints)  # deleted on purpose
    sync = import_flink(catalog, [str(job_dir), str(savepoints)], "hm")
    assert sync.missing_directories == [_url(savepoints)] and not sync.vanished

    report = forget_directory(catalog, str(savepoints), "hm")
    assert report.released == [_url(savepoints)]
    assert sorted(d["snapshot_id"] for d in report.discarded) == in_savepoints
    assert report.files_forgotten > 0 and not report.still_referenced
    assert all(catalog.get_snapshot(i).status == "DISCARDED" for i in in_savepoints)
    assert [d for d, _ in catalog.job_directories("hm")] == [_url(job_dir)]
    assert not any(p.startswith(_url(savepoints)) for p in catalog.known_paths("hm"))
    # the checkpoints are untouched, and the job's maintenance runs again
    assert verify(catalog, "hm").ok
    _age(job_dir)
    live = _live_files(job_dir, ["chk-8", "chk-10", "chk-11"])
    out = run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="1d")
    assert out["deleted"]["items"] == [] and all(p.exists() for p in live)
    again = import_flink(catalog, [str(job_dir)], "hm")
    assert sorted(again.unchanged) == [8, 10, 11] and not again.missing_directories


def test_forget_directory_refuses_a_directory_that_exists_or_is_not_the_jobs(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "hm")
    before = [(s.id, s.status) for s in catalog.list_snapshots("hm")]
    with pytest.raises(FlinkImportError, match="still exists; only a directory gone for good"):
        forget_directory(catalog, str(job_dir), "hm")
    with pytest.raises(FlinkImportError, match="was not imported from"):
        forget_directory(catalog, str(job_dir.parent / "elsewhere"), "hm")
    assert [(s.id, s.status) for s in catalog.list_snapshots("hm")] == before
    assert [d for d, _ in catalog.job_directories("hm")] == [_url(job_dir)]


def test_statectl_flink_forget_directory(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    assert cli.main(["flink", "import", str(job_dir), "--job", "r", "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["flink", "forget-directory", str(job_dir), "--job", "r"]) == 1
    assert "still exists" in capsys.readouterr().err
    shutil.rmtree(job_dir)
    assert cli.main(["flink", "forget-directory", str(job_dir), "--job", "r", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(d["checkpoint_id"] for d in report["discarded"]) == [8, 10, 11]
    assert report["released_directories"] == [_url(job_dir)]
    with Catalog.open(catalog_url) as cat:
        assert cat.known_paths("r") == set() and cat.job_directories("r") == []
