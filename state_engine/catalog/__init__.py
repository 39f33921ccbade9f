"""The SQL catalog: every job, snapshot, file and maintenance run, queryable.

The only package that speaks SQL. It imports nothing of the state layer: key-group ranges are
plain ints, serializer snapshots and TTL configs are JSON.
"""

from state_engine.catalog.engine import make_engine, parse_url
from state_engine.catalog.migrate import (
    VERSION_TABLE,
    check_at_head,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from state_engine.catalog.records import (
    FileGroup,
    FileRecord,
    FileRef,
    FilesSummary,
    JobRecord,
    KeyGroupStatRow,
    LeaseRecord,
    OperatorRecord,
    Page,
    QueryResult,
    RunRecord,
    SizePoint,
    SkewRecord,
    SnapshotFileRecord,
    SnapshotRecord,
    StateRecord,
)
from state_engine.catalog.repository import Catalog

__all__ = [
    "VERSION_TABLE",
    "Catalog",
    "FileRecord",
    "FileGroup",
    "FileRef",
    "FilesSummary",
    "JobRecord",
    "KeyGroupStatRow",
    "LeaseRecord",
    "OperatorRecord",
    "Page",
    "QueryResult",
    "RunRecord",
    "SizePoint",
    "SkewRecord",
    "SnapshotFileRecord",
    "SnapshotRecord",
    "StateRecord",
    "check_at_head",
    "current_revision",
    "downgrade",
    "head_revision",
    "make_engine",
    "parse_url",
    "upgrade",
]
