"""Key-group write ranges: what one task of a maintenance job is given, and what it hands back.

A job splits the key-group space into *write ranges*: each subtask's Flink key-group range cut
into ``m`` contiguous pieces, so there are enough tasks to keep every core busy even when the
snapshot has one subtask. A subtask's files are then its pieces' files in key-group order, which
is the order a restore reads them in. Tasks run this module too: it loads no catalog.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from state_engine.errors import InvalidJobParams
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.snapshot.canonical import (
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_TARGET_FILE_BYTES,
    KeyGroupStats,
)
from state_engine.snapshot.metadata import SnapshotFile
from state_engine.snapshot.storage import SnapshotDir


@dataclass(frozen=True)
class TargetSpec:
    """Where the tasks write: a snapshot directory URL (fsspec) and the writer's sizing."""

    url: str
    max_parallelism: int
    allow_shared: bool = True
    storage_options: dict[str, Any] = field(default_factory=dict)
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES

    def open(self) -> SnapshotDir:
        return SnapshotDir.from_url(
            self.url, self.storage_options or None, allow_shared=self.allow_shared
        )


@dataclass(frozen=True)
class WriteRange:
    """Key groups ``first..last`` of ``operator``, written as part of ``subtask``'s files."""

    operator: str
    subtask: int
    first: int
    last: int


@dataclass(frozen=True)
class RangeOutput:
    """What one task wrote for one write range."""

    range: WriteRange
    files: tuple[SnapshotFile, ...]
    key_group_stats: dict[int, KeyGroupStats]
    rows_in: int = 0
    bytes_in: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_out(self) -> int:
        return sum(f.rows or 0 for f in self.files)

    @property
    def bytes_out(self) -> int:
        return sum(f.size for f in self.files)


def plan_write_ranges(
    max_parallelism: int, parallelism: int, operators: Sequence[str], min_tasks: int = 1
) -> list[WriteRange]:
    """Every operator's subtask ranges, each cut into enough pieces for ``min_tasks`` tasks.

    The pieces are the Flink ranges at parallelism ``parallelism * m``: since
    ``floor(floor(x * m) / m) == floor(x)``, each piece lies inside one subtask's range.
    """
    if not 1 <= parallelism <= max_parallelism:
        raise InvalidJobParams(
            f"parallelism {parallelism} is not within 1..{max_parallelism} (max parallelism)"
        )
    if not operators:
        raise InvalidJobParams("no operator to write: the snapshot holds no keyed operator")
    per_op = max(1, math.ceil(min_tasks / len(operators)))
    m = max(1, min(math.ceil(per_op / parallelism), max_parallelism // parallelism))
    pieces = parallelism * m
    out = []
    for op in operators:
        for i in range(pieces):
            rng = compute_key_group_range_for_operator_index(max_parallelism, pieces, i)
            out.append(WriteRange(op, i // m, rng.start, rng.end))
    return out
