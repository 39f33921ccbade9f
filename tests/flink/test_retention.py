"""Expire and orphan cleanup on Flink directories (plain Python, under the job's lease)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from state_engine import cli
from state_engine.catalog import Catalog
from state_engine.errors import InvalidJobParams
from state_engine.flink.import_job import import_flink
from state_engine.flink.metadata import read_metadata
from state_engine.flink.retention import run_maintenance
from state_engine.verify import verify

from .conftest import JAVA_ROCKS_JOB, FlinkFixtures

OLD = 1_700_000_000  # mtime of planted files that are old enough to be orphans


def _url(p: Path) -> str:
    return f"file://{p}"


def _files(root: Path) -> set[Path]:
    return {f for f in root.rglob("*") if f.is_file()}


def _used_by(snapshot_dirs: list[Path], job_dir: Path | None = None) -> set[str]:
    out: set[str] = set()
    for d in snapshot_dirs:
        meta = read_metadata(str(d), job_dir=str(job_dir) if job_dir else None)
        out.add(_url(d / "_metadata"))
        out.update(_url(Path(h.location)) for h in meta.files().values() if h.location)
    return out


def _plant(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (OLD, OLD))
    return path


def test_expire_keeps_every_file_a_retained_snapshot_uses(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.py_job("rocks"))
    sp = flink_copy(flink_fixtures.pyflink / "rocks" / "savepoints-native")
    import_flink(catalog, [str(job_dir), str(sp)], "py")
    before = _files(job_dir) | _files(sp)
    retained = [job_dir / "chk-3", job_dir / "chk-5", *sp.iterdir()]
    keep = _used_by(retained, job_dir)
    # chk-2 alone owns its 2 OPTIONS files and its _metadata; its SSTs are still in use.
    dropped = _used_by([job_dir / "chk-2"], job_dir) - keep
    assert len(dropped) == 3
    dropped_bytes = sum(Path(u[len("file://") :]).stat().st_size for u in dropped)
    assert dropped_bytes - (job_dir / "chk-2" / "_metadata").stat().st_size == 2 * 30_598

    dry = run_maintenance(catalog, "expire", job="py", retain_last=2, dry_run=True)
    assert sorted(dry["deleted"]["items"]) == sorted(dropped)
    assert _files(job_dir) | _files(sp) == before  # a dry run changes nothing
    assert all(s.status == "COMPLETED" for s in catalog.list_snapshots("py"))

    report = run_maintenance(catalog, "expire", job="py", retain_last=2)
    assert sorted(report["deleted"]["items"]) == sorted(dropped)
    assert report["stats"]["bytes_deleted"] == dropped_bytes
    assert not (job_dir / "chk-2").exists()
    assert {_url(f) for f in _files(job_dir) | _files(sp)} == {_url(f) for f in before} - dropped
    assert keep <= {_url(f) for f in _files(job_dir) | _files(sp)}
    status = {s.checkpoint_id: s.status for s in catalog.list_snapshots("py")}
    assert status == {2: "DISCARDED", 3: "COMPLETED", 5: "COMPLETED", 6: "COMPLETED"}
    assert verify(catalog, "py").ok
    # Again: nothing more to do.
    again = run_maintenance(catalog, "expire", job="py", retain_last=2)
    assert again["deleted"]["items"] == []


def test_savepoints_go_only_when_named(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    sp = flink_copy(flink_fixtures.java_savepoints("hashmap"))
    import_flink(catalog, [str(job_dir), str(sp)], "hm")
    report = run_maintenance(catalog, "expire", job="hm", retain_last=1)
    assert {e["checkpoint_id"] for e in report["stats"]["expired"]} == {8, 10}
    assert len(list(sp.iterdir())) == 2 and not (job_dir / "chk-8").exists()
    canonical = sp / "savepoint-24b66e-d8d099a6f7d1"
    report = run_maintenance(
        catalog, "expire", job="hm", retain_last=1, savepoints=[canonical.name]
    )
    assert [e["checkpoint_id"] for e in report["stats"]["expired"]] == [5]
    assert not canonical.exists() and (sp / "savepoint-24b66e-1f90111708b1").exists()
    assert sorted(report["deleted"]["items"]) == sorted(
        _url(canonical / n)
        for n in (
            "_metadata",
            *(
                p.name
                for p in (flink_fixtures.java_savepoints("hashmap") / canonical.name).iterdir()
                if p.name != "_metadata"
            ),
        )
    )
    assert verify(catalog, "hm").ok
    with pytest.raises(InvalidJobParams, match="not a COMPLETED savepoint"):
        run_maintenance(catalog, "expire", job="hm", retain_last=1, savepoints=["chk-11"])


@pytest.mark.parametrize("backend", ["rocksdb", "hashmap"])
def test_orphan_cleanup_finds_exactly_the_planted_orphans(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    backend: str,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job(backend))
    sp = flink_copy(flink_fixtures.java_savepoints(backend))
    import_flink(catalog, [str(job_dir), str(sp)], "j")
    live = _files(job_dir) | _files(sp)
    # (1) a copy of a live file under a new name; (2) an aborted chk-12 without _metadata whose
    # files carry the base names of live files (chk-11's own, or shared SSTs).
    live_data = sorted(f for f in live if f.name != "_metadata")
    planted = {_plant(job_dir / "shared" / "0e0e0e0e-copy-of-live", live_data[0].read_bytes())}
    names = [f.name for f in sorted(_files(job_dir / "chk-11")) if f.name != "_metadata"] or [
        f.name for f in live_data if f.parent.name == "shared"
    ][:2]
    for name in names:
        planted.add(_plant(job_dir / "chk-12" / name, b"aborted"))
    fresh = job_dir / "chk-13" / names[0]  # an in-flight checkpoint: newer than the cut-off
    fresh.parent.mkdir()
    fresh.write_bytes(b"in flight")
    outside = _plant(job_dir / "not-flinks" / "x", b"left alone")  # not chk-*/shared/taskowned
    expected = sorted(_url(p) for p in planted)

    dry = run_maintenance(catalog, "orphan_cleanup", job="j", older_than="1d", dry_run=True)
    assert dry["deleted"]["items"] == expected
    assert dry["stats"]["too_new"] == [_url(fresh)]
    assert sorted(dry["stats"]["checkpoints_without_metadata"]) == [
        _url(job_dir / "chk-12"),
        _url(job_dir / "chk-13"),
    ]
    assert all(p.exists() for p in planted)

    report = run_maintenance(catalog, "orphan_cleanup", job="j", older_than="1d")
    assert report["deleted"]["items"] == expected
    assert not any(p.exists() for p in planted) and not (job_dir / "chk-12").exists()
    assert fresh.exists() and outside.exists()
    assert live <= _files(job_dir) | _files(sp)
    assert verify(catalog, "j").ok


def test_a_checkpoint_flink_wrote_after_the_import_is_respected(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    tmp_path: Path,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    parked = tmp_path / "chk-11"
    shutil.move(job_dir / "chk-11", parked)
    import_flink(catalog, [str(job_dir)], "r")
    shutil.move(parked, job_dir / "chk-11")  # Flink completed chk-11 since; not imported yet
    report = run_maintenance(catalog, "orphan_cleanup", job="r", older_than="0s")
    assert report["deleted"]["items"] == []
    assert _used_by([job_dir / "chk-11"], job_dir) <= {_url(f) for f in _files(job_dir)}


@pytest.fixture
def no_claim_ancestor(flink_fixtures: FlinkFixtures, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An ancestor job's directory and a child job restored from it in NO_CLAIM mode.

    The child's checkpoints reference the ancestor's shared files by their absolute paths (its
    own ``shared/`` is empty): the fixture's _metadata with the original root swapped for an
    existing one of the same length, so every offset stays valid.
    """
    original = b"/tmp/javaflink/runs/dev-rocks/data"
    root = Path(f"/tmp/sk-noclaim-{secrets.token_hex(9)}")
    assert len(str(root)) == len(original)
    src = flink_fixtures.java_job("rocksdb")
    ancestor = root / "checkpoints" / JAVA_ROCKS_JOB
    shutil.copytree(src / "shared", ancestor / "shared", copy_function=shutil.copy2)
    child = tmp_path / "child" / "checkpoints" / ("c" * 32)
    for chk in ("chk-8", "chk-10", "chk-11"):
        (child / chk).mkdir(parents=True)
        data = (src / chk / "_metadata").read_bytes()
        assert original in data
        (child / chk / "_metadata").write_bytes(data.replace(original, str(root).encode()))
    (child / "shared").mkdir()
    (child / "taskowned").mkdir()
    try:
        yield ancestor, child
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_no_claim_ancestor_files_are_reported_never_deleted(
    catalog: Catalog, no_claim_ancestor: tuple[Path, Path]
) -> None:
    ancestor, child = no_claim_ancestor
    imported = import_flink(catalog, [str(child)], "child")
    assert len(imported.added) == 3 and not imported.skipped
    with_foreign = catalog.snapshot_files(imported.added[-1]["snapshot_id"])
    assert {(f.details or {}).get("kind") for f in with_foreign} == {"foreign", "exclusive"}
    ancestor_files = _files(ancestor)
    for f in ancestor_files:
        os.utime(f, (OLD, OLD))
    orphan = _plant(child / "shared" / "stray", b"x")
    report = run_maintenance(catalog, "orphan_cleanup", job="child", older_than="0s")
    assert report["deleted"]["items"] == [_url(orphan)]
    foreign = report["stats"]["foreign_references"]
    assert foreign and all(u.startswith(_url(ancestor)) for u in foreign)
    expire = run_maintenance(catalog, "expire", job="child", retain_last=1)
    assert expire["stats"]["foreign_kept"]  # chk-8's SSTs: released, but the ancestor's
    assert all("/sk-noclaim-" not in u for u in expire["deleted"]["items"])
    assert _files(ancestor) == ancestor_files
    assert sorted(expire["deleted"]["items"]) == [
        _url(child / "chk-10" / "_metadata"),
        _url(child / "chk-8" / "_metadata"),
    ]
    # the released rows of files outside its directories go with the expire that released
    # them (a changelog's files, too): a later expire does not report them again
    assert catalog.releasable_files("child") == []
    again = run_maintenance(catalog, "expire", job="child", retain_last=1)
    assert again["stats"]["foreign_kept"] == [] and again["deleted"]["items"] == []
    assert _files(ancestor) == ancestor_files and verify(catalog, "child").ok


