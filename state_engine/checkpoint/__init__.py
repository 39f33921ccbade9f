"""Snapshot storage and formats: where snapshot files live, ``_metadata``, canonical Parquet.

The strategies on top (canonical, delta, native snapshots of the keyed backends) write their
files through :class:`CheckpointStorage` / :class:`SnapshotDir`, describe them in a
:class:`SnapshotMetadata` and commit it last with :func:`write_metadata`.
:class:`CheckpointManager` runs them in two phases for a job's subtasks, registers every snapshot
in the catalog and restores any completed one at any parallelism.
"""

from state_engine.checkpoint.canonical import (
    KEYED_SCHEMA,
    OPERATOR_SCHEMA,
    CanonicalWriter,
    KeyGroupStats,
    OperatorStateEntry,
    StateEntry,
    WrittenFiles,
    read_entries,
    read_key_groups,
    read_operator_state,
    write_operator_state,
)
from state_engine.checkpoint.delta import DELTA_SCHEMA, DeltaEntry, DeltaWriter, fold, read_folded
from state_engine.checkpoint.manager import CheckpointManager, PendingSnapshot, SnapshotStats
from state_engine.checkpoint.metadata import (
    FORMAT_VERSION,
    FileKind,
    KeyGroupRun,
    OperatorSnapshot,
    SnapshotFile,
    SnapshotFormat,
    SnapshotKind,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
    verify,
    write_metadata,
)
from state_engine.checkpoint.registry import SharedStateRegistry
from state_engine.checkpoint.state import (
    HeapBackendFactory,
    RestoredState,
    RestoreMode,
    RocksDBBackendFactory,
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
