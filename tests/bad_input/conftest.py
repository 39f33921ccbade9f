"""Bad-input fixtures: the fraud job killed after two checkpoints, as a user meets it, on a
migrated SQLite ``catalog`` of the test's own (tests/fixtures/catalog.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.examples import fraud
from state_engine.runtime import FileSink, Job, JobRunner

STREAM: fraud.StreamSize = {
    "partitions": 4,
    "records_per_partition": 600,
    "cards_per_partition": 40,
}
EVERY = 600


@pytest.fixture(scope="session")
def reference() -> Any:
    return fraud.alert_counts(fraud.reference_alerts(**STREAM))


@dataclass
class Killed:
    """The fraud job killed after checkpoints 1 and 2 (2 completed, not yet notified)."""

    tmp: Path
    catalog: Catalog
    storage: str
    fmt: str
    snapshots: list[SnapshotRecord]  # COMPLETED, newest first

    def job(self, parallelism: int = 2, **changes: Any) -> Job:
        factory: Any = (
            RocksDBBackendFactory(self.tmp / "rocksdb")
            if self.fmt == "native"
            else HeapBackendFactory()
        )
        return fraud.build_job(
            parallelism,
            factory,
            checkpoint_every=EVERY,
            format=self.fmt,
            sink=FileSink(self.tmp / "alerts"),
            **STREAM,
            **changes,
        )

    def resume(self, restore_from: int | str = "latest", parallelism: int = 3) -> Any:
        runner = JobRunner(
            self.job(parallelism), catalog=self.catalog, storage=self.storage,
            restore_from=restore_from,
        )  # fmt: skip
        with runner:
            return runner.run()

    def alerts(self) -> Any:
        return fraud.alert_counts(FileSink(self.tmp / "alerts").read_committed())

    def biggest_file(self, snapshot: SnapshotRecord) -> Path:
        files = [
            f
            for f in self.catalog.snapshot_files(snapshot.id)
            if not f.path.endswith("/_metadata") and "keyed" in f.path or f.shared
        ]
        return Path(max(files, key=lambda f: f.size).path.removeprefix("file://"))

    def metadata(self, snapshot: SnapshotRecord) -> Path:
        return Path(snapshot.location.removeprefix("file://")) / "_metadata"


def kill_after_two_checkpoints(tmp: Path, catalog: Catalog, fmt: str) -> Killed:
    storage = (tmp / "checkpoints").as_uri()
    killed = Killed(tmp, catalog, storage, fmt, [])
    JobRunner(killed.job(), catalog=catalog, storage=storage).run_until(2 * EVERY + 100)
    killed.snapshots = catalog.list_snapshots(fraud.JOB_NAME, status="COMPLETED")
    assert [s.checkpoint_id for s in killed.snapshots] == [2, 1]
    return killed


@pytest.fixture(params=["canonical", "native"])
def killed(request: pytest.FixtureRequest, tmp_path: Path, catalog: Catalog) -> Killed:
    return kill_after_two_checkpoints(tmp_path, catalog, request.param)
