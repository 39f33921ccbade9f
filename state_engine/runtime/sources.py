"""Partitioned, replayable sources: JSON-lines files, Parquet files and a deterministic generator.

A source is a list of named partitions, each readable from an offset (Flink's splits). Where a
subtask is in each partition lives in operator state (see :mod:`.source_reader`), so a source here
only has to open a partition at an offset and say where the next record starts.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from state_engine.errors import InvalidJob, MalformedRecord
from state_engine.runtime.watermarks import WatermarkStrategy


class MalformedPolicy(Enum):
    """What a source does with a record it cannot parse or timestamp."""

    FAIL = "fail"
    SKIP = "skip"


@dataclass(slots=True)
class RawRecord:
    """One record as read: where it starts, where the next one starts, the value or the problem.

    Not frozen, though nobody changes one after it is read: a source builds one per record, and a
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs 3.5x as much.
    """

    offset: int
    next_offset: int
    value: Any
    error: str | None = None


PartitionReader = Generator[RawRecord, None, None]


class Source(ABC):
    """A bounded, partitioned source whose partitions can be re-read from any offset."""

    def __init__(self, watermarks: WatermarkStrategy, on_malformed: MalformedPolicy | str) -> None:
        if not isinstance(watermarks, WatermarkStrategy):
            raise InvalidJob(
                f"watermarks must be a WatermarkStrategy, got {type(watermarks).__name__}: pass "
                "WatermarkStrategy(timestamp='ts', max_out_of_orderness_ms=...)"
            )
        try:
            self.on_malformed = MalformedPolicy(on_malformed)
        except ValueError:
            raise InvalidJob(
                f"on_malformed must be 'fail' or 'skip', got {on_malformed!r}"
            ) from None
        self.watermarks = watermarks

    @abstractmethod
    def partitions(self) -> list[str]:
        """The partition names, in a stable order (a new partition is appended)."""

    @abstractmethod
    def open(self, partition: str, offset: int) -> PartitionReader:
        """The records of ``partition`` from ``offset`` (an offset a RawRecord gave, or 0)."""

    @abstractmethod
    def describe(self, partition: str, offset: int) -> str:
        """Where a record is, for error messages (file and offset)."""

    def malformed(self, partition: str, offset: int, why: str) -> MalformedRecord:
        return MalformedRecord(
            f"malformed record in {self.describe(partition, offset)}: {why}; fix the input, or "
            "build the source with on_malformed='skip' to skip and count such records"
        )


def _files(paths: str | Path | Iterable[str | Path], pattern: str) -> dict[str, Path]:
    """Partition name -> file. A directory gives its files matching ``pattern`` named by their
    path relative to it, so the names survive moving the directory."""
    if isinstance(paths, (str, Path)):
        root = Path(paths)
        if root.is_dir():
            found = sorted(p for p in root.glob(pattern) if p.is_file())
            return {p.relative_to(root).as_posix(): p for p in found}
        paths = [root]
    out: dict[str, Path] = {}
    for p in paths:
        path = Path(p)
        out.setdefault(path.as_posix(), path)
    return out


class _FileSource(Source):
    kind = "file"
    offset_unit = "record"

    def __init__(
        self,
        paths: str | Path | Iterable[str | Path],
        *,
        watermarks: WatermarkStrategy,
        on_malformed: MalformedPolicy | str,
        pattern: str,
    ) -> None:
        super().__init__(watermarks, on_malformed)
        self._files = _files(paths, pattern)
        if not self._files:
            raise InvalidJob(
                f"{type(self).__name__} found no files in {paths!r} (pattern {pattern!r}): "
                "pass a directory holding them, a file or a list of files"
            )
        for name, path in self._files.items():
            if not path.is_file():
                raise InvalidJob(f"{type(self).__name__} partition {name!r}: {path} is not a file")

    def partitions(self) -> list[str]:
        return list(self._files)

    def path(self, partition: str) -> Path:
        try:
            return self._files[partition]
        except KeyError:
            raise InvalidJob(
                f"{type(self).__name__} has no partition {partition!r} (it has "
                f"{sorted(self._files)}): a restored job must read the same files"
            ) from None

    def describe(self, partition: str, offset: int) -> str:
        return f"{self.kind} file {self.path(partition)} at {self.offset_unit} offset {offset}"


class JsonlSource(_FileSource):
    """JSON-lines files, one partition per file; the offset is a byte offset (blank lines are
    skipped, not records)."""

    kind = "JSONL"
    offset_unit = "byte"

    def __init__(
        self,
        paths: str | Path | Iterable[str | Path],
        *,
        watermarks: WatermarkStrategy,
        on_malformed: MalformedPolicy | str = MalformedPolicy.FAIL,
        pattern: str = "*.jsonl",
    ) -> None:
        super().__init__(paths, watermarks=watermarks, on_malformed=on_malformed, pattern=pattern)

    def open(self, partition: str, offset: int) -> PartitionReader:
        path = self.path(partition)
        with path.open("rb") as f:
            f.seek(offset)
            pos = offset
            for line in f:
                start, pos = pos, pos + len(line)
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as exc:
                    yield RawRecord(start, pos, None, f"not JSON ({exc})")
                    continue
                yield RawRecord(start, pos, value)


class ParquetSource(_FileSource):
    """Parquet files, one partition per file; the offset is the row index. Rows are dicts."""

    kind = "Parquet"
    offset_unit = "row"

    def __init__(
        self,
        paths: str | Path | Iterable[str | Path],
        *,
        watermarks: WatermarkStrategy,
        on_malformed: MalformedPolicy | str = MalformedPolicy.FAIL,
        pattern: str = "*.parquet",
    ) -> None:
        super().__init__(paths, watermarks=watermarks, on_malformed=on_malformed, pattern=pattern)

    def open(self, partition: str, offset: int) -> PartitionReader:
        path = self.path(partition)
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise MalformedRecord(
                f"{self.kind} file {path} cannot be opened ({exc}): the whole partition is "
                "unreadable; replace the file"
            ) from exc
        first = 0
        with pf:
            for group in range(pf.num_row_groups):
                rows = pf.metadata.row_group(group).num_rows
                if first + rows <= offset:
                    first += rows  # whole row group before the offset: not even read
                    continue
                for i, row in enumerate(pf.read_row_group(group).to_pylist()):
                    index = first + i
                    if index >= offset:
                        yield RawRecord(index, index + 1, row)
                first += rows


RecordFunction = Callable[[int, int, random.Random], Any]


class GeneratorSource(Source):
    """``partitions`` partitions of ``records_per_partition`` records each, record ``i`` of
    partition ``p`` being ``record_fn(p, i, rng)`` with an rng seeded from (seed, p, i).

    Every record depends on its position only, so a partition re-read from any offset gives the
    same records: replays after a restore are exact.
    """

    def __init__(
        self,
        partitions: int,
        records_per_partition: int,
        record_fn: RecordFunction,
        *,
        seed: int = 0,
        watermarks: WatermarkStrategy,
        on_malformed: MalformedPolicy | str = MalformedPolicy.FAIL,
        name: str = "gen",
    ) -> None:
        super().__init__(watermarks, on_malformed)
        sizes = (("partitions", partitions), ("records_per_partition", records_per_partition))
        for what, n in sizes:
            if type(n) is not int or n < 0:
                raise InvalidJob(f"GeneratorSource {what} must be an int >= 0, got {n!r}")
        if not callable(record_fn):
            raise InvalidJob("GeneratorSource needs record_fn(partition, index, rng) -> record")
        self.count = partitions
        self.records_per_partition = records_per_partition
        self.record_fn = record_fn
        self.seed = int(seed)
        self.name = name

    def partitions(self) -> list[str]:
        return [f"{self.name}-{p}" for p in range(self.count)]

    def _index(self, partition: str) -> int:
        prefix, _, num = partition.rpartition("-")
        if prefix != self.name or not num.isdigit() or int(num) >= self.count:
            raise InvalidJob(
                f"generator {self.name!r} has no partition {partition!r} (it has "
                f"{self.name}-0..{self.name}-{self.count - 1})"
            )
        return int(num)

    def open(self, partition: str, offset: int) -> PartitionReader:
        p = self._index(partition)
        fn = self.record_fn
        base = (self.seed * 1_000_003 + p) * 4_294_967_311
        for i in range(offset, self.records_per_partition):
            yield RawRecord(i, i + 1, fn(p, i, random.Random(base + i)))

    def describe(self, partition: str, offset: int) -> str:
        return f"generator partition {partition!r} at record {offset}"
