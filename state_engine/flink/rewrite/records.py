"""The rewrite's data path: records read from a source handle at their new key groups, output
parts written as canonical key-group files, ``_metadata`` written last (no catalog, no Spark)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from state_engine.flink.metadata import FlinkSnapshotMetadata
from state_engine.flink.rewrite.options import RewriteOptions
from state_engine.flink.rewrite.plan import ReadTask, RewritePlan

__all__ = ["SCHEMA", "PartWritten", "read_records", "rewrite_local", "write_metadata", "write_part"]

#: The columns of :func:`read_records`: ``part`` (index into ``plan.outputs``), ``key_group``
#: (new), ``state`` (output state id), ``key`` (the RocksDB-shaped key without its key-group
#: prefix), ``value``.
SCHEMA = pa.schema(
    [
        ("part", pa.int32()),
        ("key_group", pa.int32()),
        ("state", pa.int16()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


@dataclass(frozen=True)
class PartWritten:
    """One output part as written: its file (in the output directory), size and the offset of
    every key group of its range (0: no data)."""

    part: int
    file_name: str
    size: int
    offsets: tuple[int, ...]


def read_records(plan: RewritePlan, task: ReadTask, fs: Any = None) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` as :data:`SCHEMA` batches: keys re-assigned to their new key
    groups, TTL-expired entries and list elements and dropped states left out. ``fs`` is unused
    (handles carry their own locations); kept for the job's call."""
    raise NotImplementedError


def write_part(
    plan: RewritePlan, part: int, batches: Iterable[pa.RecordBatch], fs: Any, out_dir: str
) -> PartWritten:
    """Write output part ``part`` from ``batches`` sorted by (key_group, state, key): one
    canonical key-group file, one key group in memory at a time."""
    raise NotImplementedError


def write_metadata(
    plan: RewritePlan, parts: Sequence[PartWritten], fs: Any, out_dir: str
) -> str:
    """Copy operator and coordinator state files into ``out_dir`` and write ``_metadata`` last;
    returns its path."""
    raise NotImplementedError


def rewrite_local(
    meta: FlinkSnapshotMetadata, options: RewriteOptions, fs: Any, out_dir: str
) -> dict[str, Any]:
    """The whole rewrite in this process (tests, small snapshots); returns the plan's report
    with ``output_location``."""
    raise NotImplementedError
