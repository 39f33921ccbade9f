"""What a native restore hands the factory whose format it is: the backend to build and the old
subtasks' native files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from state_engine.keygroups import KeyGroupRange
from state_engine.snapshot.metadata import SnapshotMetadata, SubtaskSnapshot
from state_engine.snapshot.registry import SharedStateRegistry
from state_engine.snapshot.storage import ReadStats, SnapshotDir
from state_engine.state.ttl import Clock


class BackendSpec(NamedTuple):
    """One new subtask's keyed backend, as a factory's ``create`` takes it."""

    operator_uid: str
    subtask_index: int
    key_serializer: Any
    max_parallelism: int
    key_group_range: KeyGroupRange
    clock: Clock | None


@dataclass
class NativeSource:
    """The native files of one old subtask in a snapshot, and where reading them is counted."""

    snapshot: SnapshotDir
    metadata: SnapshotMetadata
    subtask: SubtaskSnapshot
    stats: ReadStats
    #: learns the checksums of the shared files downloaded, so the next incremental checkpoint
    #: of the restored backend references them instead of reading them again (None: no
    #: checkpoints follow, e.g. a Spark task reading the rows)
    registry: SharedStateRegistry | None = None

    @property
    def key_group_range(self) -> KeyGroupRange:
        return KeyGroupRange.of(*self.subtask.key_group_range)
