"""Snapshots know when they were imported, how their _metadata is read and how entries were got.

* ``sk_snapshots.imported_at`` (NULL for snapshots a Statekeeper writer made): when an import
  recorded a snapshot some other system wrote. ``completed_at`` is then when that system
  completed it (a Flink ``_metadata``'s modification time), no longer the import's time.
  Existing imported rows keep their ``completed_at`` and get it as ``imported_at`` too: the
  next sync cannot tell more.
* ``sk_snapshots.metadata_format`` (``flink`` or ``statekeeper``): which reader reads the
  snapshot's ``_metadata``. A Flink job's catalog holds both: what Flink wrote, and savepoints
  Statekeeper converted into its own format. Existing rows: ``flink`` for imported ones.
* ``sk_snapshots.entries_basis`` (``counted``, ``estimated`` or ``not-counted``): where
  ``entries`` and the key-group rows come from. Existing rows: an imported native snapshot's
  rows were never counted, nor those of an imported canonical one that holds bytes and no
  entries (compressed); a Statekeeper native one's are estimated from RocksDB SST metadata.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SNAPSHOTS = "sk_snapshots"
IMPORTED = "trigger = 'flink-import'"


def upgrade() -> None:
    # Plain ADD COLUMN, not batch mode: a batch copy of sk_snapshots would break its views.
    op.add_column(SNAPSHOTS, sa.Column("imported_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        SNAPSHOTS,
        sa.Column("metadata_format", sa.String(16), nullable=False, server_default="statekeeper"),
    )
    op.add_column(SNAPSHOTS, sa.Column("entries_basis", sa.String(16), nullable=True))
    op.execute(
        f"UPDATE {SNAPSHOTS} SET imported_at = completed_at, metadata_format = 'flink' "
        f"WHERE {IMPORTED}"
    )
    op.execute(
        f"UPDATE {SNAPSHOTS} SET entries_basis = CASE "
        f"WHEN {IMPORTED} AND (format <> 'CANONICAL' OR (entries = 0 AND bytes > 0)) "
        "THEN 'not-counted' "
        "WHEN format = 'NATIVE' THEN 'estimated' ELSE 'counted' END"
    )


def downgrade() -> None:
    op.drop_column(SNAPSHOTS, "entries_basis")
    op.drop_column(SNAPSHOTS, "metadata_format")
    op.drop_column(SNAPSHOTS, "imported_at")
