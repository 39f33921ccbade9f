"""A small keyed job's state on either backend, and how to read it back for comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.backends.rocksdb import RocksDBBackendFactory
from state_engine.checkpoint.state import StateBackendFactory, SubtaskState
from state_engine.keygroups import assign_to_key_group, compute_key_group_range_for_operator_index
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    ValueStateDescriptor,
)

MAX_P = 128
OP = "agg"
COUNT = ValueStateDescriptor("count", int)
SEEN = ListStateDescriptor("seen", str)
TAGS = MapStateDescriptor("tags", str, int)
DESCRIPTORS = (COUNT, SEEN, TAGS)


def factory(kind: str, base: Path, **kw: Any) -> StateBackendFactory:
    return HeapBackendFactory(**kw) if kind == "heap" else RocksDBBackendFactory(base)


def make_job(
    kind: str, base: Path, parallelism: int, clock: ManualClock | None = None, **kw: Any
) -> list[SubtaskState]:
    f = factory(kind, base, **kw)
    out = []
    for i in range(parallelism):
        rng = compute_key_group_range_for_operator_index(MAX_P, parallelism, i)
        st = SubtaskState(i)
        st.keyed[OP] = f.create(OP, i, str, MAX_P, rng, clock)
        st.operator["source"] = OperatorStateBackend(i, parallelism)
        out.append(st)
    return out


def owner(subtasks: list[SubtaskState], key: str) -> KeyedStateBackend:
    kg = assign_to_key_group(key, MAX_P)
    for st in subtasks:
        b = st.keyed[OP]
        if kg in b.key_group_range:
            return b
    raise AssertionError(f"no subtask owns key group {kg}")


def _states(b: KeyedStateBackend, cache: dict[int, tuple[Any, ...]]) -> tuple[Any, ...]:
    # get_state compares descriptors on every call: fetch each backend's states once
    got = cache.get(id(b))
    if got is None:
        got = cache[id(b)] = tuple(b.get_state(d) for d in DESCRIPTORS)
    return got


def apply(subtasks: list[SubtaskState], keys: list[str], round_: int = 0) -> None:
    """Write every state of ``keys`` (a later round changes and removes some)."""
    cache: dict[int, tuple[Any, ...]] = {}
    for i, k in enumerate(keys):
        b = owner(subtasks, k)
        count, seen, tags = _states(b, cache)
        b.set_current_key(k)
        count.update((count.value() or 0) + i + 1)
        seen.add(f"{k}@{round_}")
        tags.put(f"r{round_}", i)
        if round_ and i % 5 == 0:
            tags.remove("r0")
        if i % 7 == 3:
            tags.set_current_namespace(i % 3)
            tags.put("w", round_)
            tags.set_current_namespace(VOID_NAMESPACE)


def add_operator_state(subtasks: list[SubtaskState], tag: str = "") -> None:
    for st in subtasks:
        ob = st.operator["source"]
        ob.get_list_state("offsets", str).add_all(
            [f"p{st.subtask_index}-{j}{tag}" for j in range(3)]
        )
        ob.get_union_list_state("watermarks", int).add(st.subtask_index * 10)


def observe(subtasks: list[SubtaskState], keys: list[str]) -> dict[str, Any]:
    out = {}
    cache: dict[int, tuple[Any, ...]] = {}
    for i, k in enumerate(keys):
        b = owner(subtasks, k)
        count, seen, tags = _states(b, cache)
        b.set_current_key(k)
        tags.set_current_namespace(i % 3)
        w = sorted(tags.items())
        tags.set_current_namespace(VOID_NAMESPACE)
        out[k] = (count.value(), seen.get(), sorted(tags.items()), w)
    return out


def operator_view(subtasks: list[SubtaskState]) -> tuple[list[str], list[list[int]]]:
    """All SPLIT offsets (in subtask order) and each subtask's UNION list."""
    offsets: list[str] = []
    unions = []
    for st in subtasks:
        ob = st.operator["source"]
        offsets.extend(ob.get_list_state("offsets", str).get())
        unions.append(sorted(ob.get_union_list_state("watermarks", int).get()))
    return offsets, unions


def close(subtasks: list[SubtaskState]) -> None:
    for st in subtasks:
        for b in st.keyed.values():
            b.close()
