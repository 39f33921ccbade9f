"""``statectl flink import`` on both fixture archives and both catalog databases, and its sync."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from state_engine import cli
from state_engine.catalog import Catalog
from state_engine.errors import (
    FlinkDirectoryClaimed,
    FlinkImportError,
    FlinkJobDirectoryMissing,
)
from state_engine.flink import import_job
from state_engine.flink.import_job import file_groups, import_flink
from state_engine.flink.metadata import read_metadata
from state_engine.snapshot.storage import FileStore
from state_engine.verify import verify

from .conftest import FlinkFixtures
from .test_metadata import PY_SNAPSHOTS

KIND = {
    "checkpoint": ("CHECKPOINT", "NATIVE"),
    "savepoint-canonical": ("SAVEPOINT", "CANONICAL"),
    "savepoint-native": ("SAVEPOINT", "NATIVE"),
}


def _url(p: Path) -> str:
    return f"file://{p}"


def _on_disk(*roots: Path) -> set[str]:
    return {_url(f) for r in roots for f in r.rglob("*") if f.is_file()}


@pytest.mark.parametrize("backend", ["rocksdb", "hashmap"])
def test_java_fixture_imports_every_snapshot(
    catalog: Catalog, flink_fixtures: FlinkFixtures, backend: str
) -> None:
    fx = flink_fixtures
    job_dir, sp_dir = fx.java_job(backend), fx.java_savepoints(backend)
    report = import_flink(catalog, [str(job_dir), str(sp_dir)], "java")
    manifest = json.loads((fx.java / "manifest.json").read_text())["backends"][backend]
    assert len(report.added) == 5 and not report.skipped and not report.in_flight
    job = catalog.get_job("java")
    assert (job.origin, job.max_parallelism, job.location) == ("flink", 128, _url(job_dir))
    snaps = {s.checkpoint_id: s for s in catalog.list_snapshots("java")}
    assert sorted(snaps) == sorted(s["checkpoint_id"] for s in manifest["snapshots"])
    for expected in manifest["snapshots"]:
        snap = snaps[expected["checkpoint_id"]]
        assert (snap.kind, snap.format) == KIND[expected["kind"]]
        assert (snap.status, snap.parallelism, snap.max_parallelism) == ("COMPLETED", 2, 128)
        assert snap.location == _url(fx.java / expected["path"])
        files = catalog.snapshot_files(snap.id)
        data = [f for f in files if (f.details or {}).get("role") != "metadata"]
        assert len({f.path for f in data}) == expected["referenced_files"]
        assert sum({f.path: f.size for f in data}.values()) == expected["referenced_bytes"]
        assert snap.bytes == expected["referenced_bytes"] + expected["metadata_bytes"]
        roles = {(f.details or {}).get("role") for f in files}
        if expected["keyed_handle_type"] == "IncrementalRemoteKeyedStateHandle":
            assert {"shared", "private", "metadata"} <= roles
        else:
            assert roles == {"keyed-state", "metadata"}
    # Every file on disk is referenced, each registered once however many snapshots use it.
    assert catalog.known_paths("java") == _on_disk(job_dir, sp_dir)
    assert verify(catalog, "java").ok


def test_shared_files_are_registered_once_and_referenced_by_many(
    catalog: Catalog, flink_fixtures: FlinkFixtures
) -> None:
    job_dir = flink_fixtures.py_job("rocks")
    import_flink(catalog, [str(job_dir)], "py")
    uses: Counter[str] = Counter()
    for snap in catalog.list_snapshots("py"):
        uses.update({f.path for f in catalog.snapshot_files(snap.id)})
    assert max(uses.values()) == 3  # SSTs of chk-2 are still used by chk-3 and chk-5
    shared = {
        f.path: f
        for s in catalog.list_snapshots("py")
        for f in catalog.snapshot_files(s.id)
        if f.shared
    }
    assert shared and all("/shared/" in p for p in shared)
    # Live reference counts equal the number of snapshots using each file.
    for f in catalog.releasable_files("py"):
        pytest.fail(f"{f.path} has no live reference")
    assert len(catalog.known_paths("py")) == len(uses) == 24 + 3


def test_rocksdb_files_kept_as_columns_give_the_groups_their_handles_give(
    flink_fixtures: FlinkFixtures,
) -> None:
    """The import reads a RocksDB handle's files from their columns (see LocalFiles): the file
    groups are the ones the same snapshot gives once every file is a handle object."""
    fx = flink_fixtures
    for job_dir in (fx.java_job("rocksdb"), fx.py_job("rocks")):
        store = FileStore.at(str(job_dir))[0]
        for metadata in sorted(job_dir.glob("chk-*/_metadata")):
            meta = read_metadata(str(metadata))
            runs = [r for r in meta.handle_runs() if r.files is not None]
            assert any(r.files.locations is not None for r in runs)  # type: ignore[union-attr]
            from_columns = file_groups(meta, store)
            for run in runs:
                list(run.handles)  # made: the columns are dropped
            assert not any(r.files.in_columns for r in runs)  # type: ignore[union-attr]
            assert file_groups(meta, store) == from_columns


@pytest.mark.parametrize("backend", ["rocks", "hashmap"])
def test_pyflink_fixture_imports_and_verifies(
    catalog: Catalog, flink_fixtures: FlinkFixtures, backend: str
) -> None:
    root = flink_fixtures.pyflink / backend
    paths = [
        flink_fixtures.py_job(backend),
        root / "savepoints-canonical",
        root / "savepoints-native",
    ]
    import_flink(catalog, [str(p) for p in paths], "pyjob")
    snaps = {s.location: s for s in catalog.list_snapshots("pyjob")}
    rows = [r for r in PY_SNAPSHOTS if r[0].startswith(backend + "/")]
    assert len(snaps) == len(rows) == 5
    for rel, cid, kind, fmt, nfiles, nbytes, _ in rows:
        snap = snaps[_url(flink_fixtures.pyflink / rel)]
        assert (snap.checkpoint_id, snap.kind, snap.format) == (cid, kind.upper(), fmt.upper())
        metadata_size = (flink_fixtures.pyflink / rel / "_metadata").stat().st_size
        assert snap.bytes == nbytes + metadata_size
        assert len({f.path for f in catalog.snapshot_files(snap.id)}) == nfiles + 1
    assert verify(catalog, "pyjob").ok


def test_key_group_sizes_come_from_the_handles_offsets(
    catalog: Catalog, flink_fixtures: FlinkFixtures
) -> None:
    job_dir = flink_fixtures.java_job("hashmap")
    import_flink(catalog, [str(job_dir), str(flink_fixtures.java_savepoints("hashmap"))], "hm")
    for snap in catalog.list_snapshots("hm"):
        stats = catalog.key_group_stats(snap.id, "agg")
        assert [s.key_group for s in stats] == list(range(128))
        meta = read_metadata(snap.location)
        per_subtask = []
        for st in meta.operator("agg").subtasks:
            h = st.managed_keyed_state
            assert h is not None and h.delegate is not None
            first = min(o for o in h.offsets if o > 0)
            per_subtask.append(h.delegate.size - first)  # every byte after the header
        assert sum(s.bytes for s in stats) == sum(per_subtask)
        if snap.format == "CANONICAL":
            empty: set[int] = set()
            for st in meta.operator("agg").subtasks:
                h = st.managed_keyed_state
                assert h is not None
                empty.update(
                    kg for kg, off in zip(h.key_groups, h.offsets, strict=True) if off == 0
                )
            assert all(s.bytes == 0 for s in stats if s.key_group in empty)
        else:
            assert all(s.bytes > 0 for s in stats)  # heap files hold every key group
    # The skew page has one row per operator with stats (rows are not counted at import).
    skew = catalog.key_group_skew(catalog.list_snapshots("hm")[0].id)
    assert [(s.operator, s.recorded_key_groups) for s in skew] == [("agg", 128)]


def test_reimport_syncs_added_and_vanished(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    tmp_path: Path,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    parked = tmp_path / "parked-chk-11"
    shutil.move(job_dir / "chk-11", parked)
    first = import_flink(catalog, [str(job_dir)], "sync")
    assert [a["checkpoint_id"] for a in first.added] == [8, 10]
    shutil.move(parked, job_dir / "chk-11")
    second = import_flink(catalog, [str(job_dir)], "sync")
    assert [a["checkpoint_id"] for a in second.added] == [11]
    assert sorted(second.unchanged) == [8, 10]
    shutil.rmtree(job_dir / "chk-8")
    third = import_flink(catalog, [str(job_dir)], "sync")
    assert [v["checkpoint_id"] for v in third.vanished] == [8]
    assert not third.added and sorted(third.unchanged) == [10, 11]
    by_id = {s.checkpoint_id: s for s in catalog.list_snapshots("sync")}
    assert by_id[8].status == "DISCARDED" and "vanished" in (by_id[8].error or "")
    assert [by_id[i].status for i in (10, 11)] == ["COMPLETED", "COMPLETED"]
    assert len(catalog.list_snapshots("sync")) == 3  # nothing duplicated
    # The whole directory gone: reported, its snapshots kept as they were (an unmounted volume
    # is not the end of its checkpoints), no error.
    shutil.rmtree(job_dir)
    fourth = import_flink(catalog, [str(job_dir)], "sync")
    assert fourth.missing_directories == [_url(job_dir)] and not fourth.vanished
    assert "its snapshots are kept" in fourth.render()
    assert [(s.checkpoint_id, s.status) for s in catalog.list_snapshots("sync")] == [
        (11, "COMPLETED"),
        (10, "COMPLETED"),
        (8, "DISCARDED"),
    ]


@pytest.mark.parametrize("attached", [False, True])
def test_a_pending_snapshot_an_interrupted_import_left_is_completed_by_the_next(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    tmp_path: Path,
    attached: bool,
) -> None:
    """An importer before chunked transactions could die between a snapshot's begin (or its
    attach) and its completion: the next sync resumes that PENDING record, nothing duplicated."""
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    shutil.move(job_dir / "chk-11", tmp_path / "parked")
    import_flink(catalog, [str(job_dir)], "resume")
    shutil.move(tmp_path / "parked", job_dir / "chk-11")
    pending = catalog.begin_snapshot(  # the import that began chk-11 died
        "resume",
        location=_url(job_dir / "chk-11"),
        parallelism=2,
        kind="CHECKPOINT",
        format="NATIVE",
        checkpoint_id=11,
        max_parallelism=128,
        trigger="flink-import",
        metadata_format="flink",
    )
    if attached:
        meta = read_metadata(str(job_dir / "chk-11"), job_dir=str(job_dir))
        catalog.attach_files(pending.id, file_groups(meta, FileStore.at(str(job_dir))[0]))
    report = import_flink(catalog, [str(job_dir)], "resume")
    assert [r["checkpoint_id"] for r in report.resumed] == [11] and not report.added
    assert sorted(report.unchanged) == [8, 10]
    assert catalog.get_snapshot(pending.id).status == "COMPLETED"
    assert len(catalog.list_snapshots("resume")) == 3
    assert verify(catalog, "resume").ok


def test_an_import_cut_short_keeps_whole_chunks_and_the_next_finishes_it(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Snapshots go into the catalog a chunk per transaction: a failure in the second chunk
    keeps the first whole and nothing of the second; the next import adds the rest."""
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    monkeypatch.setattr(import_job, "CHUNK_REFERENCES", 1)  # a snapshot per chunk
    real = Catalog.attach_files_many
    calls: list[int] = []

    def failing_second(self: Catalog, attachments: Any) -> int:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the catalog's disk filled up")
        return real(self, attachments)

    monkeypatch.setattr(Catalog, "attach_files_many", failing_second)
    with pytest.raises(OSError, match="disk filled up"):
        import_flink(catalog, [str(job_dir)], "cut")
    assert [(s.checkpoint_id, s.status) for s in catalog.list_snapshots("cut")] == [
        (8, "COMPLETED")
    ]
    assert verify(catalog, "cut").ok
    monkeypatch.setattr(Catalog, "attach_files_many", real)
    report = import_flink(catalog, [str(job_dir)], "cut")
    assert [a["checkpoint_id"] for a in report.added] == [10, 11] and report.unchanged == [8]
    assert {s.status for s in catalog.list_snapshots("cut")} == {"COMPLETED"}
    assert catalog.known_paths("cut") == _on_disk(job_dir)
    assert verify(catalog, "cut").ok


