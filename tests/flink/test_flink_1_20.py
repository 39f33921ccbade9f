"""Snapshots that a real Flink 1.20.5 wrote (``_metadata`` version 4; data/flink-1.20): a PyFlink
job's (job.py) and the Java fixture job's (StateFixtureJob.java), on RocksDB and hashmap: read,
decoded, imported, verified, expired and cleaned as Flink 2.3's are.

Flink 1.x writes no operator uid or name into ``_metadata`` (version 5 added them) and inlines
files under 20 KB into it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.flink.import_job import import_flink
from state_engine.flink.metadata import FlinkSnapshotMetadata, read_metadata
from state_engine.flink.pyflink import PyFlinkTypes
from state_engine.flink.retention import run_maintenance
from state_engine.flink.snapshot_state import snapshot_rows
from state_engine.hashing import java_string_hash, murmur_hash
from state_engine.verify import verify

from .conftest import assert_pyflink_state
from .test_retention import _files, _url, _used_by
from .test_state import _source_positions

ROCKS_JOB = "pyflink/rocksdb/checkpoints/5bb8b7b3b93366b3acc506a0d21b3ee7"
HASHMAP_JOB = "pyflink/hashmap/checkpoints/aab5699f1501d29cd1df138c414930a1"
JOBS = {"rocksdb": ROCKS_JOB, "hashmap": HASHMAP_JOB}
#: every snapshot of the PyFlink job: (kind, format)
SNAPSHOTS = {
    **{f"{ROCKS_JOB}/chk-{n}": ("checkpoint", "native") for n in (1, 3, 5)},
    "pyflink/rocksdb/savepoints-canonical/savepoint-5bb8b7-bf90c3eba613": (
        "savepoint",
        "canonical",
    ),
    "pyflink/rocksdb/savepoints-native/savepoint-5bb8b7-0f37a607cb00": ("savepoint", "native"),
    **{f"{HASHMAP_JOB}/chk-{n}": ("checkpoint", "native") for n in (1, 3, 5)},
    "pyflink/hashmap/savepoints-canonical/savepoint-aab569-fed3f80e8d4f": (
        "savepoint",
        "canonical",
    ),
    "pyflink/hashmap/savepoints-native/savepoint-aab569-681a4786dcca": ("savepoint", "native"),
}
TYPES = PyFlinkTypes.parse(["total=value:LONG", "recent=list:LONG", "merchants=map:STRING:LONG"])


def _assert_exact_state(meta: FlinkSnapshotMetadata) -> None:
    """The keyed state is exactly what job.py computed from the records its source had read."""
    positions = _source_positions(meta)
    assert set(positions) == {"1", "2"}
    rows = snapshot_rows(meta, limit=0, pyflink_types=TYPES)
    assert_pyflink_state(rows, positions, lambda i: f"card-{i % 40:03d}", lambda a: a % 50 == 0)
    for r in rows:  # PyFlink keys by Row.of(key): Row.hashCode() = String.hashCode() + 62
        assert r["key_group"] == murmur_hash(java_string_hash(r["key"]) + 62) % 128


@pytest.mark.parametrize("path", SNAPSHOTS)
def test_version_4_metadata_reads_with_kind_format_and_the_exact_keyed_state(
    flink_120: Path, path: str
) -> None:
    meta = read_metadata(str(flink_120 / path))
    assert (meta.version, meta.kind, meta.format) == (4, *SNAPSHOTS[path])
    if "/chk-" in path:
        assert meta.checkpoint_id == int(path.rsplit("-", 1)[1])
    keyed = [op for op in meta.operators if op.has_keyed_state]
    assert [(op.uid, op.name, op.parallelism, op.max_parallelism) for op in keyed] == [
        ("", "", 2, 128)
    ]
    ranges = [s.keyed_handles[0].key_groups for s in keyed[0].subtasks]
    assert [(r.start, r.end) for r in ranges] == [(0, 63), (64, 127)]
    _assert_exact_state(meta)


@pytest.mark.parametrize("backend", ["rocksdb", "hashmap"])
def test_a_flink_1_20_job_imports_verifies_expires_and_has_no_orphans(
    catalog: Catalog, flink_120: Path, tmp_path: Path, backend: str
) -> None:
    tree = tmp_path / "pyflink" / backend
    shutil.copytree(flink_120 / "pyflink" / backend, tree, copy_function=shutil.copy2)
    job_dir = tmp_path / JOBS[backend]
    savepoints = [tree / "savepoints-canonical", tree / "savepoints-native"]
    report = import_flink(catalog, [str(job_dir), *map(str, savepoints)], "f120")
    assert len(report.added) == 5 and not report.skipped and not report.in_flight
    # every path Flink wrote is under /tmp/f120/out-<backend>: the files here were found again
    assert report.added[0]["relocated"] or backend == "hashmap"
    metas = {
        path: read_metadata(str(flink_120 / path), job_dir=str(flink_120 / JOBS[backend]))
        for path in SNAPSHOTS
        if path.startswith(f"pyflink/{backend}/")
    }
    snaps = {s.checkpoint_id: s for s in catalog.list_snapshots("f120")}
    assert {cid: (s.kind, s.format) for cid, s in snaps.items()} == {
        m.checkpoint_id: (m.kind.upper(), m.format.upper()) for m in metas.values()
    }
    assert {(s.parallelism, s.max_parallelism) for s in snaps.values()} == {(2, 128)}
    assert catalog.known_paths("f120") == {_url(f) for f in _files(tree)}
    assert verify(catalog, "f120").ok

    newest = job_dir / "chk-5"
    keep = _used_by([newest, *(next(d.iterdir()) for d in savepoints)], job_dir)
    dropped = _used_by([job_dir / "chk-1", job_dir / "chk-3"], job_dir) - keep
    expired = run_maintenance(catalog, "expire", job="f120", retain_last=1)
    assert sorted(expired["deleted"]["items"]) == sorted(dropped)
    status = {s.checkpoint_id: s.status for s in catalog.list_snapshots("f120")}
    assert status == {
        cid: "DISCARDED" if cid in (1, 3) else "COMPLETED" for cid in snaps
    }  # savepoints are never expired unless named
    left = {_url(f) for f in _files(tree)}
    assert keep <= left and not (job_dir / "chk-1").exists() and not (job_dir / "chk-3").exists()
    assert verify(catalog, "f120").ok
    _assert_exact_state(read_metadata(str(newest), job_dir=str(job_dir)))
    dry = run_maintenance(catalog, "orphan_cleanup", job="f120", older_than="1d", dry_run=True)
    assert dry["deleted"]["items"] == []


def _java(flink_120: Path, backend: str) -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = json.loads((flink_120 / "java" / "manifest.json").read_text())
    return manifest["backends"][backend], manifest


JAVA = [
    (backend, snapshot)
    for backend in ("rocksdb", "hashmap")
    for snapshot in ("chk-2", "chk-4", "chk-6", "savepoint-canonical", "savepoint-native")
]


@pytest.mark.parametrize(("backend", "name"), JAVA)
def test_java_job_state_on_flink_1_20_equals_its_mirror(
    flink_120: Path, backend: str, name: str
) -> None:
    """Java's built-in serializers (String keys, Long, Map<String, Long>, List<Long>) and the TTL
    wrapper as Flink 1.20 wrote them: every row equals the job's own mirror of its state."""
    info, _ = _java(flink_120, backend)
    root = flink_120 / "java"
    (snap,) = [s for s in info["snapshots"] if Path(s["expected_file"]).stem.startswith(name)]
    meta = read_metadata(str(root / snap["path"]), job_dir=str(root / info["job_dir"]))
    assert (meta.version, meta.kind) == (4, snap["kind"].split("-")[0])
    rows = snapshot_rows(meta, limit=0)
    got = sorted(
        (r["key_group"], r["state"], r["key"], r["user_key"], json.loads(r["value"])) for r in rows
    )
    expected = []
    for line in (root / snap["expected_file"]).read_text().splitlines():
        o = json.loads(line)
        k, kg = o["key"], o["key_group"]
        expected += [
            (kg, "lastSeen", k, None, o["lastSeen"]),
            (kg, "recent", k, None, o["recent"]),
            (kg, "total", k, None, o["total"]),
            *((kg, "merchants", k, mk, mv) for mk, mv in o["merchants"].items()),
        ]
    assert got == sorted(expected)
    # TTL: the stored last-access timestamp, a processing time inside the run
    run = info["run"]
    stamps = [r["expires_at"] for r in rows if r["state"] == "lastSeen"]
    assert len(stamps) == snap["keys"]
    assert all(run["start_ms"] <= t <= run["end_ms"] for t in stamps)


@pytest.mark.parametrize("backend", ["rocksdb", "hashmap"])
def test_java_job_on_flink_1_20_imports_and_verifies(
    catalog: Catalog, flink_120: Path, tmp_path: Path, backend: str
) -> None:
    info, _ = _java(flink_120, backend)
    tree = tmp_path / backend
    shutil.copytree(flink_120 / "java" / backend, tree, copy_function=shutil.copy2)
    job_dir = tmp_path / info["job_dir"]
    report = import_flink(catalog, [str(job_dir), str(tree / "savepoints")], "j120")
    assert len(report.added) == 5 and not report.skipped and not report.in_flight
    kinds = {
        "checkpoint": ("CHECKPOINT", "NATIVE"),
        "savepoint-canonical": ("SAVEPOINT", "CANONICAL"),
        "savepoint-native": ("SAVEPOINT", "NATIVE"),
    }
    assert {s.checkpoint_id: (s.kind, s.format) for s in catalog.list_snapshots("j120")} == {
        s["checkpoint_id"]: kinds[s["kind"]] for s in info["snapshots"]
    }
    assert catalog.known_paths("j120") == {_url(f) for f in _files(tree)}
    assert verify(catalog, "j120").ok
