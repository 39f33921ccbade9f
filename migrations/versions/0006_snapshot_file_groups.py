"""A snapshot's file references in groups: one row per operator subtask, not one per file.

* ``sk_snapshot_file_groups``: the files one snapshot references for one operator subtask and
  key-group range, their ids as a JSON array (and what the writer recorded about each, as a
  parallel array). A RocksDB checkpoint references thousands of shared files; a row per reference
  made registering or importing it cost more than listing its directory.
* ``sk_snapshot_files`` becomes a view over the groups with a row per reference (its columns, with
  the group and position in place of the row id and without ``details``), so SQL over it and
  ``sk_v_snapshot_files`` read as before. File ids in a group have no foreign key: forgetting a
  file takes it out of the groups (the repository's ``forget_files``).

The existing references move over (grouped by snapshot, operator, subtask and key-group range,
in their row order); a downgrade unnests them again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model types: a migration must not change when the models do.
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
GROUPS = "sk_snapshot_file_groups"
#: references moved per statement, and snapshots read at a time (a catalog may hold millions)
BATCH = 10_000
SNAPSHOTS_PER_READ = 100

#: A row per reference: the groups unnested, per dialect (SQLite has no arrays, PostgreSQL no
#: json_each), with the same columns.
REFERENCES_VIEW = {
    "sqlite": f"""
        SELECT g.id AS group_id, CAST(e.key AS INTEGER) AS position, g.snapshot_id,
               e.value AS file_id, g.operator_id, g.subtask, g.key_group_start,
               g.key_group_end, g.foreign_files AS foreign_file
        FROM {GROUPS} g, json_each(g.file_ids) e
    """,
    "postgresql": f"""
        SELECT g.id AS group_id, CAST(e.ord - 1 AS INTEGER) AS position, g.snapshot_id,
               CAST(e.file_id AS BIGINT) AS file_id, g.operator_id, g.subtask,
               g.key_group_start, g.key_group_end, g.foreign_files AS foreign_file
        FROM {GROUPS} g
        CROSS JOIN LATERAL jsonb_array_elements_text(g.file_ids) WITH ORDINALITY AS e(file_id, ord)
    """,
}
#: the view that reads sk_snapshot_files (dropped and made again around the change)
DEPENDENT_VIEWS = ("sk_v_snapshot_files",)


def upgrade() -> None:
    bind = op.get_bind()
    for name in DEPENDENT_VIEWS:
        op.execute(f"DROP VIEW {name}")
    op.create_table(
        GROUPS,
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=True),
        sa.Column("subtask", sa.Integer(), nullable=True),
        sa.Column("key_group_start", sa.Integer(), nullable=True),
        sa.Column("key_group_end", sa.Integer(), nullable=True),
        sa.Column("foreign_files", sa.Boolean(), nullable=False),
        sa.Column("file_ids", JSON_TYPE, nullable=False),
        sa.Column("details", JSON_TYPE, nullable=True),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["sk_operators.id"],
            name=op.f("fk_sk_snapshot_file_groups_operator_id_sk_operators"),
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_snapshot_file_groups_snapshot_id_sk_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_snapshot_file_groups")),
    )
    op.create_index(op.f("ix_sk_snapshot_file_groups_snapshot_id"), GROUPS, ["snapshot_id"])
    op.create_index(
        op.f("ix_sk_snapshot_file_groups_foreign_files_snapshot_id"),
        GROUPS,
        ["foreign_files", "snapshot_id"],
    )
    _insert_groups(bind, _groups(bind))
    op.drop_index(op.f("ix_sk_snapshot_files_snapshot_id"), table_name="sk_snapshot_files")
    op.drop_index(op.f("ix_sk_snapshot_files_file_id"), table_name="sk_snapshot_files")
    op.drop_table("sk_snapshot_files")
    op.execute(f"CREATE VIEW sk_snapshot_files AS {REFERENCES_VIEW[bind.dialect.name]}")
    _create_views(DEPENDENT_VIEWS)


def downgrade() -> None:
    bind = op.get_bind()
    for name in DEPENDENT_VIEWS:
        op.execute(f"DROP VIEW {name}")
    op.execute("DROP VIEW sk_snapshot_files")
    op.create_table(
        "sk_snapshot_files",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("file_id", BIG_ID, nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=True),
        sa.Column("subtask", sa.Integer(), nullable=True),
        sa.Column("key_group_start", sa.Integer(), nullable=True),
        sa.Column("key_group_end", sa.Integer(), nullable=True),
        sa.Column("details", JSON_TYPE, nullable=True),
        sa.ForeignKeyConstraint(
            ["file_id"], ["sk_files.id"], name=op.f("fk_sk_snapshot_files_file_id_sk_files")
        ),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["sk_operators.id"],
            name=op.f("fk_sk_snapshot_files_operator_id_sk_operators"),
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_snapshot_files_snapshot_id_sk_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_snapshot_files")),
    )
    op.create_index(op.f("ix_sk_snapshot_files_file_id"), "sk_snapshot_files", ["file_id"])
    op.create_index(op.f("ix_sk_snapshot_files_snapshot_id"), "sk_snapshot_files", ["snapshot_id"])
    _insert_rows(bind)
    op.drop_index(op.f("ix_sk_snapshot_file_groups_foreign_files_snapshot_id"), table_name=GROUPS)
    op.drop_index(op.f("ix_sk_snapshot_file_groups_snapshot_id"), table_name=GROUPS)
    op.drop_table(GROUPS)
    _create_views(DEPENDENT_VIEWS)


def _groups(bind: sa.Connection) -> Iterator[tuple[Any, ...]]:
    """The references of sk_snapshot_files, grouped: (snapshot, operator, subtask, key-group
    range, foreign, file ids, details) per snapshot, operator, subtask and range, in row id
    order. A file of another job than the snapshot's is foreign. Read a few snapshots at a time
    (a catalog may hold millions of references)."""
    snapshots = [
        sid
        for (sid,) in bind.execute(
            sa.text("SELECT DISTINCT snapshot_id FROM sk_snapshot_files ORDER BY snapshot_id")
        )
    ]
    select = (
        sa.text(
            "SELECT r.snapshot_id, r.operator_id, r.subtask, r.key_group_start, "
            "r.key_group_end, f.job_id <> s.job_id, r.file_id, r.details "
            "FROM sk_snapshot_files r JOIN sk_files f ON f.id = r.file_id "
            "JOIN sk_snapshots s ON s.id = r.snapshot_id WHERE r.snapshot_id IN :ids "
            "ORDER BY r.snapshot_id, r.id"
        )
        .bindparams(sa.bindparam("ids", expanding=True))
        .columns(details=JSON_TYPE)
    )
    for at in range(0, len(snapshots), SNAPSHOTS_PER_READ):
        rows = bind.execute(select, {"ids": snapshots[at : at + SNAPSHOTS_PER_READ]}).all()
        groups: dict[tuple[Any, ...], tuple[list[int], list[Any]]] = {}
        snapshot = None
        for snapshot_id, *key, file_id, details in rows:
            if snapshot_id != snapshot:
                yield from _flush(snapshot, groups)
                groups, snapshot = {}, snapshot_id
            ids, notes = groups.setdefault((*key[:4], bool(key[4])), ([], []))
            ids.append(file_id)
            notes.append(details)
        yield from _flush(snapshot, groups)


def _flush(
    snapshot: int | None, groups: dict[tuple[Any, ...], tuple[list[int], list[Any]]]
) -> Iterator[tuple[Any, ...]]:
    for (operator, subtask, start, end, foreign), (ids, notes) in groups.items():
        details = None if all(n is None for n in notes) else json.dumps(notes)
        yield snapshot, operator, subtask, start, end, foreign, json.dumps(ids), details


def _insert_groups(bind: sa.Connection, groups: Iterator[tuple[Any, ...]]) -> None:
    mark = "%s" if bind.dialect.name == "postgresql" else "?"
    sql = (
        f"INSERT INTO {GROUPS} (snapshot_id, operator_id, subtask, key_group_start, "
        "key_group_end, foreign_files, file_ids, details) VALUES "
        f"({', '.join([mark] * 8)})"
    )
    batch: list[tuple[Any, ...]] = []
    for group in groups:
        batch.append(group)
        if len(batch) >= 100:
            bind.exec_driver_sql(sql, batch)
            batch = []
    if batch:
        bind.exec_driver_sql(sql, batch)


def _insert_rows(bind: sa.Connection) -> None:
    """The groups unnested into sk_snapshot_files rows."""
    groups = bind.execute(
        sa.text(
            f"SELECT snapshot_id, operator_id, subtask, key_group_start, key_group_end, "
            f"file_ids, details FROM {GROUPS} ORDER BY id"
        ).columns(file_ids=JSON_TYPE, details=JSON_TYPE)
    )
    mark = "%s" if bind.dialect.name == "postgresql" else "?"
    sql = (
        "INSERT INTO sk_snapshot_files (snapshot_id, file_id, operator_id, subtask, "
        f"key_group_start, key_group_end, details) VALUES ({', '.join([mark] * 7)})"
    )
    batch: list[tuple[Any, ...]] = []
    for snapshot_id, operator_id, subtask, start, end, ids, details in groups:
        notes = details if details is not None else [None] * len(ids)
        for file_id, note in zip(ids, notes, strict=True):
            text = None if note is None else json.dumps(note)
            batch.append((snapshot_id, file_id, operator_id, subtask, start, end, text))
        if len(batch) >= BATCH:
            bind.exec_driver_sql(sql, batch)
            batch = []
    if batch:
        bind.exec_driver_sql(sql, batch)


def _create_views(names: Sequence[str]) -> None:
    views = _first_revision().VIEWS
    for name in names:
        op.execute(f"CREATE VIEW {name} AS {views[name]}")


def _first_revision():  # type: ignore[no-untyped-def]
    """Revision 0001's module, whose definitions of these views are still the current ones."""
    path = Path(__file__).with_name("0001_catalog_tables_and_views.py")
    spec = importlib.util.spec_from_file_location("statekeeper_migration_0001", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
