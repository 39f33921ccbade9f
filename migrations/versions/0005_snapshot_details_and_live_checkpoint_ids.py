"""Snapshots keep origin facts in ``details``; a checkpoint id is unique among live snapshots only.

* ``sk_snapshots.details`` (JSON, NULL when empty): what an origin knows about a snapshot. A
  Flink snapshot discarded by expire keeps there the stamp of the ``_metadata`` it was discarded
  with, which earlier code wrote as text into ``error``: those notes move over.
* ``UNIQUE (job_id, checkpoint_id)`` becomes a unique index over the rows that are not DISCARDED.
  A discarded snapshot is history; a Flink job restarted under the same job id (application
  mode's fixed id) writes ``chk-N`` again where an expired one was, and that is a new snapshot.
  Statekeeper's own writers take ids above every row's, discarded or not, as before.

SQLite cannot drop a table constraint: the table is rebuilt (with the views over it dropped and
made again, and foreign keys not enforced during the rebuild: see ``migrations/env.py``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
OLD_UNIQUE = "uq_sk_snapshots_job_id_checkpoint_id"
LIVE_UNIQUE = "uq_sk_snapshots_live_checkpoint_id"
LIVE = "status <> 'DISCARDED'"
#: the views that read sk_snapshots (SQLite's table rebuild drops and recreates them)
SNAPSHOT_VIEWS = (
    "sk_v_latest_snapshots",
    "sk_v_state_size",
    "sk_v_snapshot_files",
    "sk_v_key_group_skew",
)
#: the note earlier code's expire wrote into ``error`` (its ``expired_note``)
STAMP_NOTE = re.compile(
    r"its _metadata was (\d+) bytes, modified at ([0-9.e+-]+), changed at ([0-9.e+-]+) "
    r"\(epoch s\)"
)


def upgrade() -> None:
    op.add_column("sk_snapshots", sa.Column("details", JSON_TYPE, nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(drop_unique=True)
    else:
        op.drop_constraint(op.f(OLD_UNIQUE), "sk_snapshots", type_="unique")
    op.create_index(
        op.f(LIVE_UNIQUE),
        "sk_snapshots",
        ["job_id", "checkpoint_id"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )
    _move_discard_stamps()


def downgrade() -> None:
    bind = op.get_bind()
    twice = bind.execute(
        sa.text(
            "SELECT job_id, checkpoint_id FROM sk_snapshots GROUP BY job_id, checkpoint_id "
            "HAVING COUNT(*) > 1"
        )
    ).first()
    if twice is not None:
        raise RuntimeError(
            f"job {twice[0]} has checkpoint id {twice[1]} on more than one snapshot (a DISCARDED "
            "one and a newer one); revision 0004 allows one: delete the DISCARDED row first"
        )
    op.drop_index(op.f(LIVE_UNIQUE), table_name="sk_snapshots")
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(drop_unique=False)
    else:
        op.create_unique_constraint(op.f(OLD_UNIQUE), "sk_snapshots", ["job_id", "checkpoint_id"])
    op.execute("ALTER TABLE sk_snapshots DROP COLUMN details")


def _rebuild_sqlite(*, drop_unique: bool) -> None:
    """Rebuild sk_snapshots without (or with again) its table-level unique constraint."""
    bind = op.get_bind()
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError(
            "SQLite's foreign keys are enforced: rebuilding sk_snapshots would delete the rows "
            "that reference it; run the migration through `statectl catalog upgrade`"
        )
    for name in SNAPSHOT_VIEWS:
        op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("sk_snapshots", recreate="always") as batch:
        if drop_unique:
            batch.drop_constraint(op.f(OLD_UNIQUE), type_="unique")
        else:
            batch.create_unique_constraint(op.f(OLD_UNIQUE), ["job_id", "checkpoint_id"])
    views = _first_revision().VIEWS
    for name in SNAPSHOT_VIEWS:
        op.execute(f"CREATE VIEW {name} AS {views[name]}")
    broken = bind.exec_driver_sql("PRAGMA foreign_key_check").first()
    if broken is not None:
        raise RuntimeError(f"rebuilding sk_snapshots broke a foreign key: {tuple(broken)}")


def _first_revision():  # type: ignore[no-untyped-def]
    """Revision 0001's module, whose view definitions are still the current ones."""
    path = Path(__file__).with_name("0001_catalog_tables_and_views.py")
    spec = importlib.util.spec_from_file_location("statekeeper_migration_0001", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _move_discard_stamps() -> None:
    """Expired Flink snapshots' ``_metadata`` stamps, from the ``error`` text to ``details``."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT id, error FROM sk_snapshots "
            "WHERE status = 'DISCARDED' AND error LIKE 'expired; its _metadata was %'"
        )
    ).all()
    table = sa.table("sk_snapshots", sa.column("id"), sa.column("details", JSON_TYPE))
    for snapshot_id, error in rows:
        m = STAMP_NOTE.search(error)
        if m is None:
            continue
        stamp = {"size": int(m[1]), "modified": float(m[2]), "changed": float(m[3])}
        bind.execute(
            table.update()
            .where(table.c.id == snapshot_id)
            .values(details={"discarded_metadata": stamp})
        )
