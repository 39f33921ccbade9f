"""One source subtask: the partitions it reads, their offsets (operator state) and its watermark.

Offsets are a SPLIT list state through :class:`SourceOffsets`, so after a restore at any
parallelism each partition is read by exactly one subtask, from its checkpointed offset.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from state_engine.backends.operator_state import OperatorStateBackend, SourceOffsets
from state_engine.runtime.sources import MalformedPolicy, PartitionReader, Source
from state_engine.runtime.watermarks import PartitionWatermarks


@dataclass(slots=True)
class SourceRecord:
    value: Any
    timestamp: int
    partition: str


class SourceReader:
    """Reads its partitions round-robin, one record at a time, so no partition races ahead and
    holds the others' records back behind a watermark it alone would have moved."""

    def __init__(self, source: Source, operator_state: OperatorStateBackend) -> None:
        self.source = source
        self.operator_state = operator_state
        self.subtask_index = operator_state.subtask_index
        self.offsets = SourceOffsets(operator_state)
        self.watermarks = PartitionWatermarks(source.watermarks.max_out_of_orderness_ms)
        self._assign_ts = source.watermarks.assigner()
        self._skip = source.on_malformed is MalformedPolicy.SKIP
        self._readers: dict[str, PartitionReader | None] = {}
        self._active: list[str] = []
        self._next = 0
        self.records_read = 0
        self.records_skipped = 0
        for partition in self.offsets.partitions():
            self._activate(partition)

    def assign(self, partitions: Iterable[str]) -> None:
        """Start reading partitions no subtask held in the restored state (or all, when fresh)."""
        for partition in self.offsets.assign(partitions):
            self._activate(partition)

    def _activate(self, partition: str) -> None:
        self._readers[partition] = None  # opened on first poll: restores stay cheap
        self._active.append(partition)
        self.watermarks.add_partition(partition)

    @property
    def partitions(self) -> list[str]:
        return self.offsets.partitions()

    @property
    def finished(self) -> bool:
        return not self._active

    def poll(self) -> SourceRecord | None:
        """The next record of the next partition in turn; None once every partition has ended."""
        while self._active:
            if self._next >= len(self._active):
                self._next = 0
            partition = self._active[self._next]
            reader = self._readers[partition]
            if reader is None:
                reader = self.source.open(partition, self.offsets.offset(partition))
                self._readers[partition] = reader
            raw = next(reader, None)
            if raw is None:
                self._finish(partition)
                continue
            self.offsets.advance(partition, raw.next_offset)
            ts: int | None = None
            error = raw.error
            if error is None:
                try:
                    ts = self._assign_ts(raw.value)
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    error = f"no timestamp ({type(exc).__name__}: {exc})"
                else:
                    if type(ts) is not int:
                        error = f"timestamp {ts!r} is not an int of epoch milliseconds"
            if error is not None:
                if not self._skip:
                    raise self.source.malformed(partition, raw.offset, error)
                self.records_skipped += 1
                continue
            assert ts is not None
            self._next += 1
            self.records_read += 1
            self.watermarks.on_record(partition, ts)
            return SourceRecord(raw.value, ts, partition)
        return None

    def _finish(self, partition: str) -> None:
        self._active.remove(partition)
        reader = self._readers.pop(partition, None)
        if reader is not None:
            reader.close()
        self.watermarks.finish(partition)

    def close(self) -> None:
        for partition in list(self._active):
            reader = self._readers.get(partition)
            if reader is not None:
                reader.close()
        self._readers.clear()
