"""Regression tests: expire, orphan cleanup and sync never delete what a live Flink checkpoint uses.

Each test is a scenario in which an earlier version deleted files of COMPLETED checkpoints (or of a
checkpoint Flink wrote on disk): a job directory imported under another spelling, a directory
symlinked into the job directory, nested claimed directories, a directory briefly missing at a
sync, a new checkpoint where a discarded one was, two runs of one job, a NO_CLAIM child and its
ancestor, an ambiguous ``--savepoint``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.errors import (
    FlinkImportError,
    FlinkJobDirectoryMissing,
    InvalidJobParams,
    MaintenanceJobFailed,
)
from state_engine.flink.forget import forget_directory
from state_engine.flink.import_job import import_flink
from state_engine.flink.retention import run_maintenance
from state_engine.maintenance import deletion
from state_engine.verify import verify

from .conftest import JAVA_HASHMAP_JOB, JAVA_ROCKS_JOB, FlinkFixtures
from .test_retention import OLD, _files, _url, _used_by

ORIGINAL_ROOT = b"/tmp/javaflink/runs/dev-rocks/data"  # where the Java RocksDB job wrote


def _age(root: Path) -> None:
    """Make every file under ``root`` days old, as in any long-running job."""
    for f in root.rglob("*"):
        os.utime(f, (OLD, OLD), follow_symlinks=False)


@pytest.fixture
def flink_root() -> Iterator[Path]:
    """A fresh directory whose path is as long as the one the Java RocksDB job wrote its
    absolute paths under, so that its ``_metadata`` can be moved there by a byte swap."""
    root = Path(f"/tmp/sk-safety-{secrets.token_hex(10)}"[: len(ORIGINAL_ROOT)])
    assert len(str(root)) == len(ORIGINAL_ROOT)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _rocks_job_at(flink_fixtures: FlinkFixtures, root: Path) -> Path:
    """The Java RocksDB job as if Flink had written it under ``root``: its absolute handles
    (``<root>/checkpoints/<job-id>/shared/...``) exist as written."""
    job_dir = root / "checkpoints" / JAVA_ROCKS_JOB
    shutil.copytree(flink_fixtures.java_job("rocksdb"), job_dir, copy_function=shutil.copy2)
    for meta in job_dir.glob("chk-*/_metadata"):
        data = meta.read_bytes()
        assert ORIGINAL_ROOT in data
        meta.write_bytes(data.replace(ORIGINAL_ROOT, str(root).encode()))
    return job_dir


def _live_files(job_dir: Path, checkpoints: list[str]) -> set[Path]:
    return {
        Path(u[len("file://") :]) for u in _used_by([job_dir / c for c in checkpoints], job_dir)
    }


@pytest.mark.parametrize("spelling", ["link", "/./", "//"])
def test_a_job_directory_imported_under_another_spelling_keeps_its_files(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_root: Path, tmp_path: Path, spelling: str
) -> None:
    job_dir = _rocks_job_at(flink_fixtures, flink_root)
    if spelling == "link":
        (tmp_path / "alias").symlink_to(flink_root)  # e.g. /data -> /mnt/disk1/data
        given = str(tmp_path / "alias" / "checkpoints" / JAVA_ROCKS_JOB)
    else:
        given = f"{flink_root}{spelling}checkpoints/{JAVA_ROCKS_JOB}"
    report = import_flink(catalog, [given], "r")
    assert report.directories == [_url(job_dir)]  # one spelling: the directory Flink wrote
    snap = catalog.list_snapshots("r")[0]
    kinds = {(f.details or {}).get("kind") for f in catalog.snapshot_files(snap.id)}
    assert "foreign" not in kinds and "shared" in kinds
    _age(job_dir)
    live = _live_files(job_dir, ["chk-8", "chk-10", "chk-11"])

    out = run_maintenance(catalog, "orphan_cleanup", job="r", older_than="1d")
    assert out["deleted"]["items"] == [] and out["stats"]["foreign_references"] == []
    assert all(p.exists() for p in live)
    # a sync under yet another spelling is the same directory, nothing new
    again = import_flink(catalog, [f"{flink_root}/./checkpoints//{JAVA_ROCKS_JOB}"], "r")
    assert sorted(again.unchanged) == [8, 10, 11] and not again.vanished
    assert verify(catalog, "r").ok


def test_a_copied_job_directory_references_its_own_files_not_the_original(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_root: Path, tmp_path: Path
) -> None:
    original = _rocks_job_at(flink_fixtures, flink_root)
    copy = tmp_path / "copy" / JAVA_ROCKS_JOB
    shutil.copytree(original, copy, copy_function=shutil.copy2)
    imported = import_flink(catalog, [str(copy)], "c")
    assert all(a["relocated"] for a in imported.added)  # re-rooted, though the original exists
    # each relocated file says where Flink wrote it; the others keep no copy of their own path
    for snap in catalog.list_snapshots("c"):
        for f in catalog.snapshot_files(snap.id):
            details = f.details or {}
            if details.get("relocated"):
                assert str(original) in details["flink_path"] and str(copy) in f.path
            else:
                assert "flink_path" not in details
    _age(copy)
    out = run_maintenance(catalog, "orphan_cleanup", job="c", older_than="1d")
    assert out["deleted"]["items"] == []
    assert all(p.exists() for p in _live_files(copy, ["chk-8", "chk-10", "chk-11"]))


def test_orphan_cleanup_never_deletes_through_a_directory_link(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    other = flink_copy(flink_fixtures.java_job("rocksdb"))
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    shutil.rmtree(job_dir / "shared")
    (job_dir / "shared").symlink_to(other / "shared")  # two jobs sharing one shared/ directory
    import_flink(catalog, [str(other)], "other")
    import_flink(catalog, [str(job_dir)], "hm")
    _age(other)
    before = _files(other)
    out = run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="1d")
    assert out["deleted"]["items"] == []
    kept = out["stats"]["links_kept"]
    assert len(kept) == len(_files(other / "shared"))
    assert all(u.startswith(_url(job_dir / "shared") + "/") for u in kept)
    assert _files(other) == before


def test_a_sync_of_one_of_nested_directories_leaves_the_others_snapshots(
    catalog: Catalog, flink_fixtures: FlinkFixtures, tmp_path: Path
) -> None:
    # state.savepoints.dir == state.checkpoints.dir: <ck>/<job-id>/chk-N and <ck>/savepoint-*
    ck = tmp_path / "ck"
    job_dir = ck / JAVA_HASHMAP_JOB
    shutil.copytree(flink_fixtures.java_job("hashmap"), job_dir, copy_function=shutil.copy2)
    for sp in flink_fixtures.java_savepoints("hashmap").iterdir():
        shutil.copytree(sp, ck / sp.name, copy_function=shutil.copy2)
    import_flink(catalog, [str(job_dir), str(ck)], "hm")
    sync = import_flink(catalog, [str(ck)], "hm")
    assert not sync.vanished
    assert {s.status for s in catalog.list_snapshots("hm")} == {"COMPLETED"}
    _age(job_dir)
    before = _files(job_dir)
    assert (
        run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="1d")["deleted"]["items"]
        == []
    )
    assert _files(job_dir) == before


def test_a_sync_of_a_job_directory_leaves_a_savepoint_inside_it(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    # flink stop --savepointPath <ck>/<job-id>: a savepoint inside the job directory
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    name = "savepoint-24b66e-1f90111708b1"
    sp = job_dir / name
    shutil.copytree(flink_fixtures.java_savepoints("hashmap") / name, sp)
    import_flink(catalog, [str(job_dir), str(sp)], "hm")
    sync = import_flink(catalog, [str(job_dir)], "hm")
    assert not sync.vanished
    out = run_maintenance(catalog, "expire", job="hm", retain_last=2)
    assert [e["checkpoint_id"] for e in out["stats"]["expired"]] == [8]
    assert (sp / "_metadata").exists() and len(_files(sp)) == 3


def test_a_directory_missing_at_a_sync_keeps_its_snapshots(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    tmp_path: Path,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    import_flink(catalog, [str(job_dir)], "r")
    parked = tmp_path / "parked"
    shutil.move(job_dir, parked)  # an unmounted volume, a rename: gone for a moment
    absent = import_flink(catalog, [str(job_dir)], "r")
    assert absent.missing_directories == [_url(job_dir)] and not absent.vanished
    with pytest.raises(FlinkJobDirectoryMissing, match="its snapshots are kept"):
        run_maintenance(catalog, "orphan_cleanup", job="r", older_than="1d")
    shutil.move(parked, job_dir)
    back = import_flink(catalog, [str(job_dir)], "r")
    assert sorted(back.unchanged) == [8, 10, 11] and not back.skipped
    _age(job_dir)
    live = _live_files(job_dir, ["chk-8", "chk-10", "chk-11"])
    assert (
        run_maintenance(catalog, "orphan_cleanup", job="r", older_than="1d")["deleted"]["items"]
        == []
    )
    assert all(p.exists() for p in live)
    out = run_maintenance(catalog, "expire", job="r", retain_last=2)
    assert [e["checkpoint_id"] for e in out["stats"]["expired"]] == [8]
    assert all(p.exists() for p in _live_files(job_dir, ["chk-10", "chk-11"]))
    assert verify(catalog, "r").ok


def test_a_new_checkpoint_where_a_discarded_one_was_is_imported_as_a_snapshot_of_its_own(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    first = import_flink(catalog, [str(job_dir)], "hm")
    old_8 = next(a["snapshot_id"] for a in first.added if a["checkpoint_id"] == 8)
    run_maintenance(catalog, "expire", job="hm", retain_last=1)  # chk-8, chk-10 deleted
    assert not (job_dir / "chk-8").exists()
    # The job restarted under the same Flink job id (application mode's fixed id) from an early
    # savepoint and completed a new chk-8; the old run's chk-11 was cleaned up.
    shutil.rmtree(job_dir / "chk-11")
    shutil.copytree(flink_fixtures.java_job("hashmap") / "chk-8", job_dir / "chk-8")
    sync = import_flink(catalog, [str(job_dir)], "hm")
    assert [a["checkpoint_id"] for a in sync.added] == [8] and not sync.skipped
    new_8 = sync.added[0]["snapshot_id"]
    assert new_8 != old_8 and catalog.get_snapshot(old_8).status == "DISCARDED"
    assert catalog.get_snapshot(new_8).status == "COMPLETED"
    assert [v["checkpoint_id"] for v in sync.vanished] == [11]
    assert verify(catalog, "hm").ok
    again = import_flink(catalog, [str(job_dir)], "hm")  # a sync changes nothing more
    assert again.unchanged == [8] and not again.added and not again.skipped
    _age(job_dir)
    live = _live_files(job_dir, ["chk-8"])
    out = run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="1d")
    assert out["deleted"]["items"] == []
    assert all(p.exists() for p in live)


def test_a_new_rocksdb_checkpoint_where_an_expired_one_was_reuses_the_shared_files_kept(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    """The expired chk-8's shared files that chk-11 still uses stay, with their references from
    the discarded row: the new chk-8 reuses them, and nothing waits for them to go."""
    original = flink_fixtures.java_job("rocksdb")
    job_dir = flink_copy(original)
    import_flink(catalog, [str(job_dir)], "r")
    run_maintenance(catalog, "expire", job="r", retain_last=1)  # chk-8, chk-10 go
    assert not (job_dir / "chk-8").exists()
    shutil.copytree(original / "chk-8", job_dir / "chk-8", copy_function=shutil.copy2)
    for f in (original / "shared").iterdir():  # the SSTs only chk-8 used, uploaded again
        if not (job_dir / "shared" / f.name).exists():
            shutil.copy2(f, job_dir / "shared" / f.name)
    sync = import_flink(catalog, [str(job_dir)], "r")
    assert [a["checkpoint_id"] for a in sync.added] == [8] and not sync.skipped
    assert verify(catalog, "r").ok
    _age(job_dir)
    live = _live_files(job_dir, ["chk-8", "chk-11"])
    out = run_maintenance(catalog, "orphan_cleanup", job="r", older_than="1d")
    # only the fixture's SSTs no checkpoint uses (copied back above with the rest) are orphans
    assert all("/shared/" in u for u in out["deleted"]["items"])
    assert all(p.exists() for p in live) and verify(catalog, "r").ok


def _expire_killed_before_deleting(
    catalog: Catalog, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``expire --retain-last 1`` of ``job`` killed between discarding and deleting."""

    def killed(kind: str, job: str) -> None:
        raise RuntimeError("killed between discarding and deleting")

    monkeypatch.setattr(deletion.hooks, "before_forget", killed)
    with pytest.raises(MaintenanceJobFailed, match="killed"):
        run_maintenance(catalog, "expire", job=job, retain_last=1)
    monkeypatch.setattr(deletion.hooks, "before_forget", None)


