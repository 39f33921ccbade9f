"""Snapshots know which run began them (``writer``): the commits a dead run left are its own.

``sk_snapshots.writer`` is the owner of the job's writer lease that began the snapshot
(``runner/<host>/<machine>/<pid>/<nonce>``), NULL for snapshots begun without one: maintenance
outputs, Flink imports, registered savepoints, and writers that drive a CheckpointManager
directly. A run that takes the job's writer lease fails the PENDING snapshots of earlier
writers, and only those.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # plain ADD/DROP COLUMN (see 0003): a batch copy of sk_snapshots would break its views
    op.add_column("sk_snapshots", sa.Column("writer", sa.String(200), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE sk_snapshots DROP COLUMN writer")
