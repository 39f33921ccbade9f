"""Runs know the Airflow task that ran them (``task_id``); dry runs have their own status.

* ``sk_maintenance_runs.task_id`` (NULL for runs not started by an Airflow task): with ``dag_id``
  and ``airflow_run_id`` it names the task instance of a DAG-triggered run.
* ``sk_maintenance_runs.status`` also takes ``DRY_RUN``: a run that only reported what it would
  have done, so history tells it from runs that changed storage.

``sk_v_maintenance_history`` is recreated with ``task_id``. A downgrade records every DRY_RUN
run as SUCCEEDED (the status it had before) and drops the column.

Revision ID: 0010
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "sk_maintenance_runs"
CHECK = "ck_sk_maintenance_runs_status"
VIEW = "sk_v_maintenance_history"
OLD_STATUSES = "status IN ('RUNNING', 'SUCCEEDED', 'FAILED')"
NEW_STATUSES = "status IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'DRY_RUN')"
OLD_VIEW = """
    SELECT r.run_id, r.kind, j.name AS job, r.job_id, r.status, r.attempts, r.started_at,
           r.finished_at, r.input_snapshot_id, r.output_snapshot_id, r.rows_in, r.rows_out,
           r.bytes_in, r.bytes_out, r.dag_id, r.airflow_run_id, r.error
    FROM sk_maintenance_runs r LEFT JOIN sk_jobs j ON j.id = r.job_id
"""
NEW_VIEW = """
    SELECT r.run_id, r.kind, j.name AS job, r.job_id, r.status, r.attempts, r.started_at,
           r.finished_at, r.input_snapshot_id, r.output_snapshot_id, r.rows_in, r.rows_out,
           r.bytes_in, r.bytes_out, r.dag_id, r.airflow_run_id, r.task_id, r.error
    FROM sk_maintenance_runs r LEFT JOIN sk_jobs j ON j.id = r.job_id
"""


def _replace_check(condition: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        # SQLite cannot alter a constraint: batch mode copies the table with the new one (the
        # view over it is dropped first, or the copy's rename would fail on it)
        with op.batch_alter_table(RUNS, recreate="always") as batch:
            batch.drop_constraint(op.f(CHECK), type_="check")
            batch.create_check_constraint(op.f(CHECK), condition)
    else:
        op.drop_constraint(op.f(CHECK), RUNS, type_="check")
        op.create_check_constraint(op.f(CHECK), RUNS, condition)


def upgrade() -> None:
    op.execute(f"DROP VIEW {VIEW}")
    op.add_column(RUNS, sa.Column("task_id", sa.String(250), nullable=True))
    _replace_check(NEW_STATUSES)
    op.execute(f"CREATE VIEW {VIEW} AS {NEW_VIEW}")


def downgrade() -> None:
    op.execute(f"DROP VIEW {VIEW}")
    op.execute(f"UPDATE {RUNS} SET status = 'SUCCEEDED' WHERE status = 'DRY_RUN'")
    _replace_check(OLD_STATUSES)
    with op.batch_alter_table(RUNS) as batch:
        batch.drop_column("task_id")
    op.execute(f"CREATE VIEW {VIEW} AS {OLD_VIEW}")
