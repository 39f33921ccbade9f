"""The canonical snapshot format: backend-independent Parquet, indexed by key group.

Keyed files hold :class:`StateEntry` rows sorted by key group. Row groups are aligned to key
groups: a row group holds either whole consecutive key groups (small ones share, up to the
row-group target) or a slice of one large key group, which then spans consecutive row groups
exclusively. ``_metadata`` records per file which row groups hold which key groups, so a restore
at any parallelism reads only its key groups' row groups.

Row-group sizing: a subtask reading a key-group range over-reads at most the part of one row
group at each end of its range (per file), so the waste is <= 2 * ``row_group_bytes`` per file
it opens. The default (1 MiB of uncompressed row data) keeps that under 10% once a subtask's
share is over ~20 MiB per file, while the per-row-group footer cost (~1-2 KiB) stays under 0.2%.
Small snapshots should pass a smaller ``row_group_bytes``.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from state_engine.errors import (
    ChecksumMismatch,
    CorruptMetadata,
    InvalidStateRows,
    SnapshotFileMismatch,
    StatekeeperError,
)
from state_engine.snapshot.metadata import (
    FileKind,
    KeyGroupRun,
    SnapshotFile,
    SnapshotMetadata,
)
from state_engine.snapshot.operator_rows import OperatorStateRow
from state_engine.snapshot.storage import ReadStats, SnapshotDir, SnapshotFileWriter
from state_engine.state.meta import StateColumns, StateEntry

# The name the checkpoint package has always exported for the operator-state row.
OperatorStateEntry = OperatorStateRow


KEYED_SCHEMA = pa.schema(
    [
        pa.field("key_group", pa.int32(), nullable=False),
        pa.field("key_hash", pa.int32(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("namespace", pa.binary(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("user_key", pa.binary()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("expires_at", pa.int64()),
    ]
)

OPERATOR_SCHEMA = pa.schema(
    [
        pa.field("state", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("subtask", pa.int32(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
OPERATOR_STATE_MODES = ("SPLIT", "UNION", "BROADCAST")

DEFAULT_ROW_GROUP_BYTES = 1 << 20
DEFAULT_TARGET_FILE_BYTES = 128 << 20
DEFAULT_BATCH_ROWS = 16384
# zstd level 1 writes as fast as snappy here and ~35% smaller; dictionary encoding pays off only
# for `state` (few distinct names), keys and values are mostly unique.
DEFAULT_COMPRESSION = "zstd"
DEFAULT_COMPRESSION_LEVEL = 1
# Parquet pages are buffered in Arrow (C++) and reach the Python sink a few MiB at a time: every
# call into the sink re-takes the GIL, and with the task thread busy each re-take waits up to a
# switch interval (5 ms), so a page-sized write per call made a checkpoint's write phase wait
# more than it worked.
WRITE_BUFFER_BYTES = 4 << 20
# Logical size of the fixed-width columns of one row (two int32 and one int64).
_FIXED_ROW_BYTES = 16


@dataclass(frozen=True)
class KeyGroupStats:
    """Rows and logical (uncompressed) bytes of one key group, for the catalog."""

    rows: int
    bytes: int


@dataclass(frozen=True)
class WrittenFiles:
    """What a writer produced: the ``_metadata`` file entries and per-key-group statistics."""

    files: tuple[SnapshotFile, ...]
    key_group_stats: dict[int, KeyGroupStats]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    @property
    def rows(self) -> int:
        return sum(f.rows or 0 for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


_INT_TYPES: dict[pa.DataType, Any] = {
    pa.int8(): np.int8,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
}
_NONE = type(None)


def _from_buffers(values: Sequence[Any], type_: pa.DataType) -> pa.Array | None:
    """``values`` as an Arrow array built from NumPy buffers, or None to let ``pa.array`` decide.

    Why not just ``pa.array``: on a Python sequence it asks pandas whether the input is a pandas
    object, which imports pandas (1-2 s on the checkpoint thread, holding the GIL, stalling the
    job at its first checkpoint; also on every ``to_numpy``). This handles the types the
    canonical and delta schemas use; anything unusual (other types, out of range, bad text) goes
    to ``pa.array``, whose errors the caller turns into :class:`InvalidStateRows`.
    """
    n = len(values)
    types = set(map(type, values))
    has_null = _NONE in types
    types.discard(_NONE)
    if has_null and not types:
        return pa.nulls(n, type_)  # e.g. expires_at of states without TTL
    validity = None
    if has_null:
        mask = np.fromiter(map(operator.is_not, values, repeat(None)), dtype=np.bool_, count=n)
        validity = pa.py_buffer(np.packbits(mask, bitorder="little"))
    dtype = _INT_TYPES.get(type_)
    if dtype is not None:
        if not types <= {int}:
            return None
        ints = [0 if v is None else v for v in values] if has_null else values
        try:
            wide = np.fromiter(ints, dtype=np.int64, count=n)
        except OverflowError:
            return None
        data = wide.astype(dtype)
        if dtype is not np.int64 and n and not np.array_equal(data, wide):
            return None  # out of the column's range: pa.array names the problem
        return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)])
    if type_ == pa.binary():
        if not types <= {bytes}:
            return None
        vals = [b"" if v is None else v for v in values] if has_null else values
    elif type_ == pa.string():
        if not types <= {str}:
            return None
        try:
            # few distinct strings (state names, modes): encode each once
            enc = {v: v.encode() for v in set(values) if v is not None}
        except UnicodeEncodeError:
            return None
        vals = [b"" if v is None else enc[v] for v in values]
    else:
        return None
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, vals), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        return None  # over the 32-bit offsets of binary/string: pa.array chunks or refuses
    buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(vals))]
    return pa.Array.from_buffers(type_, n, buffers)


def _pa_array(values: Sequence[Any], field: pa.Field, where: str) -> pa.Array:
    try:
        arr = _from_buffers(values, field.type)
        if arr is None:
            arr = pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise InvalidStateRows(
            f"column {field.name!r} ({field.type}) of rows for snapshot {where} cannot be "
            f"converted: {exc}; pass rows in the StateEntry field order and types"
        ) from exc
    if not field.nullable and arr.null_count:
        raise InvalidStateRows(
            f"column {field.name!r} of rows for snapshot {where} holds None; only user_key and "
            "expires_at may be None"
        )
    return arr


def int_values(arr: pa.Array | pa.ChunkedArray, null: int = 0) -> np.ndarray:
    """An integer Arrow array's values (nulls as ``null``) as NumPy, without ``to_numpy`` or
    ``fill_null`` (which import pandas, see :func:`_from_buffers`)."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return int_values(arr.chunk(0), null)
        return np.concatenate([int_values(c, null) for c in arr.chunks])
    t = arr.type
    dtype = np.dtype(f"{'u' if pa.types.is_unsigned_integer(t) else ''}int{t.bit_width}")
    n, off = len(arr), arr.offset
    data = arr.buffers()[1]
    if data is None:
        return np.full(n, null, dtype=dtype)
    out = np.frombuffer(data, dtype=dtype, count=off + n)[off:]
    if arr.null_count:
        out = np.where(is_valid(arr), out, null).astype(dtype)
    return out


