"""Telling the ``_metadata`` of a discarded Flink snapshot from a new one at the same place.

A DISCARDED snapshot pins nothing, which is right only while the ``_metadata`` at its location is
the very file discarded (an expire killed between discarding and deleting leaves it behind). One
written there since (a job restarted under the same Flink job id) is a live checkpoint. So expire
records the file's size, modification and (locally) inode change time in the snapshot's
``details`` (:func:`expired_details`), and :func:`is_discarded_metadata` compares: a copy keeps
its modification time but not its change time, and on object stores every write is a new
modification time. See ``docs/operations.md``, "Import and sync".
"""

from __future__ import annotations

import os
from typing import Any

from state_engine.catalog.records import SnapshotRecord
from state_engine.snapshot.storage import FileStore

#: a ``_metadata``'s (size in bytes, modification time, change time), times in epoch seconds
Stamp = tuple[int, float, float]

#: the key of ``details`` that holds the stamp
DISCARDED_METADATA = "discarded_metadata"


def metadata_stamp(store: FileStore, path: str) -> Stamp | None:
    """The stamp of the ``_metadata`` at ``path``; None if it is gone or the store does not say
    when it was modified (such a file can never be matched: it is treated as new, kept)."""
    try:
        if store.is_local:
            st = os.stat(path)
            return st.st_size, st.st_mtime, st.st_ctime
        modified = store.modified(path)
        size = store.size(path)
    except OSError:  # FileNotFoundError included
        return None
    return None if modified is None else (size, modified.timestamp(), modified.timestamp())


def expired_details(stamp: Stamp | None) -> dict[str, Any] | None:
    """The ``details`` an expired snapshot is discarded with: what its ``_metadata`` was."""
    if stamp is None:
        return None
    size, modified, changed = stamp
    return {DISCARDED_METADATA: {"size": size, "modified": modified, "changed": changed}}


def discarded_stamp(snap: SnapshotRecord) -> Stamp | None:
    """The stamp of the ``_metadata`` ``snap`` was discarded with (None: none recorded)."""
    stamp = (snap.details or {}).get(DISCARDED_METADATA)
    if not isinstance(stamp, dict):
        return None
    return int(stamp["size"]), float(stamp["modified"]), float(stamp["changed"])


def is_discarded_metadata(snap: SnapshotRecord, stamp: Stamp | None) -> bool:
    """Whether the ``_metadata`` with ``stamp`` at ``snap``'s location is the one discarded."""
    return stamp is not None and discarded_stamp(snap) == stamp