def test_verify_sync_explains_a_checkpoint_flink_subsumed_since_the_import(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A running job subsumes checkpoints at any moment: plain verify reports the missing
    ``_metadata`` and says how to sync; ``--sync`` syncs, then verifies the live snapshots; a
    missing data file is still an error."""
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    job_dir = flink_copy(flink_fixtures.java_job("rocksdb"))
    with Catalog.open(catalog_url) as catalog:
        import_flink(catalog, [str(job_dir)], "live")
    shutil.rmtree(job_dir / "chk-8")  # subsumed by the running job after the import

    def run(*argv: str) -> tuple[int, str]:
        code = cli.main(["verify", "live", *argv])
        return code, capsys.readouterr().out

    code, out = run()
    assert code == 3
    assert "a running Flink job may have subsumed" in out and "statectl verify live --sync" in out
    code, out = run("--sync")
    assert code == 0, out
    assert "synced: checkpoint(s) 8 vanished" in out and "2 COMPLETED" in out
    with Catalog.open(catalog_url) as catalog:
        status = {s.checkpoint_id: s.status for s in catalog.list_snapshots("live")}
    assert status == {8: "DISCARDED", 10: "COMPLETED", 11: "COMPLETED"}
    # a data file gone is not something a sync explains
    with Catalog.open(catalog_url) as catalog:
        snap = next(s for s in catalog.list_snapshots("live") if s.checkpoint_id == 11)
        victim = next(
            Path(f.path.removeprefix("file://"))
            for f in catalog.snapshot_files(snap.id)
            if "/shared/" in f.path
        )
    victim.unlink()
    code, out = run("--sync", "--json")
    report = json.loads(out)
    assert code == 3 and not report["ok"]
    missing = {f["path"] for f in report["jobs"][0]["findings"] if f["kind"] == "missing"}
    assert missing == {_url(victim)}
    assert report["jobs"][0]["vanished"] == []


def test_a_chk_dir_without_metadata_is_reported_not_imported(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    shutil.copytree(job_dir / "chk-11", job_dir / "chk-12")
    (job_dir / "chk-12" / "_metadata").unlink()
    report = import_flink(catalog, [str(job_dir)], "hm")
    assert report.in_flight == [_url(job_dir / "chk-12")]
    assert sorted(a["checkpoint_id"] for a in report.added) == [8, 10, 11]


def test_the_same_directory_under_two_names_is_refused(
    catalog: Catalog, flink_fixtures: FlinkFixtures
) -> None:
    sp = flink_fixtures.java_savepoints("hashmap")
    import_flink(catalog, [str(sp)], "first")
    before = [(j.name, j.id) for j in catalog.list_jobs()]
    with pytest.raises(FlinkDirectoryClaimed, match="already imported as job 'first'"):
        import_flink(catalog, [str(flink_fixtures.java_job("hashmap")), str(sp)], "second")
    assert [(j.name, j.id) for j in catalog.list_jobs()] == before


def test_bad_input_leaves_the_catalog_as_it_was(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    tmp_path: Path,
) -> None:
    # (a truncated _metadata is one FAILED snapshot, not a refused import: test_unreadable.py)
    with pytest.raises(FlinkJobDirectoryMissing, match="does not exist"):
        import_flink(catalog, [str(tmp_path / "nope")], "broken")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.txt").write_text("x")
    with pytest.raises(FlinkImportError, match="is not a Flink job checkpoint directory"):
        import_flink(catalog, [str(tmp_path / "junk")], "broken")
    with pytest.raises(FlinkImportError, match="it holds job directories: import one of"):
        import_flink(catalog, [str(flink_fixtures.java / "hashmap" / "checkpoints")], "broken")
    assert catalog.list_jobs() == []


def test_existing_commands_work_on_an_imported_job(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    job_dir = flink_fixtures.java_job("rocksdb")
    sp = flink_fixtures.java_savepoints("rocksdb")

    def run(*argv: str) -> str:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    report = json.loads(run("flink", "import", str(job_dir), str(sp), "--job", "j", "--json"))
    assert [a["checkpoint_id"] for a in report["added"]] == [5, 8, 9, 10, 11]
    jobs = json.loads(run("jobs", "--json"))
    assert [(j["name"], j["origin"], j["latest_snapshot"]["checkpoint_id"]) for j in jobs] == [
        ("j", "flink", 11)
    ]
    roles = {d["path"]: d["role"] for d in jobs[0]["directories"]}
    assert roles == {_url(job_dir): "flink-checkpoints", _url(sp): "flink-savepoints"}
    snaps = json.loads(run("snapshots", "j", "--json"))
    assert [s["checkpoint_id"] for s in snaps] == [11, 10, 9, 8, 5]
    chk8 = next(s for s in snaps if s["checkpoint_id"] == 8)
    files = json.loads(run("files", str(chk8["id"]), "--json"))
    assert len(files) == 20 + 1  # one reference per on-disk handle, and the _metadata
    assert {f["details"]["role"] for f in files} == {"shared", "private", "metadata"}
    assert "state size per operator" in run("show", str(chk8["id"]))
    assert "consistent" in run("verify", "j")
    # A refused second import: one line on stderr, exit 1, no traceback.
    assert cli.main(["flink", "import", str(sp), "--job", "other"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("statectl: error:") and err.count("\n") == 1


def test_a_savepoint_with_files_missing_is_reported_not_imported(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    sp = flink_copy(flink_fixtures.java_savepoints("rocksdb"))
    native = sp / "savepoint-0cf791-72b072c25cc0"
    victim = sorted(p for p in native.iterdir() if p.name != "_metadata")[0]
    victim.unlink()
    report = import_flink(catalog, [str(sp)], "sp")
    assert [a["checkpoint_id"] for a in report.added] == [5]
    [skipped] = report.skipped
    assert skipped["checkpoint_id"] == 9 and "1 file(s)" in skipped["reason"]
    assert skipped["missing"] == [str(victim)]
    assert [s.checkpoint_id for s in catalog.list_snapshots("sp")] == [5]
    assert verify(catalog, "sp").ok


def test_metadata_version_5_reads_like_version_6(flink_fixtures: FlinkFixtures) -> None:
    """Version 5 differs from 6 only in how channel state is written; the fixtures have none."""
    from state_engine.flink.metadata import metadata_from_bytes

    path = flink_fixtures.java_job("rocksdb") / "chk-11" / "_metadata"
    data = path.read_bytes()
    v6 = metadata_from_bytes(data, str(path))
    v5 = metadata_from_bytes(data[:4] + (5).to_bytes(4, "big") + data[8:], str(path))
    assert (v5.version, v6.version) == (5, 6)
    assert v5.operators == v6.operators and (v5.kind, v5.format) == (v6.kind, v6.format)


@pytest.mark.parametrize("backend", ["rocksdb", "hashmap"])
def test_canonical_savepoints_count_records_per_key_group(
    catalog: Catalog, flink_fixtures: FlinkFixtures, backend: str
) -> None:
    """One canonical record per (state, key) and per map entry: total, lastSeen and recent once
    per key (a list is one record), merchants once per entry (fixture README counts)."""
    sp = flink_fixtures.java_savepoints(backend)
    import_flink(catalog, [str(sp)], "c")
    manifest = json.loads((flink_fixtures.java / "manifest.json").read_text())["backends"][backend]
    expected = next(s for s in manifest["snapshots"] if s["kind"] == "savepoint-canonical")
    snap = next(s for s in catalog.list_snapshots("c") if s.format == "CANONICAL")
    assert snap.entries == 3 * expected["keys"] + expected["map_entries"]
    [skew] = catalog.key_group_skew(snap.id)
    assert skew.total_rows == snap.entries and skew.skew is not None and skew.skew >= 1.0
    native = next(s for s in catalog.list_snapshots("c") if s.format == "NATIVE")
    assert native.entries == 0  # heap/RocksDB native: not counted without decoding
