"""Real checkpoints for the deleting-job tests (expire, orphan cleanup): a small keyed job on heap
or RocksDB backends, checkpointed by a real CheckpointManager, and read back after a restore."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec.core

from state_engine.backends.heap import HeapBackendFactory
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.backends.rocksdb import RocksDBBackendFactory
from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.state import SubtaskState
from state_engine.keygroups import assign_to_key_group, compute_key_group_range_for_operator_index
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.state import MapStateDescriptor, ValueStateDescriptor

JOB = "payments"
MAX_P = 128
OP = "agg"
COUNT = ValueStateDescriptor("count", int)
TAGS = MapStateDescriptor("tags", str, int)
KEYS = [f"card-{i}" for i in range(40)]


def factory(kind: str, base: Path) -> Any:
    if kind == "heap":
        return HeapBackendFactory(track_changes=True)
    return RocksDBBackendFactory(base)


def make_subtasks(kind: str, base: Path, parallelism: int = 2) -> list[SubtaskState]:
    f = factory(kind, base)
    out = []
    for i in range(parallelism):
        rng = compute_key_group_range_for_operator_index(MAX_P, parallelism, i)
        st = SubtaskState(i)
        st.keyed[OP] = f.create(OP, i, str, MAX_P, rng, None)
        st.operator["source"] = OperatorStateBackend(i, parallelism)
        st.operator["source"].get_list_state("offsets", int).add(i)
        out.append(st)
    return out


def _owner(subtasks: list[SubtaskState], key: str) -> Any:
    kg = assign_to_key_group(key, MAX_P)
    return next(st.keyed[OP] for st in subtasks if kg in st.keyed[OP].key_group_range)


def apply(subtasks: list[SubtaskState], round_: int, keys: list[str] = KEYS) -> None:
    for i, k in enumerate(keys):
        b = _owner(subtasks, k)
        b.set_current_key(k)
        b.get_state(COUNT).update(round_ * 1000 + i)
        b.get_state(TAGS).put(f"r{round_}", i)


def observe(subtasks: list[SubtaskState], keys: list[str] = KEYS) -> dict[str, Any]:
    out = {}
    for k in keys:
        b = _owner(subtasks, k)
        b.set_current_key(k)
        out[k] = (b.get_state(COUNT).value(), sorted(b.get_state(TAGS).items()))
    return out


def close(subtasks: list[SubtaskState]) -> None:
    for st in subtasks:
        for b in st.keyed.values():
            b.close()


def manager(
    catalog: Catalog, storage: CheckpointStorage, fmt: str = "canonical", **kw: Any
) -> CheckpointManager:
    kw.setdefault("retained", 20)  # the jobs under test decide retention, not the manager
    return CheckpointManager(
        catalog,
        storage,
        JOB,
        max_parallelism=MAX_P,
        parallelism=2,
        format=fmt,
        row_group_bytes=2048,
        incremental=fmt != "canonical",
        **kw,
    )


def checkpoints(
    m: CheckpointManager, subtasks: list[SubtaskState], n: int, start: int = 0
) -> tuple[list[SnapshotRecord], list[dict[str, Any]]]:
    """``n`` COMPLETED checkpoints, the state changing before each; records and their states."""
    records, states = [], []
    for r in range(start, start + n):
        apply(subtasks, r)
        states.append(observe(subtasks))
        records.append(m.trigger(subtasks).result())
    return records, states


def restored_state(m: CheckpointManager, snapshot_id: int, base: Path) -> dict[str, Any]:
    restored = m.restore(snapshot_id, parallelism=3, factory=HeapBackendFactory())
    try:
        return observe(restored.subtasks)
    finally:
        close(restored.subtasks)


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


def referenced_urls(catalog: Catalog, snapshot_ids: Iterator[int] | list[int]) -> set[str]:
    return {f.path for sid in snapshot_ids for f in catalog.snapshot_files(sid)}


def plant(storage: CheckpointStorage, relative: str, data: bytes = b"orphan", age_days: float = 5):
    """An unreferenced file at ``<root>/<relative>``, last modified ``age_days`` ago."""
    url = storage.url_of(relative)
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, data)
    set_age(url, age_days)
    return url


def set_age(url: str, age_days: float) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    t = (datetime.now(UTC) - timedelta(days=age_days)).timestamp()
    os.utime(path, (t, t))


def files_under(storage: CheckpointStorage, job: str = JOB) -> set[str]:
    base = storage.url_of(job).rstrip("/")
    return {f"{base}/{f.path}" for f in storage.list_files(job)}
