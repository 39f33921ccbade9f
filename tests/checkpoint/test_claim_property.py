"""A heap delta chain claimed by a restore (CLAIM) and continued, against a plain-dict model.

Whatever happens after the claim (its compaction, cancelled checkpoints, two checkpoints in
flight at once, savepoints, claiming again), every snapshot that completes restores, at any
parallelism, to exactly the state the model held at its barrier: value, JSON, list and map
states, in the void namespace and another one, with values cleared, overwritten, mutated in
place and map entries removed.
"""

from __future__ import annotations

import copy
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import RestoreMode, SubtaskState
from state_engine.errors import SnapshotCancelled
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from tests.checkpoint.jobstate import close, factory, make_job, owner

NUMBER = ValueStateDescriptor("number", int)
DOC = ValueStateDescriptor("doc", dict)
NAMES = ListStateDescriptor("names", str)
COUNTS = MapStateDescriptor("counts", str, int)
DESCRIPTORS = (NUMBER, DOC, NAMES, COUNTS)
KEYS = [f"k{i}" for i in range(60)]
NAMESPACES = (VOID_NAMESPACE, 7)
ACTIONS = ("checkpoint", "cancelled", "overlapping", "savepoint", "claim-again")

Model = dict[tuple[str, str, Any], Any]


def change(subtasks: list[SubtaskState], model: Model, rnd: random.Random) -> None:
    """Up to 25 random writes, applied to the backends and to ``model`` alike."""
    for _ in range(rnd.choice((0, 25))):
        key, ns, d = rnd.choice(KEYS), rnd.choice(NAMESPACES), rnd.choice(DESCRIPTORS)
        b = owner(subtasks, key)
        b.set_current_key(key)
        state = b.get_state(d)
        state.set_current_namespace(ns)
        slot, r = (d.name, key, ns), rnd.random()
        if r < 0.15:
            state.clear()
            model.pop(slot, None)
        elif d is NUMBER:
            model[slot] = rnd.randint(0, 3)
            state.update(model[slot])
        elif d is DOC:
            doc = state.value()
            if doc is not None and r < 0.5:
                doc["n"] = doc.get("n", 0) + 1  # mutated in place, then written back
            else:
                doc = {"n": rnd.randint(0, 2)}
            state.update(doc)
            model[slot] = copy.deepcopy(doc)
        elif d is NAMES:
            if r < 0.3:
                model[slot] = [rnd.choice("abc") for _ in range(rnd.randint(0, 3))]
                state.update(model[slot])
            else:
                name = rnd.choice("abcd")
                state.add(name)
                model.setdefault(slot, []).append(name)
        else:
            entry = rnd.choice("abcd")
            if r < 0.35:
                state.remove(entry)
                model.setdefault(slot, {}).pop(entry, None)
            else:
                value = rnd.randint(0, 3)
                state.put(entry, value)
                model.setdefault(slot, {})[entry] = value
        state.set_current_namespace(VOID_NAMESPACE)


def expected(model: Model) -> Model:
    return copy.deepcopy({slot: v for slot, v in model.items() if v not in (None, [], {})})


def observe(subtasks: list[SubtaskState]) -> Model:
    out: Model = {}
    for key in KEYS:
        b = owner(subtasks, key)
        b.set_current_key(key)
        for d in DESCRIPTORS:
            state = b.get_state(d)
            for ns in NAMESPACES:
                state.set_current_namespace(ns)
                if d is NAMES:
                    v: Any = state.get()
                elif d is COUNTS:
                    v = dict(state.items())
                else:
                    v = state.value()
                state.set_current_namespace(VOID_NAMESPACE)
                if v not in (None, [], {}):
                    out[(d.name, key, ns)] = copy.deepcopy(v)
    return out


@settings(
    max_examples=8,
    deadline=None,
    # the catalog and storage are shared by the examples; each runs its own job in them
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rnd=st.randoms(use_true_random=False),
    actions=st.lists(st.sampled_from(ACTIONS), min_size=3, max_size=8),
    chain_in_flight=st.booleans(),
    full_every=st.sampled_from((1, 2, 8)),
    fork_writer=st.booleans(),
)
def test_a_claimed_delta_chain_restores_to_the_model_after_anything(
    catalog,
    storage,
    tmp_path: Path,
    rnd: random.Random,
    actions: list[str],
    chain_in_flight: bool,
    full_every: int,
    fork_writer: bool,
) -> None:
    job, base = f"claim-{uuid.uuid4().hex[:8]}", tmp_path / uuid.uuid4().hex[:8]
    model: Model = {}

    def manager(**kw: Any) -> CheckpointManager:
        return CheckpointManager(
            catalog, storage, job, max_parallelism=128, parallelism=2, format="delta", **kw
        )

    def claim(m: CheckpointManager, snapshot_id: int) -> list[SubtaskState]:
        got = m.restore(
            snapshot_id,
            parallelism=2,
            factory=factory("heap", base, track_changes=True),
            mode=RestoreMode.CLAIM,
        )
        assert observe(got.subtasks) == expected(model)
        return got.subtasks

    subtasks = make_job("heap", base, 2, track_changes=True)
    with manager(fork_writer=False) as first:
        for _ in range(rnd.randint(1, 4)):
            change(subtasks, model, rnd)
            last = first.trigger(subtasks).result()
    close(subtasks)

    # restores on a manager of their own: a restore resets the manager it runs on
    with manager(fork_writer=False) as reader:

        def check(snapshot_id: int, want: Model) -> None:
            for parallelism in (1, 3):
                got = reader.restore(
                    snapshot_id, parallelism=parallelism, factory=factory("heap", base)
                )
                assert observe(got.subtasks) == want, f"snapshot {snapshot_id} at p={parallelism}"
                close(got.subtasks)

        with manager(
            retained=3,
            chain_in_flight=chain_in_flight,
            full_every=full_every,
            fork_writer=fork_writer,
        ) as m:
            subtasks = claim(m, last.id)
            for action in actions:
                change(subtasks, model, rnd)
                gate = threading.Event()
                if action == "cancelled":
                    m._executor.submit(gate.wait)  # the checkpoint thread is busy: cancel in time
                    lost = m.trigger(subtasks)
                    assert lost.cancel()
                    gate.set()
                    with pytest.raises(SnapshotCancelled):
                        lost.result()
                elif action == "overlapping":
                    m._executor.submit(gate.wait)
                    one, want_one = m.trigger(subtasks), expected(model)
                    change(subtasks, model, rnd)
                    two, want_two = m.trigger(subtasks), expected(model)
                    gate.set()
                    check(one.result().id, want_one)
                    check(two.result().id, want_two)
                elif action == "savepoint":
                    directory = storage.url_of(f"{job}-savepoints/{uuid.uuid4().hex[:8]}")
                    done = m.trigger(subtasks, kind="SAVEPOINT", savepoint_dir=directory)
                    check(done.result().id, expected(model))
                else:
                    record = m.trigger(subtasks).result()
                    check(record.id, expected(model))
                    if action == "claim-again":
                        close(subtasks)
                        subtasks = claim(m, record.id)
            close(subtasks)