def arrow_array(values: np.ndarray | Sequence[Any], type_: pa.DataType | None = None) -> pa.Array:
    """A NumPy bool/integer array, or a list of bytes, as Arrow without ``pa.array`` (which imports
    pandas to look for pandas objects: seconds in every fresh Spark Python worker)."""
    if isinstance(values, np.ndarray):
        values = np.ascontiguousarray(values)
        n = len(values)
        if values.dtype == np.bool_:
            bits = pa.py_buffer(np.packbits(values, bitorder="little"))
            return pa.Array.from_buffers(pa.bool_(), n, [None, bits])
        type_ = pa.from_numpy_dtype(values.dtype)
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(values)])
    type_ = type_ or pa.binary()
    arr = _from_buffers(values, type_)
    if arr is None:
        raise TypeError(f"cannot build an Arrow {type_} array from {type(values).__name__}")
    return arr


def bool_values(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array's values (nulls as False) as NumPy (pandas-free, see
    :func:`int_values`)."""
    if isinstance(arr, pa.ChunkedArray):
        return np.concatenate([bool_values(c) for c in arr.chunks] or [np.zeros(0, bool)])
    n, off = len(arr), arr.offset
    data = arr.buffers()[1]
    if data is None or n == 0:
        return np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    out = bits[off : off + n].astype(bool)
    if arr.null_count:
        out &= is_valid(arr)
    return out


def is_valid(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True per non-null row, as NumPy (pandas-free, see :func:`int_values`)."""
    if isinstance(arr, pa.ChunkedArray):
        return np.concatenate([is_valid(c) for c in arr.chunks])
    n, off = len(arr), arr.offset
    if not arr.null_count:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[off : off + n].astype(bool)


