"""Checkpoints of a running job restored at parallelism 1, 3 and 4 (from 2), on both backends,
from canonical and native snapshots: the restored state equals the state that was snapshotted."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import RestoreMode
from state_engine.snapshot.metadata import read_metadata
from tests.checkpoint.jobstate import (
    OP,
    add_operator_state,
    apply,
    close,
    factory,
    make_job,
    observe,
    operator_view,
)

KEYS = [f"user-{i}" for i in range(300)]


def manager(catalog, storage, fmt="canonical", **kw) -> CheckpointManager:
    return CheckpointManager(
        catalog,
        storage,
        "job",
        max_parallelism=128,
        parallelism=2,
        format=fmt,
        row_group_bytes=2048,
        **kw,
    )


CASES = [
    ("heap", "canonical", "heap"),
    ("heap", "canonical", "rocksdb"),
    ("rocksdb", "canonical", "heap"),
    ("rocksdb", "canonical", "rocksdb"),
    ("rocksdb", "native", "rocksdb"),
    ("rocksdb", "native", "heap"),
]


@pytest.mark.parametrize("src,fmt,dst", CASES)
def test_restore_at_1_3_4_from_2(catalog, storage, tmp_path: Path, src, fmt, dst):
    job = make_job(src, tmp_path / "src", 2)
    apply(job, KEYS)
    add_operator_state(job)
    with manager(catalog, storage, fmt, incremental=fmt == "native") as m:
        pending = m.trigger(job)
        expected = observe(job, KEYS)
        expected_ops = operator_view(job)
        apply(job, KEYS[:50], round_=1)  # processing continues while the snapshot is written
        record = pending.result()
        assert record.status == "COMPLETED"
        meta = read_metadata(storage.snapshot(record.location))
        assert meta.format.value == fmt.upper()
        assert meta.parallelism == 2 and meta.operators[0].operator_id in (OP, "source")
        for p in (1, 3, 4):
            restored = m.restore(
                record.id, parallelism=p, factory=factory(dst, tmp_path / f"dst{p}")
            )
            assert [s.subtask_index for s in restored.subtasks] == list(range(p))
            assert restored.checkpoint_id == record.checkpoint_id
            assert observe(restored.subtasks, KEYS) == expected
            offsets, unions = operator_view(restored.subtasks)
            assert sorted(offsets) == sorted(expected_ops[0])  # SPLIT: each element once
            assert unions == [[0, 10]] * p  # UNION: every subtask gets all
            close(restored.subtasks)
    close(job)


def test_latest_and_claim_modes(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)
    with manager(catalog, storage) as m:
        first = m.trigger(job).result()
        apply(job, KEYS[:10], round_=1)
        second = m.trigger(job).result()
        expected = observe(job, KEYS)
        restored = m.restore(
            parallelism=3, factory=factory("heap", tmp_path), mode=RestoreMode.CLAIM
        )
        assert restored.snapshot.id == second.id
        assert observe(restored.subtasks, KEYS) == expected
        assert first.checkpoint_id < second.checkpoint_id
