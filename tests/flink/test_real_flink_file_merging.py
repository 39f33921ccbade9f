"""Checkpoints a real Flink 2.3 wrote with file merging on (FLIP-306), RocksDB incremental.

With ``execution.checkpointing.file-merging.enabled`` Flink packs many logical files into few
physical ones: each SST, private RocksDB file and operator-state stream of a checkpoint is a
*segment* (start, length) of a physical file under ``shared/`` or ``taskowned/``, and one physical
file serves several checkpoints. The fixtures have none of this, so a real cluster writes it
(``tests/fixtures/flink_cluster.py``); the job keys 100 counters by ``id % 100``.

Import, verify, the keyed state of every checkpoint (read through RocksDB from the segments),
expire and orphan cleanup must all treat a segment as a range of a file that others share.
"""

from __future__ import annotations

import base64
import shutil
import struct
from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.flink import metadata as md
from state_engine.flink.import_job import import_flink
from state_engine.flink.metadata import read_metadata
from state_engine.flink.retention import run_maintenance
from state_engine.flink.snapshot_state import snapshot_raw_rows
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
FILE_MERGING = {
    "state.backend.type": "rocksdb",
    "execution.checkpointing.incremental": "true",
    "execution.checkpointing.file-merging.enabled": "true",
}


@pytest.fixture(scope="module")
def merged_job(flink_cluster: FlinkCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint directory of a cancelled file-merging job with 3 retained checkpoints,
    the oldest of them taken once every key had its counter. Moved away from where Flink wrote
    it, so every test takes a copy of its own (whose absolute paths are re-rooted on read)."""
    job_id = flink_cluster.submit_sql(JOB_SQL, FILE_MERGING)
    flink_cluster.wait_checkpoints(job_id, 6)
    flink_cluster.cancel(job_id)
    archive = tmp_path_factory.mktemp("merged") / job_id
    shutil.move(flink_cluster.checkpoints / job_id, archive)
    return archive


@pytest.fixture
def job_dir(merged_job: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "checkpoints" / merged_job.name
    shutil.copytree(merged_job, copy)
    return copy


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
    # exactly the physical files only the expired checkpoints used, and their _metadata
    assert {g for g in gone if not g.endswith("/_metadata")} == only_older
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
