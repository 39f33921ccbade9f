"""Where a catalog job's snapshots live: its checkpoint root, for the jobs that read, write or
delete them."""

from __future__ import annotations

import posixpath

from state_engine.catalog import Catalog
from state_engine.config import Settings
from state_engine.snapshot.storage import CheckpointStorage


def storage_for(catalog: Catalog, job: str, settings: Settings | None = None) -> CheckpointStorage:
    """The checkpoint root of ``job``: the parent of its registered location, else the setting."""
    record = catalog.get_job(job)
    location = (record.location or "").rstrip("/")
    if location and posixpath.basename(location) == job:
        return CheckpointStorage(location[: -len(job) - 1])
    return CheckpointStorage((settings or Settings.from_env()).checkpoint_root)
