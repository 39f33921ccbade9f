"""Makes RocksDB backends for a job's subtasks, each in a fresh directory."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from state_engine.backends.rocksdb.backend import RocksDBKeyedStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.state.ttl import Clock

if TYPE_CHECKING:
    from collections.abc import Sequence

    from state_engine.snapshot.native import BackendSpec, NativeSource

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


class RocksDBBackendFactory:
    """RocksDB backends, each in a fresh directory under ``base_dir``.

    :meth:`restore_native` opens a backend over a native snapshot's DB files, downloaded in place
    (the restore dispatches native snapshots to the factory it restores with).
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
    ) -> RocksDBKeyedStateBackend:
        path = self.new_path(operator_uid, subtask_index)
        return RocksDBKeyedStateBackend(
            path, key_serializer, max_parallelism, key_group_range, clock
        )

    def restore_native(
        self, spec: BackendSpec, sources: Sequence[NativeSource]
    ) -> RocksDBKeyedStateBackend:
        """A backend over the DB of the source that overlaps the spec's key groups most, holding
        only those (Flink's restore of an incremental RocksDB handle: open the DB, cut the
        foreign key groups out), with the other sources' rows of them inserted."""
        from state_engine.backends.rocksdb.restore import insert_rows, open_in_place

        wanted = spec.key_group_range
        base = max(sources, key=lambda s: len(s.key_group_range.intersection(wanted)))
        path = self.new_path(spec.operator_uid, spec.subtask_index)
        backend = open_in_place(path, spec, base)
        return insert_rows(backend, [s for s in sources if s is not base], spec.key_serializer)
