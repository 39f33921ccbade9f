"""Sources: offsets, resumption from operator state at any parallelism, malformed records."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.backends.operator_state import OperatorStateBackend, group_by_subtask
from state_engine.errors import InvalidJob, MalformedRecord
from state_engine.runtime import (
    GeneratorSource,
    JsonlSource,
    ParquetSource,
    SourceReader,
    WatermarkStrategy,
)
from state_engine.runtime.sources import Source

WM = WatermarkStrategy("ts", max_out_of_orderness_ms=5)


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_all(reader: SourceReader) -> list[Any]:
    out = []
    while (rec := reader.poll()) is not None:
        out.append(rec.value)
    return out


def fresh_readers(source: Source, p: int) -> list[SourceReader]:
    readers = [SourceReader(source, OperatorStateBackend(i, p)) for i in range(p)]
    for j, part in enumerate(source.partitions()):
        readers[j % p].assign([part])
    return readers


def rescale(readers: list[SourceReader], source: Source, new_p: int) -> list[SourceReader]:
    """What a checkpoint and a restore at ``new_p`` do to the readers' operator state."""
    for r in readers:
        r.sync_offsets()  # the snapshot's synchronous phase: offsets into operator state
    rows = [row for r in readers for row in r.operator_state.snapshot_rows()]
    meta = readers[0].operator_state.state_meta()
    backends = OperatorStateBackend.restore_rescaled(
        group_by_subtask(rows, len(readers)), meta, new_p
    )
    return [SourceReader(source, b) for b in backends]


def gen_record(p: int, i: int, rng: Any) -> dict[str, Any]:
    return {"p": p, "i": i, "v": rng.randrange(1000), "ts": i * 10}


def test_generator_records_depend_on_position_only() -> None:
    src = GeneratorSource(3, 50, gen_record, seed=5, watermarks=WM)
    again = GeneratorSource(3, 50, gen_record, seed=5, watermarks=WM)
    other = GeneratorSource(3, 50, gen_record, seed=6, watermarks=WM)
    full = [r.value for r in src.open("gen-1", 0)]
    assert [r.value for r in again.open("gen-1", 17)] == full[17:]
    assert [r.value for r in other.open("gen-1", 0)] != full
    assert src.partitions() == ["gen-0", "gen-1", "gen-2"]
    with pytest.raises(InvalidJob, match="no partition 'gen-3'"):
        list(src.open("gen-3", 0))


def test_jsonl_byte_offsets_resume_exactly(tmp_path: Path) -> None:
    rows = [{"ts": i, "text": "é" * (i % 4)} for i in range(20)]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + "\n\n")
    src = JsonlSource(tmp_path, watermarks=WM)
    assert src.partitions() == ["a.jsonl"]
    raws = list(src.open("a.jsonl", 0))
    assert [r.value for r in raws] == rows
    # every next_offset is the byte where the next record starts
    for k in (1, 7, 19):
        assert [r.value for r in src.open("a.jsonl", raws[k].offset)] == rows[k:]
        assert raws[k - 1].next_offset == raws[k].offset
    assert list(src.open("a.jsonl", raws[-1].next_offset)) == []


