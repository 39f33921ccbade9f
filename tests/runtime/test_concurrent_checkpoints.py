"""Exactly-once with overlapping checkpoints (``max_concurrent_checkpoints=2``): a job killed
midway and restored equals the uninterrupted run, and every barrier's checkpoint completes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from state_engine.backends.heap import HeapBackendFactory
from state_engine.runtime import CollectedOutput, CollectSink, JobRunner
from tests.runtime.sk_runtime_jobs import multiset, state_set
from tests.runtime.test_recovery import PARTITIONS, SMALL, proof_job, reference

EVERY = 50
KILL_AT = 425


@pytest.fixture(scope="module")
def small_reference() -> tuple[Counter[str], set[tuple[Any, ...]]]:
    return reference(SMALL)


@pytest.mark.parametrize("fmt", ["delta", "canonical"])
@pytest.mark.parametrize("new_p", [1, 3])
def test_overlapping_checkpoints_kill_and_restore(
    tmp_path: Path,
    catalog: Any,
    small_reference: tuple[Counter[str], set[tuple[Any, ...]]],
    fmt: str,
    new_p: int,
) -> None:
    out = CollectedOutput()
    storage = str(tmp_path / "checkpoints")

    def job(p: int) -> Any:
        return proof_job(p, HeapBackendFactory(), CollectSink(out), fmt=fmt, every=EVERY).with_(
            max_concurrent_checkpoints=2
        )

    first = JobRunner(job(2), catalog=catalog, storage=storage)
    killed = first.run_until(records=KILL_AT)
    assert killed.killed and not killed.failed_checkpoints
    # every barrier's checkpoint completed (the kill lets those in flight land, unnotified)
    assert [c.checkpoint_id for c in killed.checkpoints] == list(range(1, KILL_AT // EVERY + 1))
    assert len(out.records) < killed.records_out  # the last checkpoint's output is not out

    with JobRunner(job(new_p), catalog=catalog, storage=storage, restore_from="latest") as second:
        done = second.run()
        assert done.finished and not done.failed_checkpoints
        assert done.restored_from.checkpoint_id == killed.checkpoints[-1].checkpoint_id
        assert done.records_in == PARTITIONS * SMALL - killed.checkpoints[-1].checkpoint_id * EVERY
        state = state_set(second.state_entries())
    expected_out, expected_state = small_reference
    assert multiset(out.records) == expected_out
    assert state == expected_state


def test_max_concurrent_checkpoints_is_checked(tmp_path: Path) -> None:
    from state_engine.errors import InvalidJob

    with pytest.raises(InvalidJob, match="max_concurrent_checkpoints"):
        proof_job(1, None, CollectSink(CollectedOutput())).with_(max_concurrent_checkpoints=0)
