"""Flink jobs in the catalog for the rewrite tests: the real Flink 2.3 fixture snapshots (the Java
job, tests/flink/conftest.py), copied and imported like ``statectl flink import`` does."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.flink.import_job import import_flink

JAVA_ROCKS_JOB = "0cf791d2fa2585d18b369593e6ac454d"


@dataclass(frozen=True)
class FlinkJob:
    name: str
    root: Path
    snapshots: dict[str, SnapshotRecord]  # "canonical", "native", "chk-8", "chk-10", "chk-11"

    def __getitem__(self, key: str) -> SnapshotRecord:
        return self.snapshots[key]


def import_java_job(catalog: Catalog, fixtures: Any, into: Path, name: str = "fraud") -> FlinkJob:
    """The Java fixture job's RocksDB savepoints and retained checkpoints, imported as ``name``."""
    src = fixtures.java / "rocksdb"
    root = into / "flink"
    shutil.copytree(src, root, copy_function=shutil.copy2)
    import_flink(
        catalog, [str(root / "savepoints"), str(root / "checkpoints" / JAVA_ROCKS_JOB)], name
    )
    found: dict[str, SnapshotRecord] = {}
    for snap in catalog.list_snapshots(name):
        if str(snap.kind) == "SAVEPOINT":
            found[str(snap.format).lower()] = snap
        else:
            found[f"chk-{snap.checkpoint_id}"] = snap
    return FlinkJob(name, root, found)
