"""Checkpoints a real Flink 2.3 writes in layouts the fixtures do not have.

A real cluster (``tests/fixtures/flink_cluster.py``) runs one SQL job, 100 counters keyed by
``id % 100``, in several configurations:

* with file merging (FLIP-306, ``execution.checkpointing.file-merging.enabled``), RocksDB
  incremental: each SST, private RocksDB file and operator-state stream of a checkpoint is a
  *segment* (start, length) of a physical file under ``shared/`` or ``taskowned/``, and one physical
  file serves several checkpoints. Import, verify, the keyed state of every checkpoint (read
  through RocksDB from the segments), expire and orphan cleanup must all treat a segment as a
  range of a file that others share.
* with file merging across checkpoints (``file-merging.across-checkpoint-boundary``), synced
  while the job runs: a physical file grows after a snapshot that reads it was imported, so the
  catalog keeps the most any snapshot needs of it and verify wants at least that much.
* restored in CLAIM mode from another job's retained checkpoint at parallelism 3: both jobs
  import and verify, and the rescaled subtasks hold every key once.
* with the changelog state backend (``state.changelog.enabled``, materialized every 4 s): its
  materialized state lives in ``taskowned/`` and serves every checkpoint until the next
  materialization. Import and verify must take such files as shared; reading the state is a
  clear refusal (it is not decoded).
"""

from __future__ import annotations

import base64
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from state_engine.catalog import Catalog, SnapshotFileRecord
from state_engine.errors import FlinkStateError
from state_engine.flink import metadata as md
from state_engine.flink.import_job import import_flink
from state_engine.flink.metadata import read_metadata
from state_engine.flink.retention import run_maintenance
from state_engine.flink.snapshot_state import snapshot_raw_rows, snapshot_rows
from state_engine.verify import verify
from tests.fixtures.flink_cluster import FlinkCluster

pytestmark = pytest.mark.slow

KEYS = 100
JOB_SQL = [
    "CREATE TABLE src (id BIGINT) WITH ('connector'='datagen', 'rows-per-second'='400', "
    "'fields.id.kind'='sequence', 'fields.id.start'='1', 'fields.id.end'='1000000')",
    "CREATE TABLE snk (k BIGINT, c BIGINT, s BIGINT) WITH ('connector'='blackhole')",
    f"INSERT INTO snk SELECT id % {KEYS}, COUNT(*), SUM(id) FROM src GROUP BY id % {KEYS}",
]
CONFIGS = {
    "file-merging": {
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.file-merging.enabled": "true",
    },
    "changelog": {
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "state.changelog.enabled": "true",
        # four checkpoint intervals: two retained checkpoints in a row share a materialization
        # unless checkpoints fall more than 4 s apart, which a loaded machine does not make them
        "state.changelog.periodic-materialize.interval": "4s",
    },
}


