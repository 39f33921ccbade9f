"""One source subtask: the partitions it reads, their offsets (operator state) and its watermark.

Offsets are a SPLIT list state through :class:`SourceOffsets`, so after a restore at any
parallelism each partition is read by exactly one subtask, from its checkpointed offset. While
records flow they are plain ints in a dict; :meth:`SourceReader.sync_offsets` writes them into the
operator state in the snapshot's synchronous phase only, as Flink's source readers do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
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
        #: where the next read starts in the round (a position in _active)
        self._next = 0
        self.records_read = 0
        self.records_skipped = 0
        # next offset per partition since the last sync_offsets (plain ints: no state write
        # per record)
        self._pos: dict[str, int] = {}
        #: the partition of the record :meth:`next_record` returned last
        self.partition = ""
        for partition in self.offsets.partitions():
            self._activate(partition)
        #: the next record: ``(value, timestamp)`` of the next partition in turn (its partition
        #: in :attr:`partition`), or None while every partition has ended
        self.next_record: Callable[[], tuple[Any, int] | None] = self._records().__next__

    def assign(self, partitions: Iterable[str]) -> None:
        """Start reading partitions no subtask held in the restored state (or all, when fresh)."""
        for partition in self.offsets.assign(partitions):
            self._activate(partition)

    def follow(self, positions: Iterable[tuple[str, int]]) -> None:
        """Read partitions from the given offsets: the reader of a subtask another process
        runs, kept here so this process sees the stream in the same order."""
        for partition, offset in positions:
            for added in self.offsets.assign([partition], offset):
                self._activate(added)

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
        got = self.next_record()
        if got is None:
            return None
        return SourceRecord(got[0], got[1], self.partition)

    def _records(self) -> Iterator[tuple[Any, int] | None]:
        """:meth:`next_record`'s generator: ``(value, timestamp)`` of the next partition in turn,
        its partition in :attr:`partition`; None while every partition has ended. It never
        ends: partitions :meth:`assign` adds later are read on. Its state lives in locals, so
        the per-record path looks up no attributes."""
        active, readers, pos = self._active, self._readers, self._pos
        on_record = self.watermarks.on_record
        assign_ts, skip = self._assign_ts, self._skip
        i = self._next
        try:
            while True:
                if not active:
                    yield None
                    continue
                if i >= len(active):
                    i = 0
                partition = active[i]
                reader = readers[partition]
                if reader is None:
                    reader = self.source.open(partition, self.offset(partition))
                    readers[partition] = reader
                raw = next(reader, None)
                if raw is None:
                    self._finish(partition)  # the next partition moves up to position i
                    continue
                pos[partition] = raw.next_offset
                if raw.error is None:
                    try:
                        ts = assign_ts(raw.value)
                    except (KeyError, IndexError, TypeError, ValueError) as exc:
                        error = f"no timestamp ({type(exc).__name__}: {exc})"
                    else:
                        if type(ts) is int:
                            i += 1
                            self.records_read += 1
                            on_record(partition, ts)
                            self.partition = partition
                            yield raw.value, ts
                            continue
                        error = f"timestamp {ts!r} is not an int of epoch milliseconds"
                else:
                    error = raw.error
                if not skip:
                    raise self.source.malformed(partition, raw.offset, error)
                self.records_skipped += 1
        except GeneratorExit:
            raise
        except BaseException:
            # A malformed record or the source's own error ends this generator, not the
            # reader: the next call continues with the same partition, after what failed.
            self._next = i
            self.next_record = self._records().__next__
            raise

    def offset(self, partition: str) -> int:
        """The next offset to read in ``partition`` (synced or not)."""
        pos = self._pos.get(partition)
        return self.offsets.offset(partition) if pos is None else pos

    def sync_offsets(self) -> None:
        """Write the offsets read since the last sync into the operator state (the snapshot's
        synchronous phase calls this: between two snapshots nobody reads that state)."""
        pos = self._pos
        if pos:
            advance = self.offsets.advance
            for partition, offset in pos.items():
                advance(partition, offset)
            pos.clear()

    def _finish(self, partition: str) -> None:
        # the end offset stays in _pos until the next sync: the snapshot must record it
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
