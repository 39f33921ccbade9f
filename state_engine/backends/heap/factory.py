"""Makes heap backends for a job's subtasks."""

from __future__ import annotations

from typing import Any

from state_engine.backends.heap.backend import HeapKeyedStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.state.ttl import Clock


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
