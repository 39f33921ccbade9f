"""Snapshot storage and formats: where snapshot files live, ``_metadata``, canonical Parquet.

The strategies on top (canonical, delta, native snapshots of the keyed backends) write their
files through :class:`CheckpointStorage` / :class:`SnapshotDir`, describe them in a
:class:`SnapshotMetadata` and commit it last with :func:`write_metadata`.
:class:`CheckpointManager` runs them in two phases for a job's subtasks, registers every snapshot
in the catalog and restores any completed one at any parallelism.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Re-exports load on first use: ``import state_engine.checkpoint.storage`` (every Spark executor
# does) must not pull in the catalog, SQLAlchemy or the state backends through this package.
_EXPORTS = {
    "CanonicalWriter": "state_engine.checkpoint.canonical",
    "CheckpointManager": "state_engine.checkpoint.manager",
    "CheckpointStorage": "state_engine.checkpoint.storage",
    "DELTA_SCHEMA": "state_engine.checkpoint.delta",
    "DeltaEntry": "state_engine.checkpoint.delta",
    "DeltaWriter": "state_engine.checkpoint.delta",
    "FORMAT_VERSION": "state_engine.checkpoint.metadata",
    "FileInfo": "state_engine.checkpoint.storage",
    "FileKind": "state_engine.checkpoint.metadata",
    "HeapBackendFactory": "state_engine.backends.heap",
    "KEYED_SCHEMA": "state_engine.checkpoint.canonical",
    "KeyGroupRun": "state_engine.checkpoint.metadata",
    "KeyGroupStats": "state_engine.checkpoint.canonical",
    "OPERATOR_SCHEMA": "state_engine.checkpoint.canonical",
    "OperatorSnapshot": "state_engine.checkpoint.metadata",
    "OperatorStateEntry": "state_engine.checkpoint.canonical",
    "PendingSnapshot": "state_engine.checkpoint.manager",
    "ReadStats": "state_engine.checkpoint.storage",
    "RestoreMode": "state_engine.checkpoint.state",
    "RestoredState": "state_engine.checkpoint.state",
    "RocksDBBackendFactory": "state_engine.backends.rocksdb",
    "SharedStateRegistry": "state_engine.checkpoint.registry",
    "SnapshotDir": "state_engine.checkpoint.storage",
    "SnapshotFile": "state_engine.checkpoint.metadata",
    "SnapshotFormat": "state_engine.snapshot_enums",
    "SnapshotKind": "state_engine.snapshot_enums",
    "SnapshotMetadata": "state_engine.checkpoint.metadata",
    "SnapshotStats": "state_engine.checkpoint.manager",
    "SnapshotStatus": "state_engine.snapshot_enums",
    "StateBackendFactory": "state_engine.checkpoint.state",
    "StateEntry": "state_engine.state.meta",
    "StoredFile": "state_engine.checkpoint.storage",
    "SubtaskSnapshot": "state_engine.checkpoint.metadata",
    "SubtaskState": "state_engine.checkpoint.state",
    "WrittenFiles": "state_engine.checkpoint.canonical",
    "fold": "state_engine.checkpoint.delta",
    "read_entries": "state_engine.checkpoint.canonical",
    "read_folded": "state_engine.checkpoint.delta",
    "read_key_groups": "state_engine.checkpoint.canonical",
    "read_metadata": "state_engine.checkpoint.metadata",
    "read_operator_state": "state_engine.checkpoint.canonical",
    "validate_job_name": "state_engine.checkpoint.storage",
    "verify": "state_engine.checkpoint.metadata",
    "write_metadata": "state_engine.checkpoint.metadata",
    "write_operator_state": "state_engine.checkpoint.canonical",
}

if TYPE_CHECKING:
    from state_engine.backends.heap import HeapBackendFactory
    from state_engine.backends.rocksdb import RocksDBBackendFactory
    from state_engine.checkpoint.canonical import (
        KEYED_SCHEMA,
        OPERATOR_SCHEMA,
        CanonicalWriter,
        KeyGroupStats,
        OperatorStateEntry,
        WrittenFiles,
        read_entries,
        read_key_groups,
        read_operator_state,
        write_operator_state,
    )
    from state_engine.checkpoint.delta import (
        DELTA_SCHEMA,
        DeltaEntry,
        DeltaWriter,
        fold,
        read_folded,
    )
    from state_engine.checkpoint.manager import CheckpointManager, PendingSnapshot, SnapshotStats
    from state_engine.checkpoint.metadata import (
        FORMAT_VERSION,
        FileKind,
        KeyGroupRun,
        OperatorSnapshot,
        SnapshotFile,
        SnapshotMetadata,
        SubtaskSnapshot,
        read_metadata,
        verify,
        write_metadata,
    )
    from state_engine.checkpoint.registry import SharedStateRegistry
    from state_engine.checkpoint.state import (
        RestoredState,
        RestoreMode,
        StateBackendFactory,
        SubtaskState,
    )
    from state_engine.checkpoint.storage import (
        CheckpointStorage,
        FileInfo,
        ReadStats,
        SnapshotDir,
        StoredFile,
        validate_job_name,
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
