"""Maintenance-job fixtures: real job state in canonical snapshots, on a migrated SQLite catalog
(``catalog``, from tests/fixtures/catalog.py).

The state comes from the heap backend (real descriptors, serializers and TTL on a manual clock),
exported through snapshot views and written with ``CanonicalWriter``, then committed through the
catalog like any snapshot (see jobdata.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.snapshot.storage import CheckpointStorage
from tests.jobs.jobdata import MadeSnapshot, make_snapshot


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage((tmp_path / "checkpoints").as_uri())


@pytest.fixture
def snapshot(catalog: Catalog, storage: CheckpointStorage) -> MadeSnapshot:
    return make_snapshot(catalog, storage)
