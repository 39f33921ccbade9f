"""Every job has a management policy: what Statekeeper may delete in its directories.

``sk_jobs.manage``: the actions allowed, comma-separated (``retention``: expire deletes old
checkpoints and named savepoints; ``orphans``: orphan cleanup deletes unreferenced files); an
empty string is read-only. Statekeeper jobs keep what they could do before (both); jobs imported
from Apache Flink become read-only: importing a directory to look at it is no consent to delete
in it. ``statectl jobs set-policy`` changes it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, not batch mode (see 0003: a batch copy of sk_jobs breaks its views).
    op.add_column(
        "sk_jobs",
        sa.Column("manage", sa.String(64), nullable=False, server_default="retention,orphans"),
    )
    jobs = sa.table("sk_jobs", sa.column("origin", sa.String), sa.column("manage", sa.String))
    op.execute(jobs.update().where(jobs.c.origin == "flink").values(manage=""))


def downgrade() -> None:
    op.execute("ALTER TABLE sk_jobs DROP COLUMN manage")
