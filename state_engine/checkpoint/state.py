"""What a snapshot takes from a running job and gives back on restore.

:class:`SubtaskState` is one subtask's backends (keyed and operator state, per operator uid);
a :class:`StateBackendFactory` makes keyed backends for restored subtasks; :class:`RestoreMode`
decides who owns the restored snapshot (Flink's CLAIM / NO_CLAIM).
"""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.checkpoint.storage import ReadStats
from state_engine.keygroups import KeyGroupRange
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


def _accepts(cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


class HeapBackendFactory:
    """Heap backends; ``track_changes`` (for heap delta checkpoints) when the backend offers it."""

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
        kwargs: dict[str, Any] = {}
        if self.track_changes and _accepts(HeapKeyedStateBackend, "track_changes"):
            kwargs["track_changes"] = True
        return HeapKeyedStateBackend(
            key_serializer, max_parallelism, key_group_range, clock, **kwargs
        )


_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


class RocksDBBackendFactory:
    """RocksDB backends, each in a fresh directory under ``base_dir``.

    :meth:`open_restored` opens a backend over DB files a restore puts in place (native
    snapshots): ``fill`` is called with the empty ``db`` directory before the DB is opened.
    """

    kind = "rocksdb"

    def __init__(self, base_dir: str | Path) -> None:
        self.base_dir = Path(base_dir)

    def new_path(self, operator_uid: str, subtask_index: int) -> Path:
        # A fresh directory per backend: a restore never opens the files of a live backend.
        safe = _UNSAFE.sub("_", operator_uid)[:80]
        path = self.base_dir / f"{safe}-{subtask_index}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True, exist_ok=False)
        return path

    def create(
        self,
        operator_uid: str,
        subtask_index: int,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> KeyedStateBackend:
        from state_engine.backends.rocksdb import RocksDBKeyedStateBackend

        path = self.new_path(operator_uid, subtask_index)
        return RocksDBKeyedStateBackend(
            path, key_serializer, max_parallelism, key_group_range, clock
        )

    def open_restored(
        self,
        operator_uid: str,
        subtask_index: int,
        key_serializer: Any,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None,
        fill: Callable[[Path], None],
    ) -> KeyedStateBackend:
        from state_engine.backends.rocksdb import RocksDBKeyedStateBackend

        path = self.new_path(operator_uid, subtask_index)
        db = path / "db"
        db.mkdir()
        fill(db)
        return RocksDBKeyedStateBackend(
            path, key_serializer, max_parallelism, key_group_range, clock
        )
