"""Expire and orphan cleanup next to a running job and other jobs: a running incremental job
never loses a file it builds on, savepoints are named unambiguously, and another job's
savepoint in a directory this job used once is not this job's orphan."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.writer_lease import WriterLease
from state_engine.errors import InvalidJobParams, ReusedFileMissing
from state_engine.jobs import expire, orphan_cleanup
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.snapshot_enums import SnapshotStatus
from tests.jobs.deletiondata import (
    JOB,
    MAX_P,
    apply,
    checkpoints,
    close,
    exists,
    make_subtasks,
    manager,
    observe,
    referenced_urls,
    restored_state,
    set_age,
)

FORMATS = [("delta", "heap"), ("native", "rocksdb")]


def _newer_checkpoint_by_another_writer(
    catalog: Catalog, storage: CheckpointStorage, subtasks: list
) -> None:
    """A CHECKPOINT of the job that the running writer did not write (as compaction,
    TTL cleanup or a rescale to the same max parallelism commit): the catalog's latest."""
    with manager(catalog, storage, "canonical") as other:
        other.trigger(subtasks).result()


def _missing(catalog: Catalog, snapshot_id: int) -> list[str]:
    return [u for u in referenced_urls(catalog, [snapshot_id]) if not exists(u)]


@pytest.mark.parametrize(("fmt", "backend"), FORMATS)
def test_expire_leaves_the_running_writer_the_files_it_builds_on(
    catalog: Catalog, storage: CheckpointStorage, tmp_path: Path, fmt: str, backend: str
) -> None:
    subtasks = make_subtasks(backend, tmp_path / "db")
    lease = WriterLease(catalog, JOB).acquire()
    m = manager(catalog, storage, fmt, full_every=8, writer_lease=lease)
    try:
        recs, _ = checkpoints(m, subtasks, 2)
        _newer_checkpoint_by_another_writer(catalog, storage, subtasks)
        chain = referenced_urls(catalog, [recs[-1].id])

        report = expire.run(None, catalog, job=JOB, retain_last=1)

        stats = report["stats"]
        assert stats["snapshots_expired"] == 2 and stats["files_deferred_to_running_job"] > 0
        assert all(exists(u) for u in chain - {recs[-1].location + "/_metadata"})
        apply(subtasks, 7)
        want = observe(subtasks)
        pending = m.trigger(subtasks)
        nxt = pending.result()
        assert nxt.status is SnapshotStatus.COMPLETED and _missing(catalog, nxt.id) == []
        assert pending.stats.files_reused > 0  # it went on building on its own files
        assert restored_state(m, nxt.id, tmp_path) == want
    finally:
        m.close()  # gives the writer lease up
        close(subtasks)
    # once the job stopped, the next expire deletes what it left
    again = expire.run(None, catalog, job=JOB, retain_last=1)
    assert again["stats"]["files_deferred_to_running_job"] == 0
    assert again["stats"]["files_deleted"] > 0
    (latest,) = catalog.list_snapshots(JOB, status="COMPLETED")
    assert _missing(catalog, latest.id) == []


@pytest.mark.parametrize(("fmt", "backend"), FORMATS)
def test_a_job_without_the_lease_fails_one_checkpoint_then_writes_in_full(
    catalog: Catalog, storage: CheckpointStorage, tmp_path: Path, fmt: str, backend: str
) -> None:
    """A CheckpointManager driven directly holds no writer lease, so expire cannot know what it
    builds on: the checkpoint reusing a deleted file is refused, never COMPLETED over a missing
    file, and the next one stands on its own."""
    subtasks = make_subtasks(backend, tmp_path / "db")
    with manager(catalog, storage, fmt, full_every=8) as m:
        checkpoints(m, subtasks, 2)
        _newer_checkpoint_by_another_writer(catalog, storage, subtasks)
        assert expire.run(None, catalog, job=JOB, retain_last=1)["stats"]["files_deleted"] > 0
        apply(subtasks, 7)
        with pytest.raises(ReusedFileMissing, match="writes its state in full"):
            m.trigger(subtasks).result()
        apply(subtasks, 8)
        want = observe(subtasks)
        pending = m.trigger(subtasks)
        full = pending.result()
        assert full.status is SnapshotStatus.COMPLETED and _missing(catalog, full.id) == []
        assert pending.stats.files_reused == 0
        assert restored_state(m, full.id, tmp_path) == want
        for snap in catalog.list_snapshots(JOB, status="COMPLETED"):
            assert _missing(catalog, snap.id) == []
    close(subtasks)


def test_a_savepoint_name_two_savepoints_share_is_refused(
    catalog: Catalog, storage: CheckpointStorage, tmp_path: Path
) -> None:
    subtasks = make_subtasks("heap", tmp_path / "db")
    apply(subtasks, 1)
    with manager(catalog, storage) as m:
        m.trigger(subtasks).result()
        q1, q2 = (
            m.trigger(
                subtasks, kind="SAVEPOINT", savepoint_dir=(tmp_path / q / "release").as_uri()
            ).result()
            for q in ("2024-q1", "2024-q2")
        )
    with pytest.raises(InvalidJobParams, match=f"could be any of snapshots.*{q1.id}"):
        expire.run(None, catalog, job=JOB, savepoints=["release"])
    assert {catalog.get_snapshot(s.id).status for s in (q1, q2)} == {SnapshotStatus.COMPLETED}
    assert exists(q1.location) and exists(q2.location)
    report = expire.run(None, catalog, job=JOB, savepoints=[q2.location])
    assert [e["id"] for e in report["stats"]["expired"]] == [q2.id]
    close(subtasks)


def test_orphan_cleanup_keeps_another_jobs_savepoint_in_a_directory_it_once_used(
    catalog: Catalog, storage: CheckpointStorage, tmp_path: Path
) -> None:
    target = tmp_path / "savepoints" / "pre-upgrade"
    subtasks = make_subtasks("heap", tmp_path / "db")
    apply(subtasks, 1)
    with manager(catalog, storage) as m:
        m.trigger(subtasks).result()
        mine = m.trigger(subtasks, kind="SAVEPOINT", savepoint_dir=target.as_uri()).result()
    expire.run(None, catalog, job=JOB, savepoints=[str(mine.id)])
    assert not target.exists()
    with CheckpointManager(catalog, storage, "ledger", max_parallelism=MAX_P, parallelism=2) as b:
        theirs = b.trigger(subtasks, kind="SAVEPOINT", savepoint_dir=target.as_uri()).result()
    files = referenced_urls(catalog, [theirs.id])
    for url in files:
        set_age(url, 5)

    report = orphan_cleanup.run(None, catalog, job=JOB)

    assert report["stats"]["files_deleted"] == 0
    assert report["stats"]["kept_other_jobs"] == len(files)
    assert all(exists(u) for u in files)
    close(subtasks)
