"""Runtime fixtures: the real heap and RocksDB backend factories (the migrated SQLite ``catalog``
comes from tests/fixtures/catalog.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory


@pytest.fixture(params=["heap", "rocksdb"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "heap":
        return HeapBackendFactory()
    return RocksDBBackendFactory(tmp_path / "rocksdb")
