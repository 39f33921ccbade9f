"""Heap deltas write a map entry changed on its own as that entry (PUT or DELETE), not its
whole map; a barrier may come while the previous checkpoint still writes (max concurrent > 1)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import SubtaskState
from state_engine.runtime.coordinator import CheckpointCoordinator
from state_engine.snapshot.canonical import read_key_groups
from state_engine.snapshot.delta import CLEAR, DELETE, PUT
from state_engine.snapshot.metadata import FileKind, read_metadata
from tests.checkpoint.jobstate import OP, TAGS, apply, close, factory, make_job, observe, owner

KEYS = [f"user-{i}" for i in range(300)]


def manager(catalog, storage, **kw: Any) -> CheckpointManager:
    return CheckpointManager(
        catalog, storage, "job", max_parallelism=128, parallelism=2, format="delta", **kw
    )


def delta_ops(storage, record) -> Counter[tuple[str, int]]:
    """(state, op) of every row in the snapshot's newest delta files."""
    meta = read_metadata(storage.snapshot(record.location))
    deltas = [f for f in meta.files if f.kind is FileKind.DELTA]
    newest = max(f.chain_index or 0 for f in deltas)
    files = [f for f in deltas if f.chain_index == newest]
    snap = storage.snapshot(record.location)
    out: Counter[tuple[str, int]] = Counter()
    for batch in read_key_groups(snap, meta, (0, 127), files=files):
        out.update(
            zip(batch.column("state").to_pylist(), batch.column("op").to_pylist(), strict=True)
        )
    return out


def test_map_entries_changed_alone_are_written_alone(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage) as m:
        m.trigger(job).result()  # the base
        for i, k in enumerate(KEYS[:40]):
            b = owner(job, k)
            tags = b.get_state(TAGS)
            b.set_current_key(k)
            if i < 20:
                tags.put("extra", i)  # a new entry: one PUT
                tags.put("r0", -i)  # a changed one: one PUT
            elif i < 30:
                tags.remove("r0")  # one DELETE (the map is empty after: gone)
            else:
                tags.put("extra", i)
                tags.clear()  # the whole map: one CLEAR, no rows (the put is covered)
        record = m.trigger(job).result()
        ops = delta_ops(storage, record)
        assert ops == {("tags", PUT): 40, ("tags", DELETE): 10, ("tags", CLEAR): 10}
        expected = observe(job, KEYS)
        restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == expected
        close(restored.subtasks)
    close(job)


def test_entry_changes_of_a_failed_checkpoint_are_carried(catalog, storage, tmp_path: Path):
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage) as m:
        m.trigger(job).result()
        # a key of each subtask (a subtask without any delta restores differently: not here)
        first = [next(k for k in KEYS if owner(job, k) is st.keyed[OP]) for st in job]
        for k in first:
            b = owner(job, k)
            tags = b.get_state(TAGS)
            b.set_current_key(k)
            tags.put("lost", 1)
            tags.remove("r0")
        lost = m.trigger(job)
        lost.cancel()
        record = m.trigger(job).result()
        assert delta_ops(storage, record) == {("tags", PUT): 2, ("tags", DELETE): 2}
        expected = observe(job, KEYS)
        restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == expected
        close(restored.subtasks)
    close(job)


class Participant:
    """One subtask as a barrier participant; records the barriers it was notified of."""

    def __init__(self, subtask: SubtaskState, notified: list[int]) -> None:
        self.subtask = subtask
        self.notified = notified

    def prepare_snapshot(self, barrier: int) -> SubtaskState:
        return self.subtask

    def notify_checkpoint_complete(self, barrier: int) -> None:
        if self.subtask.subtask_index == 0:
            self.notified.append(barrier)


