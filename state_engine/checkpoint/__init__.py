"""Taking and restoring snapshots: the checkpoint manager, restore, the committer, the writer lease.

:class:`CheckpointManager` runs each keyed backend's snapshot strategy in two phases for a job's
subtasks, commits every snapshot through one committer (``commit.py``: files, then ``_metadata``,
then the catalog's compare-and-swap) and restores any completed one at any parallelism. What a
snapshot is on storage (``CheckpointStorage``, ``SnapshotMetadata``, the canonical and delta
formats) is the layer below, :mod:`state_engine.snapshot`; every name it exports is exported here
too, as it was when those modules lived in this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from state_engine import snapshot
from state_engine.lazy import lazy_exports

# Re-exports load on first use: importing this package must not pull in the catalog,
# SQLAlchemy, pyarrow or the state backends.
_EXPORTS = {
    "CheckpointManager": "state_engine.checkpoint.manager",
    "HeapBackendFactory": "state_engine.backends.heap",
    "PendingSnapshot": "state_engine.checkpoint.manager",
    "RestoreMode": "state_engine.checkpoint.state",
    "RestoredState": "state_engine.checkpoint.state",
    "RocksDBBackendFactory": "state_engine.backends.rocksdb",
    "SnapshotFormat": "state_engine.snapshot_enums",
    "SnapshotKind": "state_engine.snapshot_enums",
    "SnapshotStats": "state_engine.checkpoint.manager",
    "SnapshotStatus": "state_engine.snapshot_enums",
    "StateBackendFactory": "state_engine.checkpoint.state",
    "StateEntry": "state_engine.state.meta",
    "SubtaskState": "state_engine.checkpoint.state",
    **dict.fromkeys(snapshot.__all__, "state_engine.snapshot"),
}

if TYPE_CHECKING:
    from state_engine.backends.heap import HeapBackendFactory
    from state_engine.backends.rocksdb import RocksDBBackendFactory
    from state_engine.checkpoint.manager import CheckpointManager, PendingSnapshot, SnapshotStats
    from state_engine.checkpoint.state import (
        RestoredState,
        RestoreMode,
        StateBackendFactory,
        SubtaskState,
    )
    from state_engine.snapshot import *  # noqa: F403  # every name of the snapshot layer
    from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus
    from state_engine.state.meta import StateEntry

__all__ = [
    "CheckpointManager",
    "HeapBackendFactory",
    "PendingSnapshot",
    "RestoreMode",
    "RestoredState",
    "RocksDBBackendFactory",
    "SnapshotFormat",
    "SnapshotKind",
    "SnapshotStats",
    "SnapshotStatus",
    "StateBackendFactory",
    "StateEntry",
    "SubtaskState",
]
__all__ += snapshot.__all__

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
