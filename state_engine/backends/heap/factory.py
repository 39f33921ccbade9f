"""Makes heap backends for a job's subtasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from state_engine.backends.heap.backend import HeapKeyedStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.state.ttl import Clock

if TYPE_CHECKING:
    from collections.abc import Sequence

    from state_engine.snapshot.native import BackendSpec, NativeSource


class HeapBackendFactory:
    """Heap backends; ``track_changes`` for heap delta checkpoints."""

    kind = "heap"

    def __init__(self, *, track_changes: bool = False) -> None:
        self.track_changes = track_changes

    def create(
        self,
        operator_uid: str,
        subtask_index: int,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            key_serializer,
            max_parallelism,
            key_group_range,
            clock,
            track_changes=self.track_changes,
        )

    def restore_native(
        self, spec: BackendSpec, sources: Sequence[NativeSource]
    ) -> HeapKeyedStateBackend:
        """A heap backend holding the rows of its key groups from a native (RocksDB) snapshot's
        DBs, each opened aside and read as canonical rows (the bridge)."""
        from state_engine.backends.rocksdb.restore import insert_rows

        return insert_rows(self.create(*spec), sources, spec.key_serializer)
