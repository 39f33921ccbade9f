"""What a snapshot takes from a running job and gives back on restore.

:class:`SubtaskState` is one subtask's backends (keyed and operator state, per operator uid);
a :class:`StateBackendFactory` makes keyed backends for restored subtasks (each backend package
has one: ``HeapBackendFactory``, ``RocksDBBackendFactory``), and a :class:`NativeRestoreFactory`
also restores them from a native snapshot's files; :class:`RestoreMode` decides who owns the
restored snapshot (Flink's CLAIM / NO_CLAIM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.snapshot.native import BackendSpec, NativeSource
from state_engine.snapshot.storage import ReadStats
from state_engine.state.ttl import Clock

if TYPE_CHECKING:
    from state_engine.catalog.records import SnapshotRecord


@dataclass
class SubtaskState:
    """The state of one subtask: per operator uid, its keyed and its operator-state backend."""

    subtask_index: int
    keyed: dict[str, KeyedStateBackend] = field(default_factory=dict)
    operator: dict[str, OperatorStateBackend] = field(default_factory=dict)


class RestoreMode(Enum):
    """Who owns the restored snapshot (Flink's ``RestoreMode``).

    ``CLAIM``: the new job owns it; it is subsumed (and its files released) like the job's own
    checkpoints, and incremental checkpoints may reference its shared files.
    ``NO_CLAIM``: the snapshot stays the user's; nothing of it is ever deleted, and the first new
    checkpoint is a full one, so no new checkpoint depends on its files.
    """

    CLAIM = "CLAIM"
    NO_CLAIM = "NO_CLAIM"


@dataclass
class RestoredState:
    """The result of a restore: the snapshot it came from and the subtasks at the new parallelism.

    ``read_stats[i]`` is what subtask ``i`` read from storage (bytes, files, row groups).
    """

    snapshot: SnapshotRecord
    checkpoint_id: int
    subtasks: list[SubtaskState]
    read_stats: list[ReadStats]
    location: str


@runtime_checkable
class StateBackendFactory(Protocol):
    """Makes the keyed backend of one subtask of one operator."""

    kind: str  # "heap" | "rocksdb"

    def create(
        self,
        operator_uid: str,
        subtask_index: int,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None,
    ) -> KeyedStateBackend: ...


@runtime_checkable
class NativeRestoreFactory(StateBackendFactory, Protocol):
    """A factory that also restores a subtask's backend from a native snapshot's files: the
    old subtasks' ``sources`` that overlap the spec's key groups (RocksDB opens the best one in
    place; the heap reads them as rows)."""

    def restore_native(
        self, spec: BackendSpec, sources: Sequence[NativeSource]
    ) -> KeyedStateBackend: ...
