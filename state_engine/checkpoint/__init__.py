"""Taking and restoring snapshots: the checkpoint manager, restore, the committer, the writer lease.

:class:`CheckpointManager` runs each keyed backend's snapshot strategy in two phases for a job's
subtasks, commits every snapshot through one committer (``commit.py``: files, then ``_metadata``,
then the catalog's compare-and-swap) and restores any completed one at any parallelism. What a
snapshot is on storage (``CheckpointStorage``, ``SnapshotMetadata``, the canonical and delta
formats) is the layer below, :mod:`state_engine.snapshot`; its names are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from state_engine.lazy import lazy_exports

# Re-exports load on first use: importing this package must not pull in the catalog,
# SQLAlchemy, pyarrow or the state backends.
_EXPORTS = {
    "DELTA_SCHEMA": "state_engine.snapshot",
    "FORMAT_VERSION": "state_engine.snapshot",
    "KEYED_SCHEMA": "state_engine.snapshot",
    "OPERATOR_SCHEMA": "state_engine.snapshot",
    "CanonicalWriter": "state_engine.snapshot",
    "CheckpointManager": "state_engine.checkpoint.manager",
    "CheckpointStorage": "state_engine.snapshot",
    "DeltaEntry": "state_engine.snapshot",
    "DeltaWriter": "state_engine.snapshot",
    "FileInfo": "state_engine.snapshot",
    "FileKind": "state_engine.snapshot",
    "HeapBackendFactory": "state_engine.backends.heap",
    "KeyGroupRun": "state_engine.snapshot",
    "KeyGroupStats": "state_engine.snapshot",
    "OperatorSnapshot": "state_engine.snapshot",
    "OperatorStateEntry": "state_engine.snapshot",
    "PendingSnapshot": "state_engine.checkpoint.manager",
    "ReadStats": "state_engine.snapshot",
    "RestoreMode": "state_engine.checkpoint.state",
    "RestoredState": "state_engine.checkpoint.state",
    "RocksDBBackendFactory": "state_engine.backends.rocksdb",
    "SharedStateRegistry": "state_engine.snapshot",
    "SnapshotDir": "state_engine.snapshot",
    "SnapshotFile": "state_engine.snapshot",
    "SnapshotFormat": "state_engine.snapshot_enums",
    "SnapshotKind": "state_engine.snapshot_enums",
    "SnapshotMetadata": "state_engine.snapshot",
    "SnapshotStats": "state_engine.checkpoint.manager",
    "SnapshotStatus": "state_engine.snapshot_enums",
    "StateBackendFactory": "state_engine.checkpoint.state",
    "StateEntry": "state_engine.state.meta",
    "StoredFile": "state_engine.snapshot",
    "SubtaskSnapshot": "state_engine.snapshot",
    "SubtaskState": "state_engine.checkpoint.state",
    "WrittenFiles": "state_engine.snapshot",
    "fold": "state_engine.snapshot",
    "read_entries": "state_engine.snapshot",
    "read_folded": "state_engine.snapshot",
    "read_key_groups": "state_engine.snapshot",
    "read_metadata": "state_engine.snapshot",
    "read_operator_state": "state_engine.snapshot",
    "validate_job_name": "state_engine.snapshot",
    "verify": "state_engine.snapshot",
    "write_metadata": "state_engine.snapshot",
    "write_operator_state": "state_engine.snapshot",
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
    from state_engine.snapshot import (
        DELTA_SCHEMA,
        FORMAT_VERSION,
        KEYED_SCHEMA,
        OPERATOR_SCHEMA,
        CanonicalWriter,
        CheckpointStorage,
        DeltaEntry,
        DeltaWriter,
        FileInfo,
        FileKind,
        KeyGroupRun,
        KeyGroupStats,
        OperatorSnapshot,
        OperatorStateEntry,
        ReadStats,
        SharedStateRegistry,
        SnapshotDir,
        SnapshotFile,
        SnapshotMetadata,
        StoredFile,
        SubtaskSnapshot,
        WrittenFiles,
        fold,
        read_entries,
        read_folded,
        read_key_groups,
        read_metadata,
        read_operator_state,
        validate_job_name,
        verify,
        write_metadata,
        write_operator_state,
    )
    from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind, SnapshotStatus
    from state_engine.state.meta import StateEntry

__all__ = [
    "DELTA_SCHEMA",
    "FORMAT_VERSION",
    "KEYED_SCHEMA",
    "OPERATOR_SCHEMA",
    "CanonicalWriter",
    "CheckpointManager",
    "CheckpointStorage",
    "DeltaEntry",
    "DeltaWriter",
    "FileInfo",
    "FileKind",
    "HeapBackendFactory",
    "KeyGroupRun",
    "KeyGroupStats",
    "OperatorSnapshot",
    "OperatorStateEntry",
    "PendingSnapshot",
    "ReadStats",
    "RestoreMode",
    "RestoredState",
    "RocksDBBackendFactory",
    "SharedStateRegistry",
    "SnapshotDir",
    "SnapshotFile",
    "SnapshotFormat",
    "SnapshotKind",
    "SnapshotMetadata",
    "SnapshotStats",
    "SnapshotStatus",
    "StateBackendFactory",
    "StateEntry",
    "StoredFile",
    "SubtaskSnapshot",
    "SubtaskState",
    "WrittenFiles",
    "fold",
    "read_entries",
    "read_folded",
    "read_key_groups",
    "read_metadata",
    "read_operator_state",
    "validate_job_name",
    "verify",
    "write_metadata",
    "write_operator_state",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
