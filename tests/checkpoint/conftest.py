"""Checkpoint storage on both a local directory and fsspec's in-memory filesystem."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from state_engine.snapshot.canonical import CanonicalWriter
from state_engine.snapshot.metadata import (
    OperatorSnapshot,
    SnapshotFile,
    SnapshotMetadata,
    SubtaskSnapshot,
    write_metadata,
)
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind
from state_engine.state.meta import StateEntry


@pytest.fixture(params=["file", "memory"])
def root_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh checkpoint root URL; the memory root is removed after the test."""
    if request.param == "file":
        yield (tmp_path / "checkpoints").as_uri()
        return
    root = f"/sk-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not d.startswith(root)]


@pytest.fixture
def storage(root_url: str) -> CheckpointStorage:
    return CheckpointStorage(root_url)


def _make_rows(
    max_parallelism: int, rows_per_key_group: int, value_bytes: int = 40, seed: int = 0
) -> list[StateEntry]:
    """Evenly spread rows over every key group, sorted by key group."""
    rnd = random.Random(seed)
    rows = []
    for kg in range(max_parallelism):
        for i in range(rows_per_key_group):
            rows.append(
                StateEntry(
                    key_group=kg,
                    key_hash=rnd.randint(-(2**31), 2**31 - 1),
                    key=f"key-{kg}-{i}".encode(),
                    namespace=b"" if i % 3 else b"window-1",
                    state="counts" if i % 2 else "last_seen",
                    user_key=None if i % 2 else rnd.randbytes(6),
                    value=rnd.randbytes(value_bytes),
                    expires_at=None if i % 4 else 1_700_000_000_000 + i,
                )
            )
    return rows


MakeRows = Callable[..., list[StateEntry]]
WriteSnapshot = Callable[..., tuple[SnapshotDir, SnapshotMetadata]]


@pytest.fixture
def make_rows() -> MakeRows:
    """``make_rows(max_parallelism, rows_per_key_group, value_bytes=40, seed=0)``."""
    return _make_rows


@pytest.fixture
def write_snapshot(storage: CheckpointStorage) -> WriteSnapshot:
    """Write rows as a committed canonical snapshot with one operator, split over subtasks."""

    def write(
        rows: list[StateEntry],
        *,
        max_parallelism: int = 128,
        parallelism: int = 1,
        kind: SnapshotKind = SnapshotKind.CHECKPOINT,
        job: str = "job",
        checkpoint_id: int = 1,
        snapshot: SnapshotDir | None = None,
        **writer_options: Any,
    ) -> tuple[SnapshotDir, SnapshotMetadata]:
        if snapshot is None:
            snapshot = (
                storage.checkpoint(job, checkpoint_id)
                if kind is SnapshotKind.CHECKPOINT
                else storage.savepoint(job, checkpoint_id)
            )
        files: list[SnapshotFile] = []
        subtasks = []
        for index in range(parallelism):
            first = (index * max_parallelism + parallelism - 1) // parallelism
            last = ((index + 1) * max_parallelism - 1) // parallelism
            with CanonicalWriter(
                snapshot,
                subtask=index,
                max_parallelism=max_parallelism,
                key_group_range=(first, last),
                **writer_options,
            ) as writer:
                writer.write(r for r in rows if first <= r.key_group <= last)
            written = writer.finish()
            files.extend(written.files)
            subtasks.append(SubtaskSnapshot(index, (first, last), written.paths))
        meta = SnapshotMetadata(
            job=job,
            checkpoint_id=checkpoint_id,
            kind=kind,
            format=SnapshotFormat.CANONICAL,
            max_parallelism=max_parallelism,
            parallelism=parallelism,
            operators=(
                OperatorSnapshot(
                    operator_id="counter",
                    key_serializer={"name": "str", "version": 1},
                    states={"counts": {"kind": "value", "ttl": None}},
                    subtasks=tuple(subtasks),
                ),
            ),
            files=tuple(files),
        )
        write_metadata(snapshot, None, meta)
        return snapshot, meta

    return write
