"""A file group records what every one of its files shares once: ``common_details``.

* ``sk_snapshot_file_groups.common_details`` (JSON, NULL when none): what the writer recorded
  about every file of the group (a Flink import's role and kind of a subtask's thousands of
  shared SSTs), stored once instead of in each file's entry of ``details``. A reference's details
  are the group's common ones and its own, its own winning on a key both give.

Existing groups keep their per-file details as they are. A downgrade folds each group's common
details back into the entry of every one of its files.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A frozen copy of the model type: a migration must not change when the models do.
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
GROUPS = "sk_snapshot_file_groups"
#: groups folded back per read on a downgrade (each holds up to thousands of entries)
BATCH = 1_000


def upgrade() -> None:
    op.add_column(GROUPS, sa.Column("common_details", JSON_TYPE, nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    groups = sa.table(
        GROUPS,
        sa.column("id", sa.BigInteger),
        sa.column("file_ids", JSON_TYPE),
        sa.column("details", JSON_TYPE),
        sa.column("common_details", JSON_TYPE),
    )
    last = 0
    while True:
        rows = bind.execute(
            sa.select(groups.c.id, groups.c.file_ids, groups.c.details, groups.c.common_details)
            .where(groups.c.common_details.is_not(None), groups.c.id > last)
            .order_by(groups.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            break
        for gid, file_ids, details, common in rows:
            bind.execute(
                groups.update()
                .where(groups.c.id == gid)
                .values(details=_folded(_loaded(common), _loaded(details), len(_loaded(file_ids))))
            )
        last = rows[-1][0]
    op.drop_column(GROUPS, "common_details")


def _loaded(value: Any) -> Any:
    """A JSON column's value as Python (SQLite's driver may hand back the text)."""
    return json.loads(value) if isinstance(value, str) else value


def _folded(common: dict[str, Any], details: list[Any] | None, files: int) -> list[Any]:
    """Each file's entry with the group's common details under its own."""
    own = details if details is not None else [None] * files
    return [{**common, **(d or {})} for d in own]
