"""The cyclic collector around bursts of long-lived objects (a restored heap state) and around
the forks of snapshot writers: no collection walks a restored state, no freeze ends another's."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.checkpoint.forked import reap_exited
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.collector import collector_paused, hold_frozen, release_frozen
from state_engine.snapshot.storage import CheckpointStorage
from tests.checkpoint.jobstate import OP, apply, close, factory, make_job, observe


@contextmanager
def collections() -> Iterator[list[int]]:
    """The generations of the collections that start inside the block."""
    seen: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


def young_ids() -> set[int]:
    return {id(o) for generation in (0, 1) for o in gc.get_objects(generation)}


@pytest.fixture(autouse=True)
def _no_freeze_left() -> Iterator[None]:
    reap_exited(block=True)  # no snapshot writer of an earlier test holds a freeze
    gc.unfreeze()
    yield
    assert gc.get_freeze_count() == 0


def test_objects_kept_from_a_paused_block_are_old_and_no_collection_walked_them() -> None:
    with collections() as seen:
        with collector_paused(keep=True):
            state = [[i] for i in range(50_000)]
        assert seen == []
    young = young_ids()
    assert not any(id(x) in young for x in state)
    assert gc.isenabled()


def test_a_paused_block_leaves_the_collector_as_it_found_it() -> None:
    gc.disable()
    try:
        with collector_paused(keep=True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def tracked_ids() -> set[int]:
    """Every object the collector walks (a frozen one is in none of its generations)."""
    return {id(o) for o in gc.get_objects()}


def test_a_freeze_the_user_made_is_not_ended() -> None:
    mine = [[1], [2]]
    gc.freeze()
    try:
        with collector_paused(keep=True):
            state = [[3]]
        # the user's frozen objects stay frozen; the block's are left to the collector
        walked = tracked_ids()
        assert not any(id(x) in walked for x in mine)
        assert all(id(x) in walked for x in state)
    finally:
        gc.unfreeze()


def test_holds_nest_and_a_kept_block_inside_one_unfreezes_nothing() -> None:
    held = [[1], [2]]
    hold_frozen()
    hold_frozen()
    with collector_paused(keep=True):
        more = [[3]]  # joins the held freeze
    release_frozen()
    # still the outer hold: what it froze stays frozen, the kept block's objects with it
    walked = tracked_ids()
    assert not any(id(x) in walked for x in [*held, *more])
    release_frozen()
    assert gc.get_freeze_count() == 0
    walked = tracked_ids()
    assert all(id(x) in walked for x in [*held, *more])  # walked again, in the old generation
    assert not any(id(x) in young_ids() for x in [*held, *more])


def test_restoring_a_heap_state_runs_no_collection_and_leaves_it_old(
    tmp_path: Path, catalog: Any
) -> None:
    keys = [f"user-{i}" for i in range(3000)]
    job = make_job("heap", tmp_path / "job", 2)
    apply(job, keys)
    storage = CheckpointStorage((tmp_path / "checkpoints").as_uri())
    with CheckpointManager(
        catalog, storage, "restored", max_parallelism=128, parallelism=2, fork_writer=False
    ) as m:
        record = m.trigger(job).result()
        with collections() as seen:
            restored = m.restore(record.id, parallelism=1, factory=factory("heap", tmp_path))
        assert seen == []
        assert observe(restored.subtasks, keys) == observe(job, keys)
        young = young_ids()
        backend = restored.subtasks[0].keyed[OP]
        assert isinstance(backend, HeapKeyedStateBackend)
        tables = backend._tables_of  # the heap backend's slots
        assert not any(id(t) in young for slots in tables.values() for t in slots)
        close(restored.subtasks)
    close(job)
