"""The catalog's views, as typed selectables for the repository's queries."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Text, column, table

from state_engine.catalog.models import UTCDateTime

latest_snapshots = table(
    "sk_v_latest_snapshots",
    column("job", String),
    column("job_id", Integer),
    column("snapshot_id", Integer),
    column("checkpoint_id", BigInteger),
    column("completed_at", UTCDateTime()),
)

state_size = table(
    "sk_v_state_size",
    column("job", String),
    column("job_id", Integer),
    column("snapshot_id", Integer),
    column("checkpoint_id", BigInteger),
    column("kind", String),
    column("status", String),
    column("completed_at", UTCDateTime()),
    column("operator", String),
    column("operator_id", Integer),
    column("files", BigInteger),
    column("bytes", BigInteger),
    column("shared_bytes", BigInteger),
)

#: A row per reference of a snapshot to a file: sk_snapshot_file_groups unnested (migration 0006;
#: a table before it). A dead snapshot's reference to a forgotten file has no sk_files row.
references = table(
    "sk_snapshot_files",
    column("group_id", BigInteger),
    column("position", Integer),
    column("snapshot_id", Integer),
    column("file_id", BigInteger),
    column("operator_id", Integer),
    column("subtask", Integer),
    column("key_group_start", Integer),
    column("key_group_end", Integer),
    column("foreign_file", Boolean),
)

snapshot_files = table(
    "sk_v_snapshot_files",
    column("snapshot_id", Integer),
    column("job_id", Integer),
    column("job", String),
    column("checkpoint_id", BigInteger),
    column("operator", String),
    column("subtask", Integer),
    column("key_group_start", Integer),
    column("key_group_end", Integer),
    column("file_id", BigInteger),
    column("path", Text),
    column("size", BigInteger),
    column("checksum", String),
    column("shared", Boolean),
    column("created_by_snapshot_id", Integer),
    column("last_used_snapshot_id", Integer),
)

orphan_candidates = table(
    "sk_v_orphan_candidates",
    column("job", String),
    column("job_id", Integer),
    column("file_id", BigInteger),
    column("path", Text),
    column("size", BigInteger),
    column("shared", Boolean),
    column("created_by_snapshot_id", Integer),
    column("last_used_snapshot_id", Integer),
    column("created_at", UTCDateTime()),
)

key_group_skew = table(
    "sk_v_key_group_skew",
    column("snapshot_id", Integer),
    column("job_id", Integer),
    column("job", String),
    column("checkpoint_id", BigInteger),
    column("operator_id", Integer),
    column("operator", String),
    column("key_groups", Integer),
    column("recorded_key_groups", Integer),
    column("total_rows", BigInteger),
    column("max_rows", BigInteger),
    column("mean_rows", Float),
    column("skew", Float),
)

maintenance_history = table(
    "sk_v_maintenance_history",
    column("run_id", String),
    column("kind", String),
    column("job", String),
    column("job_id", Integer),
    column("status", String),
    column("started_at", UTCDateTime()),
    column("finished_at", UTCDateTime()),
)
