"""What a snapshot is: its kind, format and status, one spelling each.

A leaf module (standard library only) so the catalog, checkpoint, runtime, jobs, CLI and the
Airflow plugin all share it without importing one another. Members are ``StrEnum`` s: they compare
equal to, format as and are stored as the same upper-case strings the catalog's columns hold
(``SnapshotKind.SAVEPOINT == "SAVEPOINT"``), so no catalog migration is involved.

Configuration spells a format in lower case (``checkpoint_format="delta"``): that is
:attr:`SnapshotFormat.option`, and :meth:`SnapshotFormat.from_option` reads it back.
"""

from __future__ import annotations

from enum import StrEnum


class SnapshotKind(StrEnum):
    """Checkpoints are the engine's (subsumed and expired automatically); savepoints the user's
    (self-contained, relocatable, never deleted automatically)."""

    CHECKPOINT = "CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"


class SnapshotFormat(StrEnum):
    """Canonical Parquet, heap delta chains, or a backend's native files (RocksDB SSTs)."""

    CANONICAL = "CANONICAL"
    DELTA = "DELTA"
    NATIVE = "NATIVE"

    @property
    def option(self) -> str:
        """How a job's configuration spells this format (``"canonical"``)."""
        return self.value.lower()

    @classmethod
    def from_option(cls, value: object) -> SnapshotFormat | None:
        """The format a configuration value names (any case), or None if it names none."""
        if isinstance(value, str):
            try:
                return cls(value.upper())
            except ValueError:
                return None
        return None


#: The configuration spellings of the formats, in the order error messages list them.
FORMAT_OPTIONS = tuple(
    f.option for f in (SnapshotFormat.CANONICAL, SnapshotFormat.NATIVE, SnapshotFormat.DELTA)
)


class SnapshotStatus(StrEnum):
    """PENDING -> COMPLETED -> SUBSUMED -> DISCARDED, or PENDING -> FAILED."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SUBSUMED = "SUBSUMED"
    DISCARDED = "DISCARDED"


#: Retained snapshots pin their files: nothing they reference may be deleted.
RETAINED_STATUSES = (SnapshotStatus.PENDING, SnapshotStatus.COMPLETED)
#: A snapshot whose files an aborted writer removes: it never completed.
UNFINISHED_STATUSES = (SnapshotStatus.PENDING, SnapshotStatus.FAILED)
