"""Catalog tables, indexes and views.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model types: a migration must not change when the models do.
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# Views for people and dashboards. Plain SQL that SQLite and PostgreSQL both run. Each is frozen
# here; a later change is a new revision that drops and recreates the view.
VIEWS: dict[str, str] = {
    "sk_v_latest_snapshots": """
        SELECT j.name AS job, s.job_id, s.id AS snapshot_id, s.checkpoint_id, s.kind, s.format,
               s.parallelism, s.max_parallelism, s.location, s.bytes, s.entries, s.completed_at
        FROM sk_snapshots s JOIN sk_jobs j ON j.id = s.job_id
        WHERE s.status = 'COMPLETED'
          AND s.checkpoint_id = (
              SELECT MAX(s2.checkpoint_id) FROM sk_snapshots s2
              WHERE s2.job_id = s.job_id AND s2.status = 'COMPLETED')
    """,
    "sk_v_state_size": """
        SELECT j.name AS job, s.job_id, s.id AS snapshot_id, s.checkpoint_id, s.kind, s.status,
               s.completed_at, o.uid AS operator, z.operator_id, z.files, z.bytes, z.shared_bytes
        FROM sk_snapshot_sizes z
        JOIN sk_snapshots s ON s.id = z.snapshot_id
        JOIN sk_jobs j ON j.id = s.job_id
        LEFT JOIN sk_operators o ON o.id = z.operator_id
    """,
    "sk_v_snapshot_files": """
        SELECT sf.snapshot_id, s.job_id, j.name AS job, s.checkpoint_id, o.uid AS operator,
               sf.subtask, sf.key_group_start, sf.key_group_end, f.id AS file_id, f.path, f.size,
               f.checksum, f.shared, f.created_by_snapshot_id, f.last_used_snapshot_id
        FROM sk_snapshot_files sf
        JOIN sk_files f ON f.id = sf.file_id
        JOIN sk_snapshots s ON s.id = sf.snapshot_id
        JOIN sk_jobs j ON j.id = s.job_id
        LEFT JOIN sk_operators o ON o.id = sf.operator_id
    """,
    "sk_v_orphan_candidates": """
        SELECT j.name AS job, f.job_id, f.id AS file_id, f.path, f.size, f.shared,
               f.created_by_snapshot_id, f.last_used_snapshot_id, f.created_at
        FROM sk_files f JOIN sk_jobs j ON j.id = f.job_id
        WHERE f.live_refs = 0
    """,
    "sk_v_key_group_skew": """
        SELECT k.snapshot_id, s.job_id, j.name AS job, s.checkpoint_id, k.operator_id,
               o.uid AS operator, s.max_parallelism AS key_groups, COUNT(*) AS recorded_key_groups,
               SUM(k.rows) AS total_rows, MAX(k.rows) AS max_rows,
               CAST(SUM(k.rows) AS DOUBLE PRECISION) / s.max_parallelism AS mean_rows,
               CASE WHEN SUM(k.rows) = 0 THEN NULL
                    ELSE CAST(MAX(k.rows) AS DOUBLE PRECISION) * s.max_parallelism / SUM(k.rows)
               END AS skew
        FROM sk_key_group_stats k
        JOIN sk_snapshots s ON s.id = k.snapshot_id
        JOIN sk_jobs j ON j.id = s.job_id
        JOIN sk_operators o ON o.id = k.operator_id
        GROUP BY k.snapshot_id, s.job_id, j.name, s.checkpoint_id, s.max_parallelism,
                 k.operator_id, o.uid
    """,
    "sk_v_maintenance_history": """
        SELECT r.run_id, r.kind, j.name AS job, r.job_id, r.status, r.attempts, r.started_at,
               r.finished_at, r.input_snapshot_id, r.output_snapshot_id, r.rows_in, r.rows_out,
               r.bytes_in, r.bytes_out, r.dag_id, r.airflow_run_id, r.error
        FROM sk_maintenance_runs r LEFT JOIN sk_jobs j ON j.id = r.job_id
    """,
}


def upgrade() -> None:
    _create_tables()
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def _create_tables() -> None:
    op.create_table(
        "sk_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("max_parallelism", sa.Integer(), nullable=False),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("properties", JSON_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_jobs")),
        sa.UniqueConstraint("name", name=op.f("uq_sk_jobs_name")),
    )
    op.create_table(
        "sk_leases",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_sk_leases")),
    )
    op.create_table(
        "sk_operators",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("uid", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sk_jobs.id"],
            name=op.f("fk_sk_operators_job_id_sk_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_operators")),
        sa.UniqueConstraint("job_id", "uid", name=op.f("uq_sk_operators_job_id_uid")),
    )
    op.create_table(
        "sk_snapshots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("parallelism", sa.Integer(), nullable=False),
        sa.Column("max_parallelism", sa.Integer(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "format IN ('CANONICAL', 'DELTA', 'NATIVE')", name=op.f("ck_sk_snapshots_format")
        ),
        sa.CheckConstraint(
            "kind IN ('CHECKPOINT', 'SAVEPOINT')", name=op.f("ck_sk_snapshots_kind")
        ),
        sa.CheckConstraint(
            "status IN ('PENDING', 'COMPLETED', 'FAILED', 'SUBSUMED', 'DISCARDED')",
            name=op.f("ck_sk_snapshots_status"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sk_jobs.id"],
            name=op.f("fk_sk_snapshots_job_id_sk_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["sk_snapshots.id"], name=op.f("fk_sk_snapshots_parent_id_sk_snapshots")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_snapshots")),
        sa.UniqueConstraint(
            "job_id", "checkpoint_id", name=op.f("uq_sk_snapshots_job_id_checkpoint_id")
        ),
    )
    with op.batch_alter_table("sk_snapshots", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sk_snapshots_job_id_status_checkpoint_id"),
            ["job_id", "status", "checkpoint_id"],
            unique=False,
        )

    op.create_table(
        "sk_files",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.String(length=128), nullable=True),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("created_by_snapshot_id", sa.Integer(), nullable=True),
        sa.Column("last_used_snapshot_id", sa.Integer(), nullable=True),
        sa.Column("live_refs", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("live_refs >= 0", name=op.f("ck_sk_files_live_refs")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_sk_files_size")),
        sa.ForeignKeyConstraint(
            ["created_by_snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_files_created_by_snapshot_id_sk_snapshots"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["sk_jobs.id"], name=op.f("fk_sk_files_job_id_sk_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["last_used_snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_files_last_used_snapshot_id_sk_snapshots"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_files")),
        sa.UniqueConstraint("path", name=op.f("uq_sk_files_path")),
    )
    with op.batch_alter_table("sk_files", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sk_files_job_id_live_refs"), ["job_id", "live_refs"], unique=False
        )

    op.create_table(
        "sk_key_group_stats",
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=False),
        sa.Column("key_group", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["sk_operators.id"],
            name=op.f("fk_sk_key_group_stats_operator_id_sk_operators"),
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_key_group_stats_snapshot_id_sk_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "snapshot_id", "operator_id", "key_group", name=op.f("pk_sk_key_group_stats")
        ),
    )
    op.create_table(
        "sk_maintenance_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("params", JSON_TYPE, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stats", JSON_TYPE, nullable=True),
        sa.Column("input_snapshot_id", sa.Integer(), nullable=True),
        sa.Column("output_snapshot_id", sa.Integer(), nullable=True),
        sa.Column("rows_in", sa.BigInteger(), nullable=True),
        sa.Column("rows_out", sa.BigInteger(), nullable=True),
        sa.Column("bytes_in", sa.BigInteger(), nullable=True),
        sa.Column("bytes_out", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("dag_id", sa.String(length=250), nullable=True),
        sa.Column("airflow_run_id", sa.String(length=250), nullable=True),
        sa.CheckConstraint(
            "status IN ('RUNNING', 'SUCCEEDED', 'FAILED')",
            name=op.f("ck_sk_maintenance_runs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["input_snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_maintenance_runs_input_snapshot_id_sk_snapshots"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["sk_jobs.id"],
            name=op.f("fk_sk_maintenance_runs_job_id_sk_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["output_snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_maintenance_runs_output_snapshot_id_sk_snapshots"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_maintenance_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_sk_maintenance_runs_run_id")),
    )
    with op.batch_alter_table("sk_maintenance_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sk_maintenance_runs_job_id_started_at"),
            ["job_id", "started_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_sk_maintenance_runs_started_at"), ["started_at"], unique=False
        )

    op.create_table(
        "sk_snapshot_sizes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=True),
        sa.Column("files", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("shared_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["sk_operators.id"],
            name=op.f("fk_sk_snapshot_sizes_operator_id_sk_operators"),
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["sk_snapshots.id"],
            name=op.f("fk_sk_snapshot_sizes_snapshot_id_sk_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_snapshot_sizes")),
    )
    with op.batch_alter_table("sk_snapshot_sizes", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sk_snapshot_sizes_operator_id"), ["operator_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_sk_snapshot_sizes_snapshot_id"), ["snapshot_id"], unique=False
        )

    op.create_table(
        "sk_states",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("operator_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("serializers", JSON_TYPE, nullable=False),
        sa.Column("ttl", JSON_TYPE, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["sk_operators.id"],
            name=op.f("fk_sk_states_operator_id_sk_operators"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sk_states")),
        sa.UniqueConstraint("operator_id", "name", name=op.f("uq_sk_states_operator_id_name")),
    )
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
    with op.batch_alter_table("sk_snapshot_files", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sk_snapshot_files_file_id"), ["file_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_sk_snapshot_files_snapshot_id"), ["snapshot_id"], unique=False
        )


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("sk_snapshot_files", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sk_snapshot_files_snapshot_id"))
        batch_op.drop_index(batch_op.f("ix_sk_snapshot_files_file_id"))

    op.drop_table("sk_snapshot_files")
    op.drop_table("sk_states")
    with op.batch_alter_table("sk_snapshot_sizes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sk_snapshot_sizes_snapshot_id"))
        batch_op.drop_index(batch_op.f("ix_sk_snapshot_sizes_operator_id"))

    op.drop_table("sk_snapshot_sizes")
    with op.batch_alter_table("sk_maintenance_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sk_maintenance_runs_started_at"))
        batch_op.drop_index(batch_op.f("ix_sk_maintenance_runs_job_id_started_at"))

    op.drop_table("sk_maintenance_runs")
    op.drop_table("sk_key_group_stats")
    with op.batch_alter_table("sk_files", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sk_files_job_id_live_refs"))

    op.drop_table("sk_files")
    with op.batch_alter_table("sk_snapshots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sk_snapshots_job_id_status_checkpoint_id"))

    op.drop_table("sk_snapshots")
    op.drop_table("sk_operators")
    op.drop_table("sk_leases")
    op.drop_table("sk_jobs")