def test_parquet_row_offsets_across_row_groups(tmp_path: Path) -> None:
    table = pa.table({"ts": list(range(25)), "name": [f"n{i}" for i in range(25)]})
    pq.write_table(table, tmp_path / "p0.parquet", row_group_size=4)
    src = ParquetSource(tmp_path, watermarks=WM)
    rows = table.to_pylist()
    for start in (0, 3, 4, 5, 24, 25):
        got = list(src.open("p0.parquet", start))
        assert [r.value for r in got] == rows[start:]
        assert [r.offset for r in got] == list(range(start, 25))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_malformed_record_fails_naming_file_and_offset(tmp_path: Path, fmt: str) -> None:
    if fmt == "jsonl":
        path = tmp_path / "bad.jsonl"
        path.write_text('{"ts": 1}\n{"ts": 2\n{"ts": 3}\n')
        src: Source = JsonlSource(path, watermarks=WM)
        where = "byte offset 10"
    else:
        path = tmp_path / "bad.parquet"
        pq.write_table(pa.table({"ts": [1, None, 3]}), path)
        src = ParquetSource(path, watermarks=WM)
        where = "row offset 1"
    reader = fresh_readers(src, 1)[0]
    assert reader.poll().value == {"ts": 1}  # type: ignore[union-attr]  # a record is ready
    with pytest.raises(MalformedRecord) as info:
        reader.poll()
    assert str(path) in str(info.value) and where in str(info.value)
    assert "on_malformed='skip'" in str(info.value)
    # the reader is not broken by it: the next poll reads on after the bad record
    assert reader.poll().value == {"ts": 3}  # type: ignore[union-attr]  # a record is ready
    assert reader.poll() is None


def test_malformed_records_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ts": 1}\nnot json\n{"no_ts": 2}\n{"ts": "x"}\n{"ts": 5}\n')
    src = JsonlSource(path, watermarks=WM, on_malformed="skip")
    reader = fresh_readers(src, 1)[0]
    assert read_all(reader) == [{"ts": 1}, {"ts": 5}]
    assert reader.records_skipped == 3 and reader.records_read == 2


def test_source_refuses_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(InvalidJob, match="found no files"):
        JsonlSource(tmp_path, watermarks=WM)
    with pytest.raises(InvalidJob, match="'fail' or 'skip'"):
        GeneratorSource(1, 1, gen_record, watermarks=WM, on_malformed="ignore")
    with pytest.raises(InvalidJob, match="max_out_of_orderness_ms"):
        WatermarkStrategy("ts", max_out_of_orderness_ms=-1)


@settings(max_examples=40, deadline=None)
@given(
    partitions=st.integers(1, 7),
    old_p=st.integers(1, 5),
    new_p=st.integers(1, 5),
    cut=st.integers(0, 120),
)
def test_offsets_survive_a_rescale_exactly_once(
    partitions: int, old_p: int, new_p: int, cut: int
) -> None:
    src = GeneratorSource(partitions, 17, gen_record, seed=1, watermarks=WM)
    readers = fresh_readers(src, old_p)
    seen: list[tuple[int, int]] = []
    # round-robin over subtasks as the runner does, stopping at an arbitrary record
    while len(seen) < cut and not all(r.finished for r in readers):
        for r in readers:
            if len(seen) == cut:
                break
            rec = r.poll()
            if rec is not None:
                seen.append((rec.value["p"], rec.value["i"]))
    restored = rescale(readers, src, new_p)
    held = [r.partitions for r in restored]
    assert sorted(p for ps in held for p in ps) == sorted(src.partitions())
    for r in restored:
        seen.extend((rec["p"], rec["i"]) for rec in read_all(r))
    assert Counter(seen) == Counter((p, i) for p in range(partitions) for i in range(17))


def test_offsets_reach_operator_state_only_when_synced() -> None:
    src = GeneratorSource(2, 5, gen_record, seed=1, watermarks=WM)
    reader = fresh_readers(src, 1)[0]
    before = list(reader.operator_state.snapshot_rows())
    for _ in range(3):
        assert reader.poll() is not None
    # per record nothing is written to operator state: the offsets are plain values
    assert list(reader.operator_state.snapshot_rows()) == before
    assert {p: reader.offset(p) for p in reader.partitions} == {"gen-0": 2, "gen-1": 1}
    reader.sync_offsets()
    restored = SourceReader(src, reader.operator_state)
    assert {p: restored.offset(p) for p in restored.partitions} == {"gen-0": 2, "gen-1": 1}
    rest = sorted((r["p"], r["i"]) for r in read_all(reader))
    assert rest == sorted((r["p"], r["i"]) for r in read_all(restored)) and len(rest) == 7
