"""The canonical Parquet format: key-group-aligned row groups, an index that never lies, and
restores that read only their key groups."""

from __future__ import annotations

import os
import struct
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.errors import ChecksumMismatch, InvalidStateRows, SnapshotFileMismatch
from state_engine.snapshot.canonical import (
    KEYED_SCHEMA,
    OPERATOR_SCHEMA,
    CanonicalWriter,
    OperatorStateEntry,
    read_entries,
    read_key_groups,
    read_operator_state,
    write_operator_state,
)
from state_engine.snapshot.metadata import (
    FileKind,
    OperatorSnapshot,
    SnapshotMetadata,
    SubtaskSnapshot,
    read_metadata,
    verify,
    write_metadata,
)
from state_engine.snapshot.storage import CheckpointStorage, ReadStats, SnapshotDir
from state_engine.snapshot_enums import SnapshotFormat, SnapshotKind
from state_engine.state.meta import StateEntry

MakeRows = Callable[..., list[StateEntry]]
WriteSnapshot = Callable[..., tuple[SnapshotDir, SnapshotMetadata]]

MAX_P = 32

entries = st.builds(
    StateEntry,
    key_group=st.integers(0, MAX_P - 1),
    key_hash=st.integers(-(2**31), 2**31 - 1),
    key=st.binary(max_size=12),
    namespace=st.sampled_from([b"", b"ns-1", b"\x00\xff"]),
    state=st.sampled_from(["counts", "seen", "ünïcode"]),
    user_key=st.none() | st.binary(max_size=6),
    value=st.binary(max_size=60),
    expires_at=st.none() | st.integers(-(2**63), 2**63 - 1),
)
sorted_rows = st.lists(entries, max_size=300).map(lambda rs: sorted(rs, key=lambda r: r.key_group))
# a few big key groups, to exercise key groups that span row groups and files
skewed_rows = st.lists(
    st.tuples(st.integers(0, MAX_P - 1), st.integers(1, 120)), min_size=1, max_size=5
).map(
    lambda spec: [
        StateEntry(kg, 7, b"k%d" % i, b"", "s", None, b"v" * 30, None)
        for kg, n in sorted(spec)
        for i in range(n)
    ]
)


def _row_groups_per_key_group(snap: SnapshotDir, path: str) -> tuple[dict[int, set[int]], int]:
    with snap.open_input(path) as raw:
        pf = pq.ParquetFile(raw)
        found: dict[int, set[int]] = defaultdict(set)
        for rg in range(pf.num_row_groups):
            for kg in set(pf.read_row_group(rg, columns=["key_group"]).column(0).to_pylist()):
                found[kg].add(rg)
        return found, pf.num_row_groups


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.one_of(sorted_rows, skewed_rows),
    parallelism=st.integers(1, 3),
    row_group_bytes=st.sampled_from([1, 200, 2000, 1 << 20]),
    target_file_bytes=st.sampled_from([1, 3000, 1 << 30]),
    batch_rows=st.sampled_from([1, 7, 4096]),
    asked=st.tuples(st.integers(0, MAX_P - 1), st.integers(0, MAX_P - 1)).map(sorted),
)
def test_any_key_group_range_reads_back_exactly_its_rows(
    storage: CheckpointStorage,
    write_snapshot: WriteSnapshot,
    rows: list[StateEntry],
    parallelism: int,
    row_group_bytes: int,
    target_file_bytes: int,
    batch_rows: int,
    asked: list[int],
) -> None:
    snap, meta = write_snapshot(
        rows,
        job=f"job-{uuid.uuid4().hex}",
        max_parallelism=MAX_P,
        parallelism=parallelism,
        row_group_bytes=row_group_bytes,
        target_file_bytes=target_file_bytes,
        batch_rows=batch_rows,
    )
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    assert sum(f.rows or 0 for f in meta.files) == len(rows)
    assert list(read_entries(snap, meta, (0, MAX_P - 1))) == rows
    first, last = asked
    assert list(read_entries(snap, meta, (first, last))) == [
        r for r in rows if first <= r.key_group <= last
    ]
    for f in meta.files:
        actual, n_row_groups = _row_groups_per_key_group(snap, f.path)
        for kg, row_groups in actual.items():
            # the index names exactly the row groups that hold the key group
            assert set(f.row_groups_for(kg, kg)) == row_groups
            # a key group spread over several row groups has them to itself
            if len(row_groups) > 1:
                for rg in row_groups:
                    assert [k for k, rgs in actual.items() if rg in rgs] == [kg]
        assert n_row_groups == max((r.last_row_group for r in f.key_groups), default=-1) + 1


