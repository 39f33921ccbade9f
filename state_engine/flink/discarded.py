"""Telling the ``_metadata`` of a discarded Flink snapshot from a new one at the same place.

A DISCARDED catalog snapshot pins nothing, so whatever its ``_metadata`` references may be
deleted. That is only right while the ``_metadata`` at its location is the very file that was
discarded: an expire killed between discarding and deleting leaves it behind, and the next run
finishes the job. A ``_metadata`` written there since (a job restarted under the same Flink job
id counts its checkpoint ids from 1 again) or one that was absent when the snapshot was marked
vanished and is back now is a live checkpoint, and must pin its files.

So when expire discards a snapshot it records, in the snapshot's ``details``, the size,
modification and (on local storage) inode change time of its ``_metadata``
(:func:`expired_details`): a file written since has a later change time even when it is a copy
with the old modification time, and on object stores every write is a new modification time.
:func:`is_discarded_metadata` says whether a ``_metadata`` on storage is that file. A snapshot
discarded without this stamp (marked vanished, its ``_metadata`` gone) has no file left to
match: any ``_metadata`` at its location is a new one, imported as a new snapshot with the same
checkpoint id (the catalog's checkpoint ids are unique among the snapshots that are not
DISCARDED).
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
