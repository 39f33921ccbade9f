"""The job-side half of Flink's SharedStateRegistry: which shared files may be referenced again.

The catalog is the authority on references (created by, last used by, live references) and says
which files are releasable; this registry only remembers which shared files the job's own
completed checkpoints (or, under CLAIM, the restored one) hold in storage, so an incremental
checkpoint references them instead of uploading them again. A file leaves the registry when it is
deleted, so it is never referenced after that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from state_engine.snapshot.metadata import SnapshotFile


class SharedStateRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, SnapshotFile] = {}
        # (DB directory, SST name, size) -> checksum: an SST name is never reused within one DB,
        # so a file seen once need not be read again to learn its content name
        self._checksums: dict[tuple[str, str, int], str] = {}

    def lookup(self, path: str) -> SnapshotFile | None:
        """The stored file at snapshot-relative ``path`` (``../shared/...``), if reusable."""
        with self._lock:
            return self._files.get(path)

    def register(self, files: Iterable[SnapshotFile]) -> None:
        """Shared files of a completed snapshot this job owns."""
        with self._lock:
            for f in files:
                if f.shared:
                    self._files[f.path] = f

    def forget(self, paths: Iterable[str]) -> None:
        with self._lock:
            for p in paths:
                self._files.pop(p, None)

    def clear(self) -> None:
        """Reference nothing that exists now (NO_CLAIM: the next checkpoint is a full one)."""
        with self._lock:
            self._files.clear()

    def remember_checksum(self, db: str, name: str, size: int, checksum: str) -> None:
        with self._lock:
            self._checksums[(db, name, size)] = checksum

    def local_checksum(self, db: str, name: str, size: int, compute: Callable[[], str]) -> str:
        key = (db, name, size)
        with self._lock:
            known = self._checksums.get(key)
        if known is None:
            known = compute()
            with self._lock:
                self._checksums[key] = known
        return known

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)

    def paths(self) -> set[str]:
        with self._lock:
            return set(self._files)