def test_cli_maintain_on_a_flink_job_prints_deleted_items(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    manage = ["--manage", "retention,orphans"]
    assert cli.main(["flink", "import", str(job_dir), "--job", "cli", *manage]) == 0
    orphan = _plant(job_dir / "chk-11" / "leftover", b"x")
    capsys.readouterr()
    argv = ["maintain", "orphan_cleanup", "--job", "cli", "--older-than", "1d", "--json"]
    assert cli.main([*argv, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"]["items"] == [_url(orphan)]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deleted"]["items"] == [_url(orphan)] and out["status"] == "SUCCEEDED"
    assert not orphan.exists()
    assert cli.main(["maintain", "expire", "--job", "cli", "--retain-last", "0"]) == 1
    assert "keep at least 1" in capsys.readouterr().err


def test_empty_checkpoint_dirs_go_only_past_the_cut_off(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "hm")
    old_empty, new_empty = job_dir / "chk-20", job_dir / "chk-21"
    old_empty.mkdir()
    new_empty.mkdir()
    os.utime(old_empty, (OLD, OLD))
    report = run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="1d")
    assert report["stats"]["dirs_removed"] == 1
    assert not old_empty.exists() and new_empty.exists()


def test_expire_older_than_uses_the_time_flink_wrote_each_metadata(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))  # chk-8, chk-10, chk-11
    assert cli.main(["flink", "import", str(job_dir), "--job", "hm", "--manage", "retention"]) == 0
    new = time.time()
    for chk, mtime in (("chk-8", OLD), ("chk-10", new), ("chk-11", new)):
        os.utime(job_dir / chk / "_metadata", (mtime, mtime))
    capsys.readouterr()
    argv = ["maintain", "expire", "--job", "hm", "--older-than", "1d", "--json"]
    assert cli.main([*argv, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert [e["checkpoint_id"] for e in dry["stats"]["expired"]] == [8]
    assert (job_dir / "chk-8").exists()
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["checkpoint_id"] for e in out["stats"]["expired"]] == [8]
    assert _url(job_dir / "chk-8" / "_metadata") in out["deleted"]["items"]
    assert not (job_dir / "chk-8").exists() and (job_dir / "chk-10" / "_metadata").exists()
    # The newest checkpoint stays even when it is the old one.
    os.utime(job_dir / "chk-11" / "_metadata", (OLD, OLD))
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["expired"] == []
    # A retention that selects every completed checkpoint is refused, nothing deleted.
    os.utime(job_dir / "chk-10" / "_metadata", (OLD, OLD))
    before = _files(job_dir)
    assert cli.main(argv) == 1
    assert "would remove all 2 completed checkpoints" in capsys.readouterr().err
    assert _files(job_dir) == before
    # With --retain-last too, both rules must hold.
    assert cli.main([*argv, "--retain-last", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["checkpoint_id"] for e in out["stats"]["expired"]] == [10]
    with Catalog.open(catalog_url) as cat:
        assert verify(cat, "hm").ok
