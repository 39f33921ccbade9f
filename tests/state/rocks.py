"""A RocksDB backend over every key group of max parallelism 128, for tests of its layout."""

from __future__ import annotations

from pathlib import Path

from state_engine.backends.rocksdb import RocksDBKeyedStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.state import ManualClock

KGR = KeyGroupRange.of(0, 127)


def open_rocks(path: Path, clock: ManualClock | None = None) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(path, str, 128, KGR, clock or ManualClock(0))