def test_a_quarter_of_the_key_groups_reads_a_quarter_of_the_bytes(
    write_snapshot: WriteSnapshot, make_rows: MakeRows
) -> None:
    # ~1.8 MB of incompressible rows over 128 key groups, written by one subtask into one file.
    # Row groups target 8 KiB, so a range over-reads at most ~2 row groups (~1% of a quarter).
    rows = make_rows(128, 100, value_bytes=120)
    snap, meta = write_snapshot(rows, parallelism=1, row_group_bytes=8 << 10)
    (data_file,) = meta.files
    total = data_file.size
    footer = _footer_overhead(snap, data_file.path)
    for quarter in range(4):
        first, last = quarter * 32, quarter * 32 + 31
        stats = ReadStats()
        got = list(read_entries(snap, meta, (first, last), stats=stats))
        assert got == [r for r in rows if first <= r.key_group <= last]
        assert stats.files_opened == 1
        assert stats.bytes_read <= 1.10 * total / 4 + footer, (quarter, stats, total)


def test_a_restore_opens_only_the_files_of_its_range(
    write_snapshot: WriteSnapshot, make_rows: MakeRows
) -> None:
    rows = make_rows(128, 20, value_bytes=50)
    snap, meta = write_snapshot(rows, parallelism=4, row_group_bytes=4 << 10)
    stats = ReadStats()
    # key groups 40..50 lie in subtask 1's range (32..63) only
    got = list(read_entries(snap, meta, (40, 50), stats=stats))
    assert Counter(r.key_group for r in got) == {kg: 20 for kg in range(40, 51)}
    assert stats.files_opened == 1
    whole = meta.files_of(None)[1].size
    assert stats.bytes_read <= 11 / 32 * whole * 1.10 + _footer_overhead(
        snap, meta.files_of(None)[1].path
    )


def _footer_overhead(snap: SnapshotDir, path: str) -> int:
    """What opening a Parquet file costs: pyarrow reads the last 64 KiB, and when the footer is
    longer than that, it reads the whole footer again."""
    size = snap.size_of(path)
    with snap.open_input(path) as f:
        f.seek(size - 8)
        footer = struct.unpack("<i", f.read(4))[0] + 8
    first_read = min(size, 64 << 10)
    return first_read + (footer if footer > first_read else 0)


def test_key_group_statistics_count_every_row(
    storage: CheckpointStorage, make_rows: MakeRows
) -> None:
    rows = make_rows(128, 5)[:-3]
    with CanonicalWriter(storage.checkpoint("job", 1), subtask=0, max_parallelism=128) as w:
        w.write(rows)
    stats = w.finish().key_group_stats
    assert {kg: s.rows for kg, s in stats.items()} == Counter(r.key_group for r in rows)
    for kg, s in stats.items():
        logical = sum(
            16
            + len(r.key)
            + len(r.namespace)
            + len(r.state.encode())
            + len(r.value)
            + len(r.user_key or b"")
            for r in rows
            if r.key_group == kg
        )
        assert s.bytes == logical


def test_arrow_batches_round_trip_through_write_batch(
    storage: CheckpointStorage, write_snapshot: WriteSnapshot, make_rows: MakeRows
) -> None:
    rows = make_rows(128, 6)
    snap, meta = write_snapshot(rows, parallelism=2, row_group_bytes=1024)
    copy = storage.checkpoint("job", 2)
    with CanonicalWriter(copy, subtask=0, max_parallelism=128, row_group_bytes=4096) as w:
        for batch in read_key_groups(snap, meta, (0, 127)):
            assert batch.schema.equals(KEYED_SCHEMA)
            w.write_batch(batch)
    files = w.finish().files
    copied = list(read_entries(copy, _one_subtask_meta(files, checkpoint_id=2), (0, 127)))
    assert copied == rows


def test_reading_selected_columns(write_snapshot: WriteSnapshot, make_rows: MakeRows) -> None:
    rows = make_rows(128, 3)
    snap, meta = write_snapshot(rows, row_group_bytes=500)
    batches = list(read_key_groups(snap, meta, (10, 12), columns=["key", "value"]))
    table = pa.Table.from_batches(batches)
    assert table.column_names == ["key", "value"]
    assert table.column("key").to_pylist() == [r.key for r in rows if 10 <= r.key_group <= 12]


