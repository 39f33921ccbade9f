"""The RocksDB backend's write overlay: each state's unflushed point writes, in a Python dict.

A point write through rocksdict costs a memtable insert behind an FFI call; a job that reads and
writes the same few states per record paid two of them per record, and rewrote a hot row as often
as its key came by. So every state keeps an overlay, ``row key bytes -> value bytes`` (``None``: the
row was deleted), as Quix Streams keeps a per-transaction write cache: point writes and deletes go
to the dict, point reads look there first and in the DB only on a miss. The backend writes an
overlay into RocksDB in one ``WriteBatch`` (:func:`write_overlays`) before anything reads the DB
other than by point key, or needs it complete (prefix scans, checkpoints, key-group deletes,
restores, close), and whenever one overlay grows past :data:`OVERLAY_LIMIT` rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import rocksdict as rd

from state_engine.errors import StateError

#: rows an overlay holds before it is written out on its own. A checkpoint every 10k records
#: flushes far earlier; the limit bounds memory (and a flush's pause) when checkpoints are rare.
#: On the counts bench without checkpoints (10k keys), 8k rows ran 16% slower than 32k, and
#: 100k rows no faster than 32k.
OVERLAY_LIMIT = 32_768

#: unflushed rows of one column family: row key -> value bytes, or None for a deleted row
Overlay = dict[bytes, bytes | None]


class ClosedOverlay(Overlay):
    """A state's overlay once its backend closed: every use raises StateError, so a state the
    job still holds cannot write into a dict nobody will flush."""

    def __init__(self, state: str) -> None:
        super().__init__()
        self._state = state

    def refusal(self) -> StateError:
        return StateError(
            f"state {self._state!r} belongs to a closed RocksDB backend: open the backend again "
            "and get the state from it"
        )

    def __contains__(self, key: object) -> bool:
        raise self.refusal()

    def __getitem__(self, key: bytes) -> bytes | None:
        raise self.refusal()

    def __setitem__(self, key: bytes, value: bytes | None) -> None:
        raise self.refusal()

    def __len__(self) -> int:
        raise self.refusal()


def write_overlays(db: Any, overlays: Iterable[tuple[Any, Overlay]], options: Any) -> None:
    """Write every row of ``overlays`` (column-family handle, rows) to ``db`` in one batch, then
    empty them; on a failed write they keep their rows."""
    batch = rd.WriteBatch(raw_mode=True)
    written = []
    for handle, rows in overlays:
        if not rows:
            continue
        batch.set_default_column_family(handle)
        for k, v in rows.items():
            if v is None:
                batch.delete(k)
            else:
                batch.put(k, v)
        written.append(rows)
    if written:
        db.write(batch, options)
        for rows in written:
            rows.clear()
