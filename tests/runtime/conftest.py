"""Runtime fixtures: the real heap and RocksDB backend factories, and a migrated catalog."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(params=["heap", "rocksdb"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "heap":
        return HeapBackendFactory()
    return RocksDBBackendFactory(tmp_path / "rocksdb")


@pytest.fixture(scope="session")
def catalog_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from state_engine.catalog import upgrade

    path = tmp_path_factory.mktemp("runtime-catalog") / "catalog.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def catalog(catalog_template: Path, tmp_path: Path) -> Any:
    """A migrated SQLite catalog of this test's own."""
    import shutil

    from state_engine.catalog import Catalog

    path = tmp_path / "catalog.db"
    shutil.copyfile(catalog_template, path)
    with Catalog.open(f"sqlite:///{path}") as cat:
        yield cat