def _one_subtask_meta(files, checkpoint_id: int = 1) -> SnapshotMetadata:
    return SnapshotMetadata(
        job="job",
        checkpoint_id=checkpoint_id,
        kind=SnapshotKind.CHECKPOINT,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=128,
        parallelism=1,
        operators=(
            OperatorSnapshot(
                "op", None, {}, (SubtaskSnapshot(0, (0, 127), tuple(f.path for f in files)),)
            ),
        ),
        files=tuple(files),
    )


def test_no_rows_write_no_files(storage: CheckpointStorage) -> None:
    with CanonicalWriter(storage.checkpoint("job", 1), subtask=0, max_parallelism=128) as w:
        w.write([])
    assert w.finish().files == ()
    assert storage.list_files("job") == []


def _row(kg: int, **changes: Any) -> tuple[Any, ...]:
    return tuple(StateEntry(kg, 1, b"k", b"", "s", None, b"v", None)._replace(**changes))


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        ([[_row(3), _row(2)]], "out of key-group order: key group 2 after 3"),
        ([[_row(3)], [_row(1)]], "out of key-group order: key group 1 after 3"),
        ([[_row(200)]], "outside subtask 0's key-group range 0..127"),
        ([[_row(-1)]], "outside subtask 0's key-group range"),
        ([[_row(1)[:7]]], "must have 8 fields"),
        ([[_row(1), (*_row(1), 5)]], "must have 8 fields"),
        ([[_row(1, key=None)]], "'key' of rows .* holds None"),
        ([[_row(1, value=None)]], "'value' of rows .* holds None"),
        ([[_row(1, key_hash=2**31)]], "'key_hash'"),
        ([[_row(1, key_group="1")]], "'key_group'"),
        ([[_row(1, state=b"\xff\xfe")]], "'state'"),
        ([[_row(1, state=5)]], "'state'"),
    ],
)
def test_bad_rows_are_refused_and_leave_nothing_behind(
    storage: CheckpointStorage, batches: list[list[tuple[Any, ...]]], message: str
) -> None:
    snap = storage.checkpoint("job", 1)
    good = [_row(0, key=b"k%d" % i, value=b"x" * 100) for i in range(200)]
    with (
        pytest.raises(InvalidStateRows, match=message),
        CanonicalWriter(snap, subtask=0, max_parallelism=128, row_group_bytes=100) as w,
    ):
        w.write(good)  # some row groups already on storage
        for batch in batches:
            w.write(batch)
    assert storage.list_files("job") == []
    with pytest.raises(InvalidStateRows, match="already finished or aborted"):
        w.write([_row(5)])


def test_writer_refuses_a_range_outside_max_parallelism(storage: CheckpointStorage) -> None:
    with pytest.raises(InvalidStateRows, match="not within 0..127"):
        CanonicalWriter(
            storage.checkpoint("job", 1), subtask=0, max_parallelism=128, key_group_range=(0, 128)
        )


def test_reading_a_range_outside_max_parallelism_is_refused(
    write_snapshot: WriteSnapshot, make_rows: MakeRows
) -> None:
    snap, meta = write_snapshot(make_rows(128, 1))
    with pytest.raises(InvalidStateRows, match="not within 0..127"):
        list(read_key_groups(snap, meta, (100, 128)))


def test_shared_directory_files_for_checkpoints(
    storage: CheckpointStorage, make_rows: MakeRows
) -> None:
    snap = storage.checkpoint("job", 1)
    with CanonicalWriter(snap, subtask=0, max_parallelism=128, directory="../shared") as w:
        w.write(make_rows(128, 2))
    files = w.finish().files
    assert all(f.path.startswith("../shared/keyed-0-") for f in files)
    write_metadata(snap, None, _one_subtask_meta(files))
    assert list(read_entries(snap, read_metadata(snap), (0, 127))) == make_rows(128, 2)
    storage.discard(snap)
    assert [f.path.split("/")[0] for f in storage.list_files("job")] == ["shared"]


