"""Orphan lookups read files in id order straight from an index.

``orphan_candidates`` and ``releasable_files`` ask for a job's files with ``live_refs = 0``
ordered by id. With (job_id, live_refs) PostgreSQL must sort every match (about 980,000 rows at
the benchmark's size when few files are live); with id as the third column the index returns them
in order and LIMIT stops early. SQLite already had that order (its index entries end in the rowid).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sk_files", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sk_files_job_id_live_refs_id"), ["job_id", "live_refs", "id"]
        )
        batch_op.drop_index(batch_op.f("ix_sk_files_job_id_live_refs"))


def downgrade() -> None:
    with op.batch_alter_table("sk_files", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sk_files_job_id_live_refs"), ["job_id", "live_refs"])
        batch_op.drop_index(batch_op.f("ix_sk_files_job_id_live_refs_id"))
