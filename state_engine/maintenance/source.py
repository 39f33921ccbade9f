"""The input snapshot's directory as a job opens it, and the format its files say.

Tasks run this module too: it loads no catalog.
"""

from __future__ import annotations

from state_engine.snapshot.metadata import NATIVE_KINDS, FileKind, SnapshotMetadata
from state_engine.snapshot.storage import SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind


def open_source(url: str, kind: str) -> SnapshotDir:
    # a savepoint never reaches outside its directory, so it is opened without shared access
    return SnapshotDir.from_url(url, allow_shared=kind != SnapshotKind.SAVEPOINT)


def snapshot_format(meta: SnapshotMetadata) -> SnapshotFormat:
    """The format the files say (a native checkpoint written by heap backends is canonical)."""
    kinds = {f.kind for f in meta.files}
    if kinds & NATIVE_KINDS:
        return SnapshotFormat.NATIVE
    if FileKind.DELTA in kinds:
        return SnapshotFormat.DELTA
    return SnapshotFormat.CANONICAL
