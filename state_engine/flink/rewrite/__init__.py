"""Writing Flink savepoints that Flink restores: rescale (new max parallelism), TTL cleanup, state
surgery and backend switch, from any Flink snapshot the readers of :mod:`state_engine.flink` read.

:func:`plan_rewrite` checks the options against the snapshot and splits the work;
:func:`read_records` turns one read task into RocksDB-shaped records at their new key groups;
:func:`write_part` writes one output part (a canonical key-group file); :func:`write_metadata`
writes ``_metadata`` last. :func:`rewrite_local` does all of it in one process. The rules are in
``docs/flink-format.md`` §10.
"""

from state_engine.flink.rewrite.options import RewriteOptions, RewriteRefused
from state_engine.flink.rewrite.plan import OutputPart, ReadTask, RewritePlan, plan_rewrite
from state_engine.flink.rewrite.records import (
    PartWritten,
    read_records,
    rewrite_local,
    write_metadata,
    write_part,
)

__all__ = [
    "OutputPart",
    "PartWritten",
    "ReadTask",
    "RewriteOptions",
    "RewritePlan",
    "RewriteRefused",
    "plan_rewrite",
    "read_records",
    "rewrite_local",
    "write_metadata",
    "write_part",
]
