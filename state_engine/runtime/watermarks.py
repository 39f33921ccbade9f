"""Event time: timestamp assignment and bounded out-of-orderness watermarks, per partition.

As Flink's ``WatermarkStrategy.forBoundedOutOfOrderness``: a partition's watermark is its largest
timestamp so far minus the allowed lateness minus one. A source subtask's watermark is the minimum
over its active partitions; finished partitions do not hold it back, and a subtask without active
partitions is idle and holds back nobody. A partition starts at :data:`MIN_WATERMARK`, so event
time does not move until every active partition has produced a record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from state_engine.errors import InvalidJob
from state_engine.state.ttl import INT64_MAX, INT64_MIN

MIN_WATERMARK = INT64_MIN
#: Emitted at the end of a bounded input: every event-time timer fires.
MAX_WATERMARK = INT64_MAX


def _field_assigner(name: str) -> Callable[[Any], int]:
    def assign(record: Any) -> int:
        timestamp: int = record[name]
        return timestamp

    assign.__name__ = f"field {name!r}"
    return assign


@dataclass(frozen=True)
class WatermarkStrategy:
    """How records get their event timestamp and how far out of order a partition may be.

    ``timestamp`` is a callable ``record -> int`` (epoch ms) or the name of a record field.
    """

    timestamp: Callable[[Any], int] | str
    max_out_of_orderness_ms: int = 0

    def __post_init__(self) -> None:
        if not (callable(self.timestamp) or isinstance(self.timestamp, str)):
            raise InvalidJob(
                f"timestamp must be a callable record -> int or a field name, got "
                f"{self.timestamp!r}"
            )
        bound = self.max_out_of_orderness_ms
        if type(bound) is not int or bound < 0:
            raise InvalidJob(
                f"max_out_of_orderness_ms must be an int >= 0, got {bound!r}: pass how many "
                "milliseconds a partition's records may arrive out of timestamp order"
            )

    def assigner(self) -> Callable[[Any], int]:
        ts = self.timestamp
        return _field_assigner(ts) if isinstance(ts, str) else ts


class PartitionWatermarks:
    """The watermark of one source subtask over the partitions it reads."""

    def __init__(self, max_out_of_orderness_ms: int) -> None:
        self._lag = max_out_of_orderness_ms + 1
        self._marks: dict[str, int] = {}
        self._finished: set[str] = set()
        self._current = MIN_WATERMARK
        # _dirty: the watermark may have moved (the record loop looks at it); _stale: _current
        # must be recomputed over every partition first
        self._dirty = False
        self._stale = False

    def add_partition(self, partition: str) -> None:
        self._marks.setdefault(partition, MIN_WATERMARK)
        self._dirty = self._stale = True

    def on_record(self, partition: str, timestamp: int) -> None:
        mark = timestamp - self._lag
        old = self._marks[partition]
        if mark > old:
            marks = self._marks
            marks[partition] = mark
            # Only the partition holding the minimum can move it: skip the scan otherwise.
            if old <= self._current:
                self._dirty = True
                if len(marks) == 1:
                    self._current = mark  # the only partition: its mark is the minimum
                else:
                    self._stale = True

    def finish(self, partition: str) -> None:
        if partition in self._marks:
            del self._marks[partition]
            self._finished.add(partition)
            self._dirty = self._stale = True

    @property
    def idle(self) -> bool:
        """No active partition: this subtask holds back no downstream watermark."""
        return not self._marks

    @property
    def current(self) -> int:
        """Minimum over active partitions; :data:`MAX_WATERMARK` when none is active."""
        if self._stale:
            self._current = min(self._marks.values()) if self._marks else MAX_WATERMARK
            self._stale = False
        self._dirty = False
        return self._current