def binary_lengths(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Byte length per row of a binary/string column (nulls 0), from its offsets."""
    if isinstance(arr, pa.ChunkedArray):
        return np.concatenate([binary_lengths(c) for c in arr.chunks])
    n, off = len(arr), arr.offset
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=off + n + 1)[off:]
    lengths = np.diff(offsets).astype(np.int64)
    if arr.null_count:
        # a null slot's offsets may differ (Arrow leaves them unspecified): count it as empty
        lengths[~is_valid(arr)] = 0
    return lengths


class _SinkWrites:
    """The sink as ParquetWriter's raw stream: writes go through, but closing it is ours."""

    closed = False

    def __init__(self, sink: SnapshotFileWriter) -> None:
        self.write = sink.write
        self.tell = sink.tell

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True


class CanonicalWriter:
    """Stream rows of one subtask, in key-group order, into key-group-aligned Parquet files.

    ``directory`` is where the files go, relative to the snapshot (``""`` or e.g.
    ``"../shared"`` for a checkpoint). Use as a context manager, or call :meth:`finish`
    (success) or :meth:`abort` (removes every file written so far). ``on_open(path)`` is called
    before each file is created (a writer in another process reports its files this way).
    """

    schema: pa.Schema = KEYED_SCHEMA
    kind: FileKind = FileKind.KEYED

    def __init__(
        self,
        snapshot: SnapshotDir,
        *,
        subtask: int,
        max_parallelism: int,
        key_group_range: tuple[int, int] | None = None,
        directory: str = "",
        file_prefix: str | None = None,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        compression: str = DEFAULT_COMPRESSION,
        compression_level: int | None = DEFAULT_COMPRESSION_LEVEL,
        chain_index: int | None = None,
        on_open: Callable[[str], None] | None = None,
    ) -> None:
        first, last = key_group_range if key_group_range is not None else (0, max_parallelism - 1)
        if not (0 <= first <= last < max_parallelism):
            raise InvalidStateRows(
                f"key-group range {key_group_range} of subtask {subtask} for snapshot "
                f"{snapshot.url} is not within 0..{max_parallelism - 1}"
            )
        if row_group_bytes <= 0 or target_file_bytes <= 0 or batch_rows <= 0:
            raise InvalidStateRows(
                "row_group_bytes, target_file_bytes and batch_rows must be positive; got "
                f"{row_group_bytes}, {target_file_bytes}, {batch_rows}"
            )
        self._snap = snapshot
        self._where = snapshot.url
        self._subtask = subtask
        self._first_kg = first
        self._last_kg = last
        self._directory = directory.strip("/")
        self._prefix = file_prefix or f"{self.kind.value}-{subtask}"
        self._rg_bytes = row_group_bytes
        self._file_bytes = target_file_bytes
        self._batch_rows = batch_rows
        self._compression = compression
        self._compression_level = None if compression == "none" else compression_level
        self._chain_index = chain_index
        self._on_open = on_open
        n_kg = last - first + 1
        self._kg_rows = np.zeros(n_kg, dtype=np.int64)
        self._kg_bytes = np.zeros(n_kg, dtype=np.int64)
        self._prev_kg = -1
        # pending rows (not yet in a row group): batches plus their key groups and row sizes
        self._pending: list[pa.RecordBatch] = []
        self._pending_kg = np.empty(0, dtype=np.int32)
        self._pending_size = np.empty(0, dtype=np.int64)
        self._inside_split = False  # the next row group continues a key group already split
        # current file
        self._sink: SnapshotFileWriter | None = None
        self._stream: Any = None  # the buffered stream between the Parquet writer and the sink
        self._pq: pq.ParquetWriter | None = None
        self._file_rgs: list[tuple[int, int]] = []  # (first_kg, last_kg) per row group
        self._file_rows = 0
        self._written: list[SnapshotFile] = []
        self._done = False
        self._result: WrittenFiles | None = None

    # --- input ---

    def write(self, rows: Iterable[Sequence[Any]]) -> None:
        """Append rows (tuples in schema order); call as often as needed."""
        width = len(self.schema)
        it = iter(rows)
        while chunk := list(itertools.islice(it, self._batch_rows)):
            widths = set(map(len, chunk))
            if widths != {width}:
                raise InvalidStateRows(
                    f"rows for snapshot {self._where} must have {width} fields "
                    f"({', '.join(self.schema.names)}), got rows with {sorted(widths)}"
                )
            columns = zip(*chunk, strict=True)
            arrays = [
                _pa_array(col, fld, self._where)
                for col, fld in zip(columns, self.schema, strict=True)
            ]
            self.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def write_columns(self, columns: Mapping[str, Sequence[Any]]) -> None:
        """Append rows given column by column: every schema field by name, equal lengths, in
        key-group order (``KeyedStateView.entry_columns`` chunks)."""
        missing = [f.name for f in self.schema if f.name not in columns]
        if missing:
            raise InvalidStateRows(
                f"columns for snapshot {self._where} lack {', '.join(missing)} (the schema has "
                f"{', '.join(self.schema.names)})"
            )
        lengths = {len(columns[f.name]) for f in self.schema}
        if len(lengths) != 1:
            raise InvalidStateRows(
                f"columns for snapshot {self._where} differ in length: {sorted(lengths)}"
            )
        arrays = [_pa_array(columns[f.name], f, self._where) for f in self.schema]
        self.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))

    def write_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Append rows already in Arrow form (schema as :attr:`schema`, key-group order)."""
        self._check_open()
        if isinstance(batch, pa.Table):
            for b in batch.to_batches():
                self.write_batch(b)
            return
        if batch.num_rows == 0:
            return
        if not batch.schema.equals(self.schema):
            try:
                batch = batch.cast(self.schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
                raise InvalidStateRows(
                    f"batch for snapshot {self._where} has schema {batch.schema}, not the "
                    f"canonical one ({', '.join(self.schema.names)}): {exc}"
                ) from exc
            for fld, col in zip(self.schema, batch.columns, strict=True):
                if not fld.nullable and col.null_count:
                    raise InvalidStateRows(
                        f"column {fld.name!r} of a batch for snapshot {self._where} holds nulls"
                    )
        self._validate_batch(batch)
        kg = int_values(batch.column(0))
        self._check_order(kg)
        size = _FIXED_ROW_BYTES + sum(
            binary_lengths(batch.column(name))
            for name in ("key", "namespace", "state", "user_key", "value")
        )
        size = size + self._extra_row_bytes(batch)
        local = kg - self._first_kg
        self._kg_rows += np.bincount(local, minlength=len(self._kg_rows))
        self._kg_bytes += np.bincount(local, weights=size, minlength=len(self._kg_bytes)).astype(
            np.int64
        )
        self._pending.append(batch)
        self._pending_kg = np.concatenate([self._pending_kg, kg])
        self._pending_size = np.concatenate([self._pending_size, size])
        self._cut_row_groups(final=False)

    def _extra_row_bytes(self, batch: pa.RecordBatch) -> int:
        return 0

    def _validate_batch(self, batch: pa.RecordBatch) -> None:
        """Format-specific row checks (subclasses)."""

    def _check_order(self, kg: np.ndarray) -> None:
        lo, hi = int(kg.min()), int(kg.max())
        if lo < self._first_kg or hi > self._last_kg:
            bad = lo if lo < self._first_kg else hi
            raise InvalidStateRows(
                f"row of key group {bad} for snapshot {self._where} is outside subtask "
                f"{self._subtask}'s key-group range {self._first_kg}..{self._last_kg}"
            )
        if kg[0] < self._prev_kg or (len(kg) > 1 and bool(np.any(kg[1:] < kg[:-1]))):
            prev = np.concatenate([[self._prev_kg], kg[:-1]])
            i = int(np.flatnonzero(kg < prev)[0])
            raise InvalidStateRows(
                f"rows for snapshot {self._where} (subtask {self._subtask}) are out of key-group "
                f"order: key group {int(kg[i])} after {int(prev[i])}; sort rows by key group"
            )
        self._prev_kg = int(kg[-1])

    # --- row groups ---

    def _cut_row_groups(self, *, final: bool) -> None:
        while (n := len(self._pending_kg)) > 0:
            kg = self._pending_kg
            boundaries = np.flatnonzero(kg[1:] != kg[:-1]) + 1
            cum = np.cumsum(self._pending_size)
            e = int(np.searchsorted(cum, self._rg_bytes, side="left"))
            reached = e < n
            end = e + 1 if reached else n
            if reached and end == n and not final:
                return  # the next row decides whether `end` is a key-group boundary
            if self._inside_split:
                first_b = boundaries[boundaries <= min(end, n - 1)]
                if len(first_b):
                    cut, inside = int(first_b[0]), False
                elif reached:
                    cut, inside = end, end < n and kg[end] == kg[end - 1]
                elif final:
                    cut, inside = n, False
                else:
                    return
            elif not reached:
                if not final:
                    return
                cut, inside = n, False
            elif end == n or kg[end] != kg[end - 1]:
                cut, inside = end, False
            else:
                last_b = boundaries[boundaries <= e]
                if len(last_b):
                    cut, inside = int(last_b[-1]), False
                else:
                    cut, inside = end, True
            self._emit(cut)
            self._inside_split = bool(inside)

    def _emit(self, cut: int) -> None:
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        group = table.slice(0, cut)
        rest = table.slice(cut)
        first_kg, last_kg = int(self._pending_kg[0]), int(self._pending_kg[cut - 1])
        self._pending = rest.to_batches() if rest.num_rows else []
        self._pending_kg = self._pending_kg[cut:]
        self._pending_size = self._pending_size[cut:]
        if self._pq is None:
            self._open_file(group)
        assert self._pq is not None and self._sink is not None
        self._pq.write_table(group, row_group_size=cut)
        self._file_rgs.append((first_kg, last_kg))
        self._file_rows += cut
        if self._stream.tell() >= self._file_bytes:
            self._close_file()

    def _codecs(self, sample: pa.Table) -> dict[str, Any]:
        """Compression per column for a new file: the writer's codec, except for byte columns
        whose sample (the file's first row group) it does not shrink (random or already
        compressed values): compressing those would cost time on every write and read."""
        if self._compression == "none":
            return {"compression": "none", "compression_level": None}
        codecs: dict[str, str] = {}
        for name in sample.schema.names:
            codecs[name] = self._compression
            if name in _INCOMPRESSIBLE_CANDIDATES and _incompressible(sample.column(name)):
                codecs[name] = "none"
        levels = (
            None
            if self._compression_level is None
            else {n: self._compression_level for n, c in codecs.items() if c != "none"}
        )
        return {"compression": codecs, "compression_level": levels}

    def _open_file(self, sample: pa.Table) -> None:
        name = self._snap.new_file_name(self._prefix, ".parquet")
        path = f"{self._directory}/{name}" if self._directory else name
        if self._on_open is not None:
            self._on_open(path)
        self._sink = self._snap.create(path)
        self._stream = pa.BufferedOutputStream(
            pa.PythonFile(_SinkWrites(self._sink), mode="w"), buffer_size=WRITE_BUFFER_BYTES
        )
        self._pq = pq.ParquetWriter(
            self._stream,
            self.schema,
            **self._codecs(sample),
            use_dictionary=["state"],
            write_statistics=["key_group"],
            write_page_checksum=True,  # a restore verifies every page it reads
        )
        self._file_rgs = []
        self._file_rows = 0

    def _close_file(self) -> None:
        assert self._pq is not None and self._sink is not None
        self._pq.close()
        if not self._stream.closed:
            self._stream.close()  # flushes the buffer into the sink (whose close stays ours)
        info = self._sink.close()
        self._written.append(
            SnapshotFile(
                path=info.path,
                size=info.size,
                checksum=info.checksum,
                kind=self.kind,
                rows=self._file_rows,
                key_groups=_runs(self._file_rgs),
                chain_index=self._chain_index,
            )
        )
        self._pq = None
        self._sink = None

    # --- end ---

    def finish(self) -> WrittenFiles:
        """Flush the last row group, close the files and return what was written.

        Calling it again returns the same result (the context manager finishes on exit).
        """
        if self._result is not None:
            return self._result
        self._check_open()
        try:
            self._cut_row_groups(final=True)
            if self._pq is not None:
                self._close_file()
        except BaseException:
            self.abort()
            raise
        self._done = True
        stats = {
            self._first_kg + int(i): KeyGroupStats(int(self._kg_rows[i]), int(self._kg_bytes[i]))
            for i in np.flatnonzero(self._kg_rows)
        }
        self._result = WrittenFiles(tuple(self._written), stats)
        return self._result

    def abort(self) -> None:
        """Stop and remove every file this writer wrote; nothing is left behind."""
        if self._done:
            return
        self._done = True
        if self._pq is not None:
            # the file is removed below; a close failure must not hide the original error
            with contextlib.suppress(Exception):
                self._pq.close()
        if self._sink is not None:
            self._sink.abort()
        for f in self._written:
            self._snap.remove_file(f.path)
        self._written = []

    def _check_open(self) -> None:
        if self._done:
            raise InvalidStateRows(
                f"writer for snapshot {self._where} (subtask {self._subtask}) is already "
                "finished or aborted; start a new writer"
            )

    def __enter__(self) -> CanonicalWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finish()


#: Columns whose bytes may well not compress (serialized user values and keys).
_INCOMPRESSIBLE_CANDIDATES = frozenset({"value", "user_key", "key"})
#: Bytes of a column's sample compressed to decide, and the ratio above which it stays raw.
_SAMPLE_BYTES = 64 << 10
_KEEP_RAW_ABOVE = 0.95


def _incompressible(column: pa.ChunkedArray) -> bool:
    """Whether zstd leaves a sample of ``column``'s bytes almost as large as it found them."""
    chunks = [c for c in column.chunks if len(c)]
    if not chunks:
        return False
    data = chunks[0].buffers()[2]
    if data is None or data.size < 4096:
        return False  # too little to judge: keep the codec
    sample = data[: min(data.size, _SAMPLE_BYTES)]
    raw: int = sample.size
    compressed: int = pa.compress(sample, codec="zstd", asbytes=False).size
    return compressed > _KEEP_RAW_ABOVE * raw