def test_next_barrier_does_not_wait_for_the_previous_checkpoint(
    catalog, storage, tmp_path: Path
) -> None:
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, fork_writer=False, full_every=1) as m:
        notified: list[int] = []
        parts = [Participant(st, notified) for st in job]
        coord = CheckpointCoordinator(m, parts, interval_records=10, max_concurrent=2)
        coord.wait(coord.trigger(10))  # checkpoint 1: the base
        apply(job, KEYS[:10], round_=3)
        coord.wait(coord.trigger(20))  # checkpoint 2: a delta (full_every=1)
        gate = threading.Event()
        m._executor.submit(gate.wait)  # the checkpoint thread is busy until the gate opens
        apply(job, KEYS[:30], round_=1)
        third = coord.trigger(30)  # a new base: the chain has full_every deltas
        apply(job, KEYS[30:60], round_=2)
        fourth = coord.trigger(40)  # returns although the third still waits to be written
        assert coord.in_flight == 2 and coord.stats.waited == 0
        expected = observe(job, KEYS)
        gate.set()
        record = coord.wait(fourth)
        third_record = coord.wait(third)
        assert third_record.checkpoint_id == 3 and record.checkpoint_id == 4
        third_meta = read_metadata(storage.snapshot(third_record.location))
        assert all(f.kind is FileKind.KEYED for f in third_meta.files)  # a new base
        assert notified == [1, 2, 3, 4]
        # the fourth extended the chain (the third's base was in flight), as a delta of both
        # rounds' changes on checkpoint 2's chain
        meta = read_metadata(storage.snapshot(record.location))
        assert max(f.chain_index or 0 for f in meta.files) == 2
        restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == expected
        close(restored.subtasks)
        # a third barrier while two are in flight waits for the oldest
        m._executor.submit((gate := threading.Event()).wait)
        a, b_ = coord.trigger(50), coord.trigger(60)
        gate.set()
        coord.trigger(70)
        assert coord.stats.waited == 1
        coord.wait_all(notify=True)
        assert notified == [1, 2, 3, 4, 5, 6, 7]
        assert [r.checkpoint_id for r in coord.stats.completed] == [1, 2, 3, 4, 5, 6, 7]
        assert a.pending.checkpoint_id == 5 and b_.pending.checkpoint_id == 6
    close(job)


def test_a_delta_may_continue_the_chain_of_a_checkpoint_in_flight(
    catalog, storage, tmp_path: Path
) -> None:
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, fork_writer=False, chain_in_flight=True) as m:
        notified: list[int] = []
        parts = [Participant(st, notified) for st in job]
        coord = CheckpointCoordinator(m, parts, interval_records=10, max_concurrent=2)
        coord.wait(coord.trigger(10))  # the base
        gate = threading.Event()
        m._executor.submit(gate.wait)
        apply(job, KEYS[:100], round_=1)
        second = coord.trigger(20)
        apply(job, KEYS[:5], round_=2)  # 5 keys changed...
        third = coord.trigger(30)  # ...written on top of the second's delta, not with it
        gate.set()
        coord.wait(second)
        record = coord.wait(third)
        meta = read_metadata(storage.snapshot(record.location))
        assert sorted({f.chain_index or 0 for f in meta.files}) == [0, 1, 2]
        ops = delta_ops(storage, record)
        # the 5 keys' values and map entries (key 3 also puts one in a namespace), no more
        assert ops[("count", PUT)] == 5 and ops[("tags", PUT)] == 6
        expected = observe(job, KEYS)
        restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == expected
        close(restored.subtasks)

        # the checkpoint a delta continues fails before the delta is written: the delta's view
        # holds the whole state, so it writes a new base instead (a forked writer, which wrote
        # at the barrier, fails instead and the next checkpoint covers its changes)
        m._executor.submit((gate := threading.Event()).wait)
        apply(job, KEYS[100:130], round_=3)
        doomed = coord.trigger(40)
        apply(job, KEYS[130:140], round_=4)
        follower = coord.trigger(50)
        assert doomed.pending.cancel()
        gate.set()
        base = coord.wait(follower)
        assert [f.split(":")[0] for f in coord.stats.failed] == ["CHECKPOINT at barrier 4"]
        base_meta = read_metadata(storage.snapshot(base.location))
        assert all(f.kind is FileKind.KEYED for f in base_meta.files)
        record = coord.wait(coord.trigger(60))
        expected = observe(job, KEYS)
        restored = m.restore(record.id, parallelism=1, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == expected
        close(restored.subtasks)
    close(job)


def test_a_barrier_whose_synchronous_phase_failed_leaves_the_next_delta_whole(
    catalog, storage, tmp_path: Path, monkeypatch
) -> None:
    """Subtask 1's capture raises after subtask 0's delta was captured: the checkpoint fails at
    the barrier, and the next one (which may continue a chain in flight) is not built on it."""
    job = make_job("heap", tmp_path, 2, track_changes=True)
    apply(job, KEYS)
    with manager(catalog, storage, fork_writer=False, chain_in_flight=True) as m:
        m.trigger(job).result()  # the base
        apply(job, KEYS[:40], round_=1)
        real = CheckpointManager._capture

        def capture(self, strategy, uid, index, *args, **kw):
            if index == 1:
                raise OSError("disk full while subtask 1 took its view")
            return real(self, strategy, uid, index, *args, **kw)

        monkeypatch.setattr(CheckpointManager, "_capture", capture)
        with pytest.raises(OSError, match="subtask 1"):
            m.trigger(job)
        monkeypatch.undo()
        apply(job, KEYS[40:50], round_=2)
        record = m.trigger(job).result()
        assert record.status == "COMPLETED"
        restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == observe(job, KEYS)
        close(restored.subtasks)
    close(job)
