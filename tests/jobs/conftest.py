"""Maintenance-job fixtures: a migrated SQLite catalog and real job state in canonical snapshots.

The state comes from the heap backend (real descriptors, serializers and TTL on a manual clock),
exported through snapshot views and written with ``CanonicalWriter``, then committed through the
catalog like any snapshot (see jobdata.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobdata import MadeSnapshot, make_snapshot

from state_engine.catalog import Catalog, upgrade
from state_engine.checkpoint.storage import CheckpointStorage


@pytest.fixture(scope="session")
def catalog_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jobs-catalog") / "catalog.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def catalog_url(catalog_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "catalog.db"
    shutil.copyfile(catalog_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def catalog(catalog_url: str) -> Iterator[Catalog]:
    with Catalog.open(catalog_url) as cat:
        yield cat


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage((tmp_path / "checkpoints").as_uri())


@pytest.fixture
def snapshot(catalog: Catalog, storage: CheckpointStorage) -> MadeSnapshot:
    return make_snapshot(catalog, storage)
