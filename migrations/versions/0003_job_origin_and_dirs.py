"""Jobs know who wrote their snapshots (``origin``); imported directories belong to one job.

``sk_jobs.origin`` is ``statekeeper`` for every existing job and ``flink`` for jobs imported from
Apache Flink checkpoint/savepoint directories (issue 12). ``sk_job_dirs`` records those
directories with a unique path, so the same directory cannot be imported under two job names.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD/DROP COLUMN, not batch mode: SQLite's batch copy of sk_jobs would break the views
    # that read it (SQLite has both statements natively since 3.35).
    op.add_column(
        "sk_jobs",
        sa.Column("origin", sa.String(16), nullable=False, server_default="statekeeper"),
    )
    op.create_table(
        "sk_job_dirs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sk_jobs.id"],
            name=op.f("fk_sk_job_dirs_job_id_sk_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_job_dirs")),
        sa.UniqueConstraint("path", name=op.f("uq_sk_job_dirs_path")),
    )
    op.create_index(op.f("ix_sk_job_dirs_job_id"), "sk_job_dirs", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sk_job_dirs_job_id"), table_name="sk_job_dirs")
    op.drop_table("sk_job_dirs")
    op.execute("ALTER TABLE sk_jobs DROP COLUMN origin")