def test_a_new_checkpoint_where_an_unfinished_expire_left_files_waits_for_that_expire(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "hm")
    _expire_killed_before_deleting(catalog, "hm", monkeypatch)
    # a new chk-8 written over the old one before the expire ran again
    shutil.rmtree(job_dir / "chk-8")
    shutil.copytree(flink_fixtures.java_job("hashmap") / "chk-8", job_dir / "chk-8")
    sync = import_flink(catalog, [str(job_dir)], "hm")
    reasons = {s["checkpoint_id"]: s["reason"] for s in sync.skipped}
    assert sorted(reasons) == [8, 10] and not sync.added
    assert "did not finish removing its files" in reasons[8]
    assert "expired; its files go next" in reasons[10]  # the very _metadata discarded
    live = _live_files(job_dir, ["chk-8"])
    run_maintenance(catalog, "expire", job="hm", retain_last=1)
    assert all(p.exists() for p in live)  # the new checkpoint's files are kept
    after = import_flink(catalog, [str(job_dir)], "hm")
    assert [a["checkpoint_id"] for a in after.added] == [8]
    assert verify(catalog, "hm").ok


def test_an_interrupted_expire_leaves_a_metadata_the_next_run_deletes(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "hm")
    _expire_killed_before_deleting(catalog, "hm", monkeypatch)
    assert (job_dir / "chk-8" / "_metadata").exists()  # the very file discarded: pins nothing
    out = run_maintenance(catalog, "orphan_cleanup", job="hm", older_than="0s")
    assert _url(job_dir / "chk-8" / "_metadata") in out["deleted"]["items"]
    assert not (job_dir / "chk-8").exists() and not (job_dir / "chk-10").exists()
    assert (job_dir / "chk-11" / "_metadata").exists()