@pytest.fixture(scope="module")
def flink_jobs(
    flink_cluster: FlinkCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Per configuration the checkpoint directory of its cancelled job, 3 checkpoints retained
    (the oldest taken once every key had its counter), moved away from where Flink wrote it so
    every test takes a copy of its own (whose absolute paths are re-rooted on read)."""
    ids = {name: flink_cluster.submit_sql(JOB_SQL, config) for name, config in CONFIGS.items()}
    archive = tmp_path_factory.mktemp("flink-jobs")
    for name, job_id in ids.items():
        flink_cluster.wait_checkpoints(job_id, 8)
        flink_cluster.cancel(job_id)
        shutil.move(flink_cluster.checkpoints / job_id, archive / name / job_id)
    return {name: archive / name / job_id for name, job_id in ids.items()}


def _copy(flink_jobs: dict[str, Path], name: str, tmp_path: Path) -> Path:
    copy = tmp_path / "checkpoints" / flink_jobs[name].name
    shutil.copytree(flink_jobs[name], copy)
    return copy


@pytest.fixture
def job_dir(flink_jobs: dict[str, Path], tmp_path: Path) -> Path:
    return _copy(flink_jobs, "file-merging", tmp_path)


def _counter_key(raw_key: str) -> int:
    """The GROUP BY key of a RocksDB key: key-group byte, then the RowData key (its length,
    then a BinaryRowData: an 8-byte header and the BIGINT in native, little-endian order)."""
    key = base64.b64decode(raw_key)
    (length,) = struct.unpack_from(">i", key, 1)
    assert length == 16, key.hex()
    (value,) = struct.unpack_from("<q", key, 5 + 8)
    return int(value)


def test_file_merged_checkpoints_import_verify_and_read(catalog: Catalog, job_dir: Path) -> None:
    chk_dirs = sorted(job_dir.glob("chk-*/_metadata"))
    assert len(chk_dirs) == 3, chk_dirs
    metas = [read_metadata(str(p)) for p in chk_dirs]
    segments = [r.handle for m in metas for r in m.file_references() if r.handle.type == md.SEGMENT]
    assert segments, "file merging did not write any segment: the test covers nothing"
    physical = {h.location for h in segments}
    assert len(physical) < len(segments)  # several segments per physical file

    assert all(h.relocated for h in segments)  # Flink's absolute paths, re-rooted here
    report = import_flink(catalog, [str(job_dir)], "merged")
    assert sorted(a["checkpoint_id"] for a in report.added) == sorted(
        m.checkpoint_id for m in metas
    )
    result = verify(catalog, "merged")
    assert [f for f in result.findings if f.level == "ERROR"] == [], result.render()

    for meta in metas:
        rows = list(snapshot_raw_rows(meta))
        counters = [r for r in rows if r["state"] != "_timer_state"]
        by_state: dict[str, list[int]] = {}
        for r in counters:
            by_state.setdefault(r["state"], []).append(_counter_key(r["key"]))
        assert by_state, rows[:3]
        for state, keys in by_state.items():
            assert sorted(keys) == list(range(KEYS)), (meta.checkpoint_id, state)

    # a physical file cut short of what a snapshot reads of it is an error
    victim = next(loc for loc in physical if loc is not None)
    os.truncate(victim, 1)
    result = verify(catalog, "merged")
    assert any(f.kind == "size" and victim in f.message for f in result.findings), result.render()


def test_expire_and_orphan_cleanup_keep_every_segment_a_retained_checkpoint_reads(
    catalog: Catalog, job_dir: Path
) -> None:
    import_flink(catalog, [str(job_dir)], "merged")
    by_id = {int(p.parent.name[4:]): read_metadata(str(p)) for p in job_dir.glob("chk-*/_metadata")}
    newest = by_id.pop(max(by_id))
    needed = set(newest.files())
    only_older = {loc for m in by_id.values() for loc in m.files()} - needed

    orphans = run_maintenance(catalog, "orphan_cleanup", job="merged", older_than="0s")
    assert not {u.removeprefix("file://") for u in orphans["deleted"]["items"]} & needed
    expired = run_maintenance(catalog, "expire", job="merged", retain_last=1)
    gone = {u.removeprefix("file://") for u in expired["deleted"]["items"]}
    # their _metadata and exclusive files go; the physical files only they read are Flink's
    # task managers' (taskowned/, shared/<subdirectory>/): forgotten, kept for Flink and for
    # orphan cleanup, which then takes exactly those
    left = {u.removeprefix("file://") for u in expired["stats"]["left_to_flink"]}
    assert left == only_older, (left, only_older)
    assert all(Path(u).exists() for u in left)
    assert not {g for g in gone if not g.endswith("/_metadata")} & only_older
    later = run_maintenance(catalog, "orphan_cleanup", job="merged", older_than="0s")
    assert {u.removeprefix("file://") for u in later["deleted"]["items"]} == left
    assert {g for g in gone if g.endswith("/_metadata")} == {
        m.metadata_path for m in by_id.values()
    }
    assert all(Path(p).exists() for p in needed)

    # what is left still reads: every key's counter, from the segments that stayed
    rows = snapshot_raw_rows(read_metadata(str(job_dir / f"chk-{newest.checkpoint_id}")))
    assert sorted(_counter_key(r["key"]) for r in rows if r["state"] == "accState") == list(
        range(KEYS)
    )
    result = verify(catalog, "merged")
    assert [f for f in result.findings if f.level == "ERROR"] == [], result.render()


def test_changelog_checkpoints_share_their_materialized_state_and_import(
    catalog: Catalog, flink_jobs: dict[str, Path], tmp_path: Path
) -> None:
    job_dir = _copy(flink_jobs, "changelog", tmp_path)
    # oldest first, by checkpoint id (chk-10 sorts before chk-9 by name)
    metas = sorted(
        (read_metadata(str(p)) for p in job_dir.glob("chk-*/_metadata")),
        key=lambda m: m.checkpoint_id,
    )
    assert len(metas) == 3
    assert {h.type for m in metas for op in m.operators for st in op.subtasks
            for h in st.keyed_handles} == {md.CHANGELOG}  # fmt: skip
    owned = [set(m.files()) for m in metas]
    # a materialization in taskowned/ that two checkpoints read
    assert any(
        loc.startswith(str(job_dir / "taskowned"))
        for loc in owned[0] & owned[1] | owned[1] & owned[2]
    ), owned

    report = import_flink(catalog, [str(job_dir)], "changelog")
    assert len(report.added) == 3 and not report.skipped
    result = verify(catalog, "changelog")
    assert [f for f in result.findings if f.level == "ERROR"] == [], result.render()
    orphans = run_maintenance(catalog, "orphan_cleanup", job="changelog", older_than="0s")
    used = owned[0] | owned[1] | owned[2]
    assert not {u.removeprefix("file://") for u in orphans["deleted"]["items"]} & used
    # the changelog's files live in the cluster's dstl directory, outside the job's: they
    # are reported, never deleted
    dstl = {
        loc
        for m in metas
        for r in m.references()
        if r.role == "changelog" and (loc := r.handle.location)
    }
    assert dstl and all("/changelog/" in loc for loc in dstl)
    expired = run_maintenance(catalog, "expire", job="changelog", retain_last=1)
    gone = {u.removeprefix("file://") for u in expired["deleted"]["items"]}
    assert gone and not gone & (dstl | owned[-1])
    assert all(Path(loc).exists() for loc in dstl)
    # Flink drops the released changelog files itself: their rows go, no later expire lists them
    assert catalog.releasable_files("changelog") == []
    with pytest.raises(FlinkStateError, match="changelog"):
        list(snapshot_rows(metas[-1]))


ACROSS_CHECKPOINTS = {
    **CONFIGS["file-merging"],
    "execution.checkpointing.file-merging.across-checkpoint-boundary": "true",
}


def _extent(f: SnapshotFileRecord) -> int:
    return max(start + length for _role, start, length in (f.details or {})["segments"])


@pytest.fixture
def production_catalog(postgres_catalog_url: str) -> Iterator[Catalog]:
    """On PostgreSQL only: the test runs a Flink job of its own, and the catalog's side of a
    growing file is covered on both databases by tests/catalog/test_files.py."""
    with Catalog.open(postgres_catalog_url) as catalog:
        yield catalog


def test_a_running_jobs_growing_merged_files_sync_and_verify(
    production_catalog: Catalog, flink_cluster: FlinkCluster
) -> None:
    catalog = production_catalog
    job_id = flink_cluster.submit_sql(JOB_SQL, ACROSS_CHECKPOINTS)
    job_dir = flink_cluster.checkpoints / job_id
    flink_cluster.wait_checkpoints(job_id, 3)
    for _ in range(3):  # the sync DAG's imports, while Flink appends to the files they read
        report = import_flink(catalog, [str(job_dir)], "live")
        assert report.added and not report.skipped
        flink_cluster.wait_checkpoints(job_id, flink_cluster.completed_checkpoints(job_id) + 2)
    flink_cluster.cancel(job_id)
    import_flink(catalog, [str(job_dir)], "live")
    result = verify(catalog, "live")
    assert [f for f in result.findings if f.level == "ERROR"] == [], result.render()

    # a file that grew: read further by a later snapshot than by an earlier one
    extents: dict[str, set[int]] = {}
    for snap in catalog.list_snapshots("live", status=["COMPLETED", "DISCARDED"]):
        for f in catalog.snapshot_files(snap.id):
            if (f.details or {}).get("segments"):
                extents.setdefault(f.path, set()).add(_extent(f))
    assert any(len(e) > 1 for e in extents.values()), "no merged file grew: nothing was covered"


def _latest_completed(job_dir: Path) -> Path:
    """The job's newest completed checkpoint directory, by id. A checkpoint in flight when the
    job was cancelled may leave its chk-N behind without a _metadata: not a checkpoint."""
    completed = [p.parent for p in job_dir.glob("chk-*/_metadata")]
    return max(completed, key=lambda p: int(p.name[4:]))


@pytest.fixture(scope="module")
def claimed_restore(flink_cluster: FlinkCluster) -> tuple[Path, Path]:
    """The checkpoint directories of a job and of the job restored from its latest retained
    checkpoint in CLAIM mode at parallelism 3, both cancelled (tests only read them)."""
    rocks = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": "true"}
    first = flink_cluster.submit_sql(JOB_SQL, rocks)
    flink_cluster.wait_checkpoints(first, 4)
    flink_cluster.cancel(first)
    first_dir = flink_cluster.checkpoints / first
    claimed = _latest_completed(first_dir)
    restore = {
        "execution.state-recovery.path": str(claimed),
        "execution.state-recovery.claim-mode": "CLAIM",
        "parallelism.default": "3",
    }
    second = flink_cluster.submit_sql(JOB_SQL, {**rocks, **restore})
    flink_cluster.wait_checkpoints(second, 4)
    flink_cluster.cancel(second)
    assert not claimed.exists()  # the restored job owned it, and subsumed it
    return first_dir, flink_cluster.checkpoints / second


def test_a_claimed_restore_at_another_parallelism_imports_and_reads(
    catalog: Catalog, claimed_restore: tuple[Path, Path]
) -> None:
    """Key groups 0-42, 43-85, 86-127 after the rescale: both jobs import and verify, and every
    key is read once from the rescaled subtasks."""
    first_dir, second_dir = claimed_restore
    for name, job_dir in (("before", first_dir), ("after", second_dir)):
        report = import_flink(catalog, [str(job_dir)], name)
        assert report.added and not report.skipped
        result = verify(catalog, name)
        assert [f for f in result.findings if f.level == "ERROR"] == [], result.render()
    newest = _latest_completed(second_dir)
    meta = read_metadata(str(newest))
    keyed = [op for op in meta.operators if any(st.keyed_handles for st in op.subtasks)]
    assert [(op.parallelism, op.max_parallelism) for op in keyed] == [(3, 128)]
    ranges = sorted(
        (h.key_groups.start, h.key_groups.end) for st in keyed[0].subtasks for h in st.keyed_handles
    )
    assert ranges == [(0, 42), (43, 85), (86, 127)]
    rows = [r for r in snapshot_raw_rows(meta) if r["state"] == "accState"]
    assert sorted(_counter_key(r["key"]) for r in rows) == list(range(KEYS))