def test_operator_state_round_trip(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    rows_0 = [("offsets", "SPLIT", 0, i, b"o%d" % i) for i in range(3)]
    rows_1 = [("offsets", "SPLIT", 1, 0, b"p"), ("rules", "BROADCAST", 1, 0, b"r")]
    f0 = write_operator_state(snap, rows_0, subtask=0)
    f1 = write_operator_state(snap, rows_1, subtask=1)
    union = write_operator_state(snap, [("seen", "UNION", 0, 0, b"u")])
    meta = SnapshotMetadata(
        job="job",
        checkpoint_id=1,
        kind=SnapshotKind.CHECKPOINT,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=128,
        parallelism=2,
        operators=(
            OperatorSnapshot(
                "source",
                None,
                {},
                (
                    SubtaskSnapshot(0, (0, 63), (f0.path,)),
                    SubtaskSnapshot(1, (64, 127), (f1.path,)),
                ),
                operator_state_files=(union.path,),
            ),
        ),
        files=(f0, f1, union),
    )
    write_metadata(snap, None, meta)
    meta = read_metadata(snap)
    verify(snap, meta, deep=True)
    assert read_operator_state(snap, meta) == sorted(
        (OperatorStateEntry(*r) for r in [*rows_0, *rows_1, ("seen", "UNION", 0, 0, b"u")]),
        key=lambda e: (e.state, e.subtask, e.index),
    )
    with snap.open_input(f0.path) as raw:
        assert pq.ParquetFile(raw).schema_arrow.equals(OPERATOR_SCHEMA)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([("s", "SPREAD", 0, 0, b"v")], "mode.*SPREAD.*allowed: SPLIT, UNION, BROADCAST"),
        ([("s", "SPLIT", 0, 0)], "must have 5 fields"),
        ([("s", "SPLIT", None, 0, b"v")], "'subtask'"),
    ],
)
def test_bad_operator_state_rows_are_refused(
    storage: CheckpointStorage, rows: list[tuple[Any, ...]], message: str
) -> None:
    with pytest.raises(InvalidStateRows, match=message):
        write_operator_state(storage.checkpoint("job", 1), rows)
    assert storage.list_files("job") == []


def test_a_corrupt_page_or_footer_is_refused_naming_file_and_snapshot(
    write_snapshot: WriteSnapshot, make_rows: MakeRows
) -> None:
    snap, meta = write_snapshot(make_rows(128, 20, value_bytes=200))
    f = max((f for f in meta.files if f.kind is FileKind.KEYED), key=lambda f: f.size)
    path, fs = snap.resolve(f.path), snap.fs
    good = fs.cat_file(path)
    whole = (0, 127)
    assert sum(b.num_rows for b in read_key_groups(snap, meta, whole)) == 128 * 20
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0x01  # inside a data page: its CRC no longer matches
    fs.pipe_file(path, bytes(damaged))
    with pytest.raises(ChecksumMismatch, match=f"{f.path}.*{snap.url}.*another snapshot"):
        list(read_key_groups(snap, meta, whole))
    damaged = bytearray(good)
    # The footer's length (no page CRC covers the footer): a decode error. A footer byte that
    # still decodes is left to whole-file checksums (statectl verify, verify_checksums=True).
    damaged[-6] ^= 0x55
    fs.pipe_file(path, bytes(damaged))
    with pytest.raises(SnapshotFileMismatch, match=f"{f.path}.*{snap.url}.*another snapshot"):
        list(read_key_groups(snap, meta, whole))


@pytest.mark.parametrize(
    "value,codec",
    [(lambda i: os.urandom(64), "UNCOMPRESSED"), (lambda i: b'{"n": %d}' % i * 8, "ZSTD")],
    ids=["random values stay raw", "json values are compressed"],
)
def test_value_bytes_that_zstd_cannot_shrink_are_written_raw(
    write_snapshot: WriteSnapshot, value: Callable[[int], bytes], codec: str
) -> None:
    rows = [StateEntry(kg, kg, b"key-%d" % i, b"", "s", None, value(i), None)
            for i, kg in enumerate(sorted(i % MAX_P for i in range(4000)))]  # fmt: skip
    snap, meta = write_snapshot(
        rows, job=f"job-{uuid.uuid4().hex}", max_parallelism=MAX_P, parallelism=1,
        row_group_bytes=16 << 10,
    )  # fmt: skip
    for f in meta.files:
        with snap.fs.open(snap.resolve(f.path), "rb") as fh:
            md = pq.ParquetFile(fh).metadata
        codecs = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i).compression
                  for i in range(md.num_columns)}  # fmt: skip
        assert codecs["value"] == codec and codecs["key"] == "ZSTD"
    assert list(read_entries(snap, read_metadata(snap), (0, MAX_P - 1))) == rows