def _runs(row_groups: list[tuple[int, int]]) -> tuple[KeyGroupRun, ...]:
    """Index runs from each row group's (first_kg, last_kg); a split key group merges into one."""
    runs: list[KeyGroupRun] = []
    for rg, (first, last) in enumerate(row_groups):
        prev = runs[-1] if runs else None
        if (
            prev is not None
            and first == last == prev.first_key_group == prev.last_key_group
            and prev.last_row_group == rg - 1
        ):
            runs[-1] = KeyGroupRun(first, last, prev.first_row_group, rg)
        else:
            runs.append(KeyGroupRun(first, last, rg, rg))
    return tuple(runs)


# --- reading ---


def _ranged_files(
    meta: SnapshotMetadata, operator: str | None, kinds: Iterable[FileKind]
) -> list[SnapshotFile]:
    op = meta.operator(operator)
    kinds = set(kinds)
    by_path = {f.path: f for f in meta.files}
    seen: set[str] = set()
    out: list[SnapshotFile] = []
    for st in sorted(op.subtasks, key=lambda s: (s.key_group_range, s.index)):
        for path in st.files:
            f = by_path[path]
            if f.kind in kinds and path not in seen:
                seen.add(path)
                out.append(f)
    return out


def open_parquet(source: Any) -> pq.ParquetFile:
    """A snapshot's Parquet file, every page verified against its CRC as it is read (files
    written before page checksums carry none, and read as before)."""
    return pq.ParquetFile(source, page_checksum_verification=True)