def test_expire_keeps_the_newest_run_of_a_job_with_two_flink_job_directories(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    old_run = flink_copy(flink_fixtures.java_job("hashmap"))  # chk-8, chk-10, chk-11
    new_run = old_run.parent / ("e" * 32)  # restarted under a new Flink job id
    shutil.copytree(old_run / "chk-8", new_run / "chk-3")
    meta = new_run / "chk-3" / "_metadata"
    data = bytearray(meta.read_bytes())
    assert struct.unpack_from(">q", data, 8)[0] == 8  # the header's checkpoint id
    struct.pack_into(">q", data, 8, 3)
    meta.write_bytes(bytes(data))
    (new_run / "shared").mkdir()
    (new_run / "taskowned").mkdir()
    _age(old_run)
    now = time.time()
    os.utime(meta, (now, now))
    import_flink(catalog, [str(old_run), str(new_run)], "app")
    out = run_maintenance(catalog, "expire", job="app", retain_last=2)
    assert sorted(e["checkpoint_id"] for e in out["stats"]["expired"]) == [8, 10]
    assert meta.exists() and (old_run / "chk-11" / "_metadata").exists()


def _no_claim_child(ancestor: Path, tmp_path: Path) -> Path:
    """A job restored from the ancestor's chk-8 in NO_CLAIM mode, whose first checkpoint still
    references the ancestor's files by their absolute paths (its own shared/ is empty)."""
    child = tmp_path / "child" / "checkpoints" / ("c" * 32)
    (child / "chk-8").mkdir(parents=True)
    shutil.copy2(ancestor / "chk-8" / "_metadata", child / "chk-8" / "_metadata")
    (child / "shared").mkdir()
    return child


@pytest.mark.parametrize("ancestor_first", [True, False], ids=["ancestor-first", "child-first"])
def test_a_no_claim_child_is_a_job_of_its_own_whose_references_pin_the_ancestors_files(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_root: Path,
    tmp_path: Path,
    ancestor_first: bool,
) -> None:
    ancestor = _rocks_job_at(flink_fixtures, flink_root)
    child = _no_claim_child(ancestor, tmp_path)
    order = [(ancestor, "anc"), (child, "child")]
    for directory, job in order if ancestor_first else order[::-1]:
        report = import_flink(catalog, [str(directory)], job)
        assert report.added and not report.skipped, report.render()
    held = catalog.path_owners(_used_by([child / "chk-8"], child))
    pinned = {u for u, job in held.items() if job == "anc"}
    assert pinned and all(u.startswith(_url(ancestor)) for u in pinned)
    assert verify(catalog, "anc").ok and verify(catalog, "child").ok

    # the ancestor's retention and cleanup keep what the child's checkpoint uses
    plan = run_maintenance(catalog, "expire", job="anc", retain_last=1, dry_run=True)
    assert plan["deleted"]["items"] and not pinned & set(plan["deleted"]["items"])
    run_maintenance(catalog, "expire", job="anc", retain_last=1)  # its chk-8 and chk-10 go
    _age(ancestor)
    run_maintenance(catalog, "orphan_cleanup", job="anc", older_than="1d")
    assert all(Path(u[len("file://") :]).exists() for u in pinned)
    assert verify(catalog, "child").ok and verify(catalog, "anc").ok
    # the child's never touch the ancestor's files
    before = _files(ancestor)
    run_maintenance(catalog, "orphan_cleanup", job="child", older_than="0s")
    assert _files(ancestor) == before

    # once the child no longer references them, the ancestor's cleanup takes them
    shutil.rmtree(child)
    forget_directory(catalog, str(child), "child")
    assert catalog.paths_referenced_elsewhere("anc") == set()
    run_maintenance(catalog, "orphan_cleanup", job="anc", older_than="1d")
    live = {_url(p) for p in _live_files(ancestor, ["chk-11"])}
    gone = {u for u in pinned if u not in live}
    assert gone and not any(Path(u[len("file://") :]).exists() for u in gone)
    assert verify(catalog, "anc").ok


def test_a_directory_inside_another_jobs_directory_is_refused_before_anything_is_written(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_root: Path
) -> None:
    ancestor = _rocks_job_at(flink_fixtures, flink_root)
    import_flink(catalog, [str(ancestor)], "anc")
    jobs = [(j.name, j.id) for j in catalog.list_jobs()]
    # its chk-11 read as a savepoint directory of another job: that job would own (and could
    # delete) files of anc's own checkpoint
    with pytest.raises(FlinkImportError, match="already belong to job 'anc'.*in its own"):
        import_flink(catalog, [str(ancestor / "chk-11")], "other")
    assert [(j.name, j.id) for j in catalog.list_jobs()] == jobs
    assert catalog.directory_owner(_url(ancestor / "chk-11")) is None


def test_a_savepoint_argument_two_readings_give_different_savepoints_is_refused(
    catalog: Catalog, flink_fixtures: FlinkFixtures, tmp_path: Path
) -> None:
    sps = tmp_path / "savepoints"
    shutil.copytree(flink_fixtures.java_savepoints("hashmap"), sps, copy_function=shutil.copy2)
    import_flink(catalog, [str(sps)], "hm")
    by_flink_id = {s.checkpoint_id: s for s in catalog.list_snapshots("hm")}
    target = by_flink_id[9]  # the savepoint the argument names by its catalog snapshot id
    assert target.id not in by_flink_id
    # another savepoint whose Flink savepoint id is that number
    other = tmp_path / "more" / "savepoint-other"
    shutil.copytree(Path(by_flink_id[5].location[len("file://") :]), other)
    data = bytearray((other / "_metadata").read_bytes())
    struct.pack_into(">q", data, 8, target.id)
    (other / "_metadata").write_bytes(bytes(data))
    import_flink(catalog, [str(other)], "hm")
    before = _files(sps) | _files(other)
    with pytest.raises(InvalidJobParams, match="is ambiguous"):
        run_maintenance(catalog, "expire", job="hm", savepoints=[str(target.id)])
    assert _files(sps) | _files(other) == before
    out = run_maintenance(catalog, "expire", job="hm", savepoints=["savepoint-other"])
    assert [e["checkpoint_id"] for e in out["stats"]["expired"]] == [target.id]
