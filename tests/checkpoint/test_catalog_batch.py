"""A checkpoint's catalog calls batched into one transaction: all of them commit, or none."""

from __future__ import annotations

import pytest

from state_engine.catalog.records import FileRef, KeyGroupStatRow
from state_engine.errors import InvalidCatalogInput


def pending(catalog, name: str = "job"):
    catalog.register_job(name, max_parallelism=128)
    return catalog.begin_snapshot(name, location=f"file:///tmp/{name}/chk-1", parallelism=1)


def test_a_batch_commits_every_call_at_its_end(catalog):
    snap = pending(catalog)
    with catalog.batch():
        catalog.attach_files(snap.id, [FileRef("file:///tmp/job/chk-1/a", 10)])
        catalog.record_key_group_stats(snap.id, [KeyGroupStatRow("op", 3, 5, 10)])
        # inside the batch its reads see its own writes
        assert [f.path for f in catalog.snapshot_files(snap.id)] == ["file:///tmp/job/chk-1/a"]
    done = catalog.complete_snapshot(snap.id, snap.version)
    assert done.status == "COMPLETED" and done.bytes == 10 and done.entries == 5


def test_a_failing_call_rolls_the_whole_batch_back(catalog):
    snap = pending(catalog)
    with pytest.raises(InvalidCatalogInput, match="appears twice"), catalog.batch():
        catalog.attach_files(snap.id, [FileRef("file:///tmp/job/chk-1/a", 10)])
        catalog.record_key_group_stats(
            snap.id, [KeyGroupStatRow("op", 3, 5), KeyGroupStatRow("op", 3, 6)]
        )
    assert catalog.snapshot_files(snap.id) == []  # the attach went with the failed stats
    # and the catalog works on (no transaction left open in this thread)
    catalog.attach_files(snap.id, [FileRef("file:///tmp/job/chk-1/a", 10)])
    assert len(catalog.snapshot_files(snap.id)) == 1
