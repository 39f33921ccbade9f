"""Backend fixtures: every behaviour test runs on the heap and the RocksDB backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.backends.base import KeyedStateBackend
from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.keygroups import KeyGroupRange
from state_engine.state import ManualClock

BACKENDS = ["heap", "rocksdb"]


def build(
    kind: str, path: Path, clock: ManualClock, key_groups: KeyGroupRange | None = None, **kw: Any
) -> KeyedStateBackend:
    kgr = key_groups or KeyGroupRange.of(0, 127)
    if kind == "heap":
        return HeapKeyedStateBackend(str, 128, kgr, clock)
    from state_engine.backends.rocksdb import RocksDBKeyedStateBackend

    return RocksDBKeyedStateBackend(path, str, 128, kgr, clock, **kw)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000)


@pytest.fixture
def make_backend(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., KeyedStateBackend]]:
    made: list[KeyedStateBackend] = []
    counter = iter(range(1_000_000))

    def make(kind: str, key_groups: KeyGroupRange | None = None, **kw: Any) -> KeyedStateBackend:
        b = build(kind, tmp_path / f"db{next(counter)}", clock, key_groups, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def backend(backend_kind: str, make_backend: Callable[..., KeyedStateBackend]) -> KeyedStateBackend:
    return make_backend(backend_kind)
