"""What a snapshot is on storage: where its files live, ``_metadata``, the canonical and delta
formats, the shared-file registry and the strategy protocol a backend's snapshots go through.

The layer below ``checkpoint`` (which takes, commits and restores snapshots) and below the
backends (which write their state through it); it imports neither, nor the catalog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from state_engine.lazy import lazy_exports

# Re-exports load on first use: ``import state_engine.snapshot.storage`` (every Spark executor
# does) must not load pyarrow or the other formats through this package.
_EXPORTS = {
    "DELTA_SCHEMA": "state_engine.snapshot.delta",
    "FORMAT_VERSION": "state_engine.snapshot.metadata",
    "KEYED_SCHEMA": "state_engine.snapshot.canonical",
    "OPERATOR_SCHEMA": "state_engine.snapshot.canonical",
    "BackendSpec": "state_engine.snapshot.native",
    "CanonicalSnapshotStrategy": "state_engine.snapshot.strategy",
    "CanonicalWriter": "state_engine.snapshot.canonical",
    "Capture": "state_engine.snapshot.strategy",
    "CheckpointStorage": "state_engine.snapshot.storage",
    "ClaimingStrategy": "state_engine.snapshot.strategy",
    "DeltaEntry": "state_engine.snapshot.delta",
    "DeltaWriter": "state_engine.snapshot.delta",
    "FileInfo": "state_engine.snapshot.storage",
    "FileKind": "state_engine.snapshot.metadata",
    "KeyGroupRun": "state_engine.snapshot.metadata",
    "KeyGroupStats": "state_engine.snapshot.canonical",
    "NativeSource": "state_engine.snapshot.native",
    "OperatorSnapshot": "state_engine.snapshot.metadata",
    "OperatorStateEntry": "state_engine.snapshot.canonical",
    "OperatorStateRow": "state_engine.snapshot.operator_rows",
    "ReadStats": "state_engine.snapshot.storage",
    "SharedStateRegistry": "state_engine.snapshot.registry",
    "SnapshotDir": "state_engine.snapshot.storage",
    "SnapshotFile": "state_engine.snapshot.metadata",
    "SnapshotMetadata": "state_engine.snapshot.metadata",
    "SnapshotStrategy": "state_engine.snapshot.strategy",
    "StoredFile": "state_engine.snapshot.storage",
    "SubtaskResult": "state_engine.snapshot.strategy",
    "SubtaskSnapshot": "state_engine.snapshot.metadata",
    "WriteContext": "state_engine.snapshot.strategy",
    "WrittenFiles": "state_engine.snapshot.canonical",
    "fold": "state_engine.snapshot.delta",
    "read_entries": "state_engine.snapshot.canonical",
    "read_folded": "state_engine.snapshot.delta",
    "read_key_groups": "state_engine.snapshot.canonical",
    "read_metadata": "state_engine.snapshot.metadata",
    "read_operator_state": "state_engine.snapshot.canonical",
    "validate_job_name": "state_engine.snapshot.storage",
    "verify": "state_engine.snapshot.metadata",
    "write_metadata": "state_engine.snapshot.metadata",
    "write_operator_state": "state_engine.snapshot.canonical",
}

if TYPE_CHECKING:
    from state_engine.snapshot.canonical import (
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
    from state_engine.snapshot.delta import DELTA_SCHEMA, DeltaEntry, DeltaWriter, fold, read_folded
    from state_engine.snapshot.metadata import (
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
    from state_engine.snapshot.native import BackendSpec, NativeSource
    from state_engine.snapshot.operator_rows import OperatorStateRow
    from state_engine.snapshot.registry import SharedStateRegistry
    from state_engine.snapshot.storage import (
        CheckpointStorage,
        FileInfo,
        ReadStats,
        SnapshotDir,
        StoredFile,
        validate_job_name,
    )
    from state_engine.snapshot.strategy import (
        CanonicalSnapshotStrategy,
        Capture,
        ClaimingStrategy,
        SnapshotStrategy,
        SubtaskResult,
        WriteContext,
    )

__all__ = [
    "DELTA_SCHEMA",
    "FORMAT_VERSION",
    "KEYED_SCHEMA",
    "OPERATOR_SCHEMA",
    "BackendSpec",
    "CanonicalSnapshotStrategy",
    "CanonicalWriter",
    "Capture",
    "CheckpointStorage",
    "ClaimingStrategy",
    "DeltaEntry",
    "DeltaWriter",
    "FileInfo",
    "FileKind",
    "KeyGroupRun",
    "KeyGroupStats",
    "NativeSource",
    "OperatorSnapshot",
    "OperatorStateEntry",
    "OperatorStateRow",
    "ReadStats",
    "SharedStateRegistry",
    "SnapshotDir",
    "SnapshotFile",
    "SnapshotMetadata",
    "SnapshotStrategy",
    "StoredFile",
    "SubtaskResult",
    "SubtaskSnapshot",
    "WriteContext",
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