@contextlib.contextmanager
def parquet_errors(snapshot: SnapshotDir, path: str) -> Iterator[None]:
    """Turn Arrow's decode errors (which name neither file nor snapshot) into one that does."""
    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, StatekeeperError):
            raise
        if "CRC" in str(exc) or "checksum" in str(exc).lower():
            raise ChecksumMismatch(
                f"file {path!r} of snapshot {snapshot.url} failed its Parquet page checksum "
                f"({exc}); its content is corrupt: restore from another snapshot"
            ) from exc
        raise SnapshotFileMismatch(
            f"file {path!r} of snapshot {snapshot.url} cannot be read as Parquet ({exc}); it is "
            "corrupt or not a snapshot file: restore from another snapshot"
        ) from exc


def read_key_groups(
    snapshot: SnapshotDir,
    meta: SnapshotMetadata,
    key_group_range: tuple[int, int],
    *,
    operator: str | None = None,
    columns: Sequence[str] | None = None,
    stats: ReadStats | None = None,
    kinds: Iterable[FileKind] = (FileKind.KEYED,),
    files: Sequence[SnapshotFile] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the rows of key groups ``first..last`` (inclusive), in key-group order.

    Opens only the files whose index overlaps the range and reads only the row groups that
    hold those key groups; rows of neighbouring key groups sharing a row group are dropped.
    ``files`` restricts the read to those files (default: the operator's files of ``kinds``).
    """
    first, last = key_group_range
    if not 0 <= first <= last < meta.max_parallelism:
        raise InvalidStateRows(
            f"key-group range {key_group_range} asked of snapshot {snapshot.url} is not within "
            f"0..{meta.max_parallelism - 1}"
        )
    read_cols = None
    if columns is not None:
        read_cols = list(dict.fromkeys(["key_group", *columns]))
    for f in _ranged_files(meta, operator, kinds) if files is None else files:
        row_groups = f.row_groups_for(first, last)
        if not row_groups:
            continue
        with snapshot.open_input(f.path, stats) as raw:
            with parquet_errors(snapshot, f.path):
                pf = open_parquet(raw)
            if row_groups[-1] >= pf.num_row_groups:
                raise CorruptMetadata(
                    f"_metadata of snapshot {snapshot.url} indexes row group {row_groups[-1]} "
                    f"of {f.path!r}, which has {pf.num_row_groups}; restore from another snapshot"
                )
            for rg in row_groups:
                with parquet_errors(snapshot, f.path):
                    table = pf.read_row_group(rg, columns=read_cols)
                if stats is not None:
                    stats.row_groups_read += 1
                kg = table.column("key_group")
                lo, hi = pc.min_max(kg).values()
                if lo.as_py() < first or hi.as_py() > last:
                    table = table.filter(
                        pc.and_(pc.greater_equal(kg, first), pc.less_equal(kg, last))
                    )
                if columns is not None:
                    table = table.select(list(columns))
                yield from table.to_batches()


def batches_to_entries(batches: Iterable[pa.RecordBatch]) -> Iterator[StateEntry]:
    """Turn canonical keyed batches into :class:`StateEntry` tuples."""
    for batch in batches:
        cols = [batch.column(name).to_pylist() for name in KEYED_SCHEMA.names]
        yield from map(StateEntry._make, zip(*cols, strict=True))


def as_table(batches: Iterable[pa.RecordBatch], schema: pa.Schema = KEYED_SCHEMA) -> pa.Table:
    """Batches (of any files, whose schemas may differ in order or nullability) as one table of
    ``schema``."""
    tables = [
        pa.Table.from_batches([b]).select(schema.names).cast(schema) for b in batches if b.num_rows
    ]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def state_columns(table: pa.Table, sort_states: Collection[str] = ()) -> Iterator[StateColumns]:
    """A canonical table's rows as one :class:`StateColumns` per state (its columns Arrow
    arrays), in table order; the rows of the states in ``sort_states`` sorted by (key group,
    key, namespace, user key), which puts list elements in position order."""
    if table.num_rows == 0:
        return
    enc = pc.dictionary_encode(table.column("state").combine_chunks())
    names = enc.dictionary.to_pylist()
    codes = int_values(enc.indices)
    for i, name in enumerate(names):
        part = table if len(names) == 1 else table.take(arrow_array(np.flatnonzero(codes == i)))
        if name in sort_states:
            order = ("key_group", "key", "namespace", "user_key")
            part = part.sort_by([(c, "ascending") for c in order])
        yield StateColumns(
            name,
            *(part.column(c).combine_chunks() for c in KEYED_SCHEMA.names if c != "state"),
        )


def read_entries(
    snapshot: SnapshotDir,
    meta: SnapshotMetadata,
    key_group_range: tuple[int, int],
    *,
    operator: str | None = None,
    stats: ReadStats | None = None,
) -> Iterator[StateEntry]:
    """:func:`read_key_groups` as :class:`StateEntry` tuples."""
    return batches_to_entries(
        read_key_groups(snapshot, meta, key_group_range, operator=operator, stats=stats)
    )


# --- operator state ---


def write_operator_state(
    snapshot: SnapshotDir,
    rows: Iterable[Sequence[Any]],
    *,
    subtask: int | None = None,
    directory: str = "",
    on_open: Callable[[str], None] | None = None,
) -> SnapshotFile:
    """Write operator-state rows ``(state, mode, subtask, index, value)`` as one Parquet file.

    ``on_open(path)`` is called before the file is created (see :class:`CanonicalWriter`)."""
    rows = list(rows)
    where = snapshot.url
    bad_width = [r for r in rows if len(r) != len(OPERATOR_SCHEMA)]
    if bad_width:
        raise InvalidStateRows(
            f"operator-state rows for snapshot {where} must have 5 fields (state, mode, subtask, "
            f"index, value); got {bad_width[0]!r}"
        )
    columns: list[Sequence[Any]] = (
        list(zip(*rows, strict=True)) if rows else [[] for _ in OPERATOR_SCHEMA]
    )
    arrays = [_pa_array(c, fld, where) for c, fld in zip(columns, OPERATOR_SCHEMA, strict=True)]
    modes = set(arrays[1].to_pylist())
    if not modes <= set(OPERATOR_STATE_MODES):
        raise InvalidStateRows(
            f"operator-state rows for snapshot {where} have mode(s) "
            f"{sorted(modes - set(OPERATOR_STATE_MODES))}; allowed: "
            f"{', '.join(OPERATOR_STATE_MODES)}"
        )
    table = pa.Table.from_arrays(arrays, schema=OPERATOR_SCHEMA)
    prefix = "operator" if subtask is None else f"operator-{subtask}"
    name = snapshot.new_file_name(prefix, ".parquet")
    path = f"{directory.strip('/')}/{name}" if directory.strip("/") else name
    # Encoded in memory and handed over in one write (operator state is small): see
    # WRITE_BUFFER_BYTES for what each write into the Python sink costs.
    buf = pa.BufferOutputStream()
    pq.write_table(
        table,
        buf,
        compression=DEFAULT_COMPRESSION,
        use_dictionary=["state", "mode"],
        write_page_checksum=True,
    )
    data = buf.getvalue()
    if on_open is not None:
        on_open(path)
    info = snapshot.write_file(path, lambda sink: sink.write(data))
    return SnapshotFile(
        path=info.path,
        size=info.size,
        checksum=info.checksum,
        kind=FileKind.OPERATOR,
        rows=table.num_rows,
    )


def read_operator_state(
    snapshot: SnapshotDir,
    meta: SnapshotMetadata,
    *,
    operator: str | None = None,
    stats: ReadStats | None = None,
) -> list[OperatorStateEntry]:
    """Every operator-state row of an operator, across its files, in (state, subtask, index)."""
    out: list[OperatorStateEntry] = []
    op = meta.operator(operator)
    paths = list(op.operator_state_files) + [
        p for s in op.subtasks for p in s.files if meta.file(p).kind is FileKind.OPERATOR
    ]
    for path in dict.fromkeys(paths):
        with snapshot.open_input(path, stats) as raw, parquet_errors(snapshot, path):
            table = open_parquet(raw).read()
        cols = [table.column(name).to_pylist() for name in OPERATOR_SCHEMA.names]
        out.extend(map(OperatorStateEntry._make, zip(*cols, strict=True)))
    out.sort(key=lambda e: (e.state, e.subtask, e.index))
    return out
