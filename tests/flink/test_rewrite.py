"""The Flink savepoint writer without a JVM: random keyed states written by it read back equal
through the existing readers; every rewrite of the fixture snapshots keeps their state; every
refusal that depends on the snapshot names what was wrong and writes nothing."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_engine.flink.metadata import FlinkSnapshotMetadata, read_metadata
from state_engine.flink.rewrite import (
    RewriteOptions,
    RewriteRefused,
    plan_rewrite,
    read_records,
    rewrite_local,
    write_metadata,
    write_part,
)
from state_engine.flink.rewrite.ids import operator_id_of_uid
from state_engine.flink.rewrite.keys import binary_row_hash, key_hasher
from state_engine.flink.rewrite.records import SCHEMA
from state_engine.flink.rewrite.source import header_bytes
from state_engine.flink.serializers import Buf, RowSerializer, _Scalar
from state_engine.flink.snapshot_state import snapshot_entries
from state_engine.hashing import java_string_hash, murmur_hash
from state_engine.keygroups import KeyGroupRange, assign_to_key_group
from tests.flink.conftest import FlinkFixtures


def _entries(meta: FlinkSnapshotMetadata) -> dict[tuple[Any, ...], Any]:
    out = {}
    for op, _, e in snapshot_entries(meta):
        value = sorted(e.value) if isinstance(e.value, list) else e.value
        out[(op.uid, e.state, e.key, e.namespace, e.user_key)] = (value, e.expires_at)
    return out


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("which", ["canonical", "native", "checkpoint"])
def test_every_fixture_snapshot_rescaled_reads_back_equal_at_its_new_key_groups(
    flink_fixtures: FlinkFixtures, tmp_path: Path, backend: str, which: str
) -> None:
    if which == "checkpoint":
        src = flink_fixtures.java_job(backend) / "chk-11"
    else:
        saves = sorted(flink_fixtures.java_savepoints(backend).iterdir())
        src = next(p for p in saves if read_metadata(str(p)).format == which)
    meta = read_metadata(str(src))
    report = rewrite_local(
        meta, RewriteOptions(max_parallelism=300, parallelism=3), None, str(tmp_path / "o")
    )
    out = read_metadata(str(tmp_path / "o"))
    assert (out.kind, out.format, out.version) == ("savepoint", "canonical", meta.version)
    assert _entries(out) == _entries(meta)
    assert {op.max_parallelism for op in out.operators} == {300}
    assert report["max_parallelism_changed"] == [op.uid or op.operator_id for op in meta.operators]
    for _, _, e in snapshot_entries(out):
        assert e.key_group == assign_to_key_group(e.key, 300)
    agg = out.operator("agg")
    assert [st.key_groups for st in agg.subtasks] == [
        KeyGroupRange(0, 99),
        KeyGroupRange(100, 199),
        KeyGroupRange(200, 299),
    ]
    # self-contained: every handle relative, inside the new directory
    for ref in out.file_references():
        assert ref.handle.type == "relative"
        assert Path(str(ref.handle.location)).parent == tmp_path / "o"


def test_operator_ids_follow_uids_as_flink_derives_them() -> None:
    assert operator_id_of_uid("agg") == "96eed58e350a66c179f06330f5425345"


def test_key_hashes_are_java_hash_codes() -> None:
    # values printed by Flink 2.3's JVM (RewriteHarness hash)
    row = RowSerializer("Row", None, (_Scalar("s", None, "string"), _Scalar("l", 8, "long")))
    hasher = key_hasher(row)
    assert hasher is not None
    assert hasher(Buf(bytes([0, 3]) + b"ab" + (5).to_bytes(8, "big"))) == 98213
    assert binary_row_hash(bytes.fromhex("000000000000000061620000000000820500000000000000")) == (
        -852472484
    )
    cases = {
        ("string", "abc"): 96354,
        ("long", -4294967309): 13,
        ("double", 1.5): 1073217536,
        ("float", -2.25): -1072693248,
        ("char", "x"): 120,
        ("boolean", True): 1231,
    }
    from state_engine.flink.rewrite.keys import scalar_hash

    for (kind, value), code in cases.items():
        assert scalar_hash(kind, value) == code


# --- round trip of random state ---


def _string_value(s: str) -> bytes:
    units = s.encode("utf-16-le", "surrogatepass")
    out = bytearray(_varint(len(units) // 2 + 1))
    for i in range(0, len(units), 2):
        out += _varint(units[i] | (units[i + 1] << 8))
    return bytes(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_I64 = struct.Struct(">q")
keys = st.text(min_size=0, max_size=12)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
states = st.dictionaries(
    keys,
    st.tuples(
        st.one_of(st.none(), longs),  # total
        st.dictionaries(keys, longs, max_size=3),  # merchants
        st.lists(longs, max_size=4),  # recent
        st.one_of(st.none(), st.tuples(longs, st.integers(0, 2**50))),  # lastSeen (value, ts)
    ),
    max_size=25,
)


@given(state=states, max_parallelism=st.sampled_from([2, 7, 127, 129, 1000, 32768]),
       parallelism=st.integers(1, 4))  # fmt: skip
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_random_keyed_state_written_reads_back_equal(
    flink_fixtures: FlinkFixtures, state: dict[str, Any], max_parallelism: int, parallelism: int
) -> None:
    parallelism = min(parallelism, max_parallelism)
    src = next(
        p
        for p in sorted(flink_fixtures.java_savepoints("hashmap").iterdir())
        if read_metadata(str(p)).format == "canonical"
    )
    meta = read_metadata(str(src))
    plan = plan_rewrite(
        meta, RewriteOptions(max_parallelism=max_parallelism, parallelism=parallelism)
    )
    agg = next(i for i, op in enumerate(meta.operators) if op.uid == "agg")
    ids = plan.operators[agg].state_ids
    rows: dict[int, list[tuple[int, int, bytes, bytes]]] = {
        i: [] for i, o in enumerate(plan.outputs)
    }
    parts = {o.subtask: i for i, o in enumerate(plan.outputs) if o.op == agg}
    ranges = {i: plan.outputs[i].key_groups for i in parts.values()}
    expected: dict[tuple[Any, ...], Any] = {}
    for key, (total, merchants, recent, last) in state.items():
        kg = murmur_hash(java_string_hash(key)) % max_parallelism
        part = next(i for i, r in ranges.items() if kg in r)
        k = _string_value(key) + b"\x00"
        add = rows[part].append
        if total is not None:
            add((kg, ids["total"], k, _I64.pack(total)))
            expected[("agg", "total", key, None, None)] = (total, None)
        for uk, v in merchants.items():
            add((kg, ids["merchants"], k + _string_value(uk), b"\x00" + _I64.pack(v)))
            expected[("agg", "merchants", key, None, uk)] = (v, None)
        if recent:
            add((kg, ids["recent"], k, b",".join(_I64.pack(v) for v in recent)))
            expected[("agg", "recent", key, None, None)] = (sorted(recent), None)
        if last is not None:
            add((kg, ids["lastSeen"], k, _I64.pack(last[1]) + _I64.pack(last[0])))
            expected[("agg", "lastSeen", key, None, None)] = (last[0], last[1])
    with tempfile.TemporaryDirectory(prefix="h35w-rt-") as out:
        written = []
        for i in range(len(plan.outputs)):
            got = sorted(rows[i], key=lambda r: (r[0], r[1], r[2]))
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array([i] * len(got), pa.int32()),
                    pa.array([r[0] for r in got], pa.int32()),
                    pa.array([r[1] for r in got], pa.int16()),
                    pa.array([r[2] for r in got], pa.binary()),
                    pa.array([r[3] for r in got], pa.binary()),
                ],
                schema=SCHEMA,
            )
            written.append(write_part(plan, i, [batch], None, out))
        write_metadata(plan, written, None, out)
        back = read_metadata(out)
        assert {k: v for k, v in _entries(back).items() if k[0] == "agg"} == expected
        # the canonical reader and the columnar one agree
        by_state = {
            (op.uid, e.state, e.key, e.user_key)
            for op, _, e in snapshot_entries(back, by_state=True)
            if op.uid == "agg"
        }
        assert by_state == {(a, s, k, u) for a, s, k, _, u in expected}


# --- refusals ---


@pytest.fixture
def canonical(flink_fixtures: FlinkFixtures) -> FlinkSnapshotMetadata:
    src = next(
        p
        for p in sorted(flink_fixtures.java_savepoints("rocksdb").iterdir())
        if read_metadata(str(p)).format == "canonical"
    )
    return read_metadata(str(src))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (RewriteOptions(max_parallelism=0), "max parallelism 0 is outside 1..32768"),
        (RewriteOptions(max_parallelism=32769), "max parallelism 32769 is outside 1..32768"),
        (RewriteOptions(max_parallelism=2, parallelism=3), "below the parallelism 3"),
        (RewriteOptions(max_parallelism=1), "below the parallelism 2"),
        (RewriteOptions(ttl={"nope": 5}), "--ttl state 'nope' is not a keyed state"),
        (RewriteOptions(ttl={"total": 5}), "state 'total' of operator agg has no TTL serializer"),
        (RewriteOptions(uids={"nope": "x"}), "operator uid 'nope' is not in snapshot"),
        (RewriteOptions(drop_operators=("nope",)), "operator uid 'nope' to drop is not in"),
        (RewriteOptions(drop_states=("agg/nope",)), "state 'agg/nope' to drop is in no keyed"),
        (RewriteOptions(uids={"agg": "sink"}), "new uid 'sink' of 'agg' is already an operator"),
    ],
)
def test_refusals_name_what_was_wrong(
    canonical: FlinkSnapshotMetadata, options: RewriteOptions, message: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(RewriteRefused) as info:
        rewrite_local(canonical, options, None, str(out))
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text
    assert not out.exists()


def test_a_key_type_without_a_reproducible_hash_is_refused_naming_its_serializer(
    canonical: FlinkSnapshotMetadata, tmp_path: Path
) -> None:
    # a savepoint whose keys are byte[] (hashCode is identity): the fixture's operator written
    # by the writer with that key serializer snapshot in its header
    plan = plan_rewrite(canonical, RewriteOptions(max_parallelism=200))
    agg = next(i for i, op in enumerate(canonical.operators) if op.uid == "agg")
    name = (
        "org.apache.flink.api.common.typeutils.base.array."
        "BytePrimitiveArraySerializer$BytePrimitiveArraySerializerSnapshot"
    )
    byte_keys = struct.pack(">iH", 2, len(name)) + name.encode() + struct.pack(">i", 3)
    pieces = dataclasses.replace(
        header_bytes(plan.operators[agg].header, "header"), key_serializer=byte_keys
    )
    header = pieces.build([name for name, _ in pieces.states])
    ops = list(plan.operators)
    ops[agg] = dataclasses.replace(ops[agg], header=header)
    plan = dataclasses.replace(plan, operators=tuple(ops))
    out = tmp_path / "bytes"
    parts = [write_part(plan, i, [], None, str(out)) for i in range(len(plan.outputs))]
    write_metadata(plan, parts, None, str(out))
    meta = read_metadata(str(out))
    with pytest.raises(RewriteRefused) as info:
        plan_rewrite(meta, RewriteOptions(max_parallelism=300))
    assert "BytePrimitiveArraySerializer" in str(info.value)
    assert "keep the max parallelism" in str(info.value)
    # at the same max parallelism the keys stay where they are: no hash needed
    assert plan_rewrite(meta, RewriteOptions(ttl={"lastSeen": 1}, at=0)).needs_rewrite


def test_a_parallelism_only_change_of_a_canonical_savepoint_needs_no_rewrite(
    canonical: FlinkSnapshotMetadata, tmp_path: Path
) -> None:
    report = rewrite_local(canonical, RewriteOptions(parallelism=5), None, str(tmp_path / "o"))
    assert report["needs_rewrite"] is False
    assert report["output_location"] is None
    assert "flink run -s" in report["notes"][0]
    assert not (tmp_path / "o").exists()


def test_ttl_cleanup_drops_entries_at_or_past_their_expiry(
    canonical: FlinkSnapshotMetadata, tmp_path: Path
) -> None:
    stamps = sorted({e.expires_at for _, _, e in snapshot_entries(canonical) if e.expires_at})
    at = stamps[len(stamps) // 2]
    rewrite_local(canonical, RewriteOptions(ttl={"lastSeen": 10}, at=at), None, str(tmp_path / "o"))
    before, after = _entries(canonical), _entries(read_metadata(str(tmp_path / "o")))
    want = {k: v for k, v in before.items() if k[1] != "lastSeen" or v[1] + 10 > at}
    assert after == want
    assert len(want) < len(before)


SNAPPY = Path(__file__).parent / "data" / "pyflink-snappy"


@pytest.mark.parametrize(
    "sub", ["java/rocksdb", "java/hashmap", "pyflink/rocksdb", "pyflink/hashmap"]
)
def test_flink_1_20_snapshots_rewrite_in_version_4_and_read_back_equal(
    flink_120: Path, tmp_path: Path, sub: str
) -> None:
    sources = sorted(p.parent for p in (flink_120 / sub).rglob("_metadata"))
    assert sources
    for i, src in enumerate(sources):
        meta = read_metadata(str(src))
        out = tmp_path / f"o{i}"
        rewrite_local(meta, RewriteOptions(max_parallelism=200), None, str(out))
        back = read_metadata(str(out))
        assert (back.version, back.format) == (4, "canonical")
        assert _entries(back) == _entries(meta), src


def test_compressed_snapshots_are_written_uncompressed_and_read_back_equal(tmp_path: Path) -> None:
    for i, src in enumerate(sorted(p.parent for p in SNAPPY.rglob("_metadata"))):
        meta = read_metadata(str(src))
        out = tmp_path / f"o{i}"
        rewrite_local(meta, RewriteOptions(max_parallelism=129), None, str(out))
        assert _entries(read_metadata(str(out))) == _entries(meta), src


@pytest.mark.parametrize(
    "options",
    [
        RewriteOptions(max_parallelism=300, parallelism=3),
        RewriteOptions(max_parallelism=100, ttl={"lastSeen": 10}, at=1 << 62),
        RewriteOptions(ttl={"lastSeen": 10}, drop_states=("merchants",)),
    ],
)
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_the_vectorised_read_writes_the_bytes_the_record_by_record_read_writes(
    flink_fixtures: FlinkFixtures,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    options: RewriteOptions,
) -> None:
    from state_engine.flink.rewrite import plan as plan_module
    from state_engine.flink.rewrite import records

    src = next(
        p
        for p in sorted(flink_fixtures.java_savepoints(backend).iterdir())
        if read_metadata(str(p)).format == "canonical"
    )
    meta = read_metadata(str(src))
    rewrite_local(meta, options, None, str(tmp_path / "fast"))
    tasks = len(plan_rewrite(meta, options).read_tasks)
    # read tasks of a few key groups each: the same bytes
    monkeypatch.setattr(plan_module, "TASK_BYTES", 64)
    assert len(plan_rewrite(meta, options).read_tasks) > tasks
    rewrite_local(meta, options, None, str(tmp_path / "split"))
    # key groups read and written a few records at a time (as large ones are): the same bytes
    monkeypatch.setattr(records, "_SLICE_ROWS", 3)
    rewrite_local(meta, options, None, str(tmp_path / "sliced"))
    monkeypatch.setattr(records, "_vectorised", lambda kh, header: False)
    rewrite_local(meta, options, None, str(tmp_path / "slow"))
    names = sorted(p.name for p in (tmp_path / "slow").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fast").iterdir())
    for name in names:
        slow = (tmp_path / "slow" / name).read_bytes()
        assert (tmp_path / "fast" / name).read_bytes() == slow, name
        assert (tmp_path / "split" / name).read_bytes() == slow, name
        assert (tmp_path / "sliced" / name).read_bytes() == slow, name


def _heap_and_compressed_sources(flink_fixtures: FlinkFixtures) -> list[Path]:
    return [
        flink_fixtures.java_job("hashmap") / "chk-11",  # heap key groups
        *sorted(p.parent for p in SNAPPY.rglob("_metadata")),  # snappy: canonical and heap
    ]


def test_heap_and_compressed_handles_are_read_a_key_group_range_per_task(
    flink_fixtures: FlinkFixtures, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heap or snappy-compressed handle is cut into key-group sub-ranges like an uncompressed
    canonical one (no task holds a whole handle): the same output bytes, and a task reads
    nothing of its handle outside its own key groups (the bytes of the others are garbage)."""
    from state_engine.flink.rewrite import plan as plan_module

    options = RewriteOptions(max_parallelism=300, parallelism=3)
    in_files = 0
    for i, src in enumerate(_heap_and_compressed_sources(flink_fixtures)):
        meta = read_metadata(str(src))
        rewrite_local(meta, options, None, str(tmp_path / f"whole-{i}"))
        with monkeypatch.context() as m:
            m.setattr(plan_module, "TASK_BYTES", 64)
            plan = plan_rewrite(meta, options)
            rewrite_local(meta, options, None, str(tmp_path / f"split-{i}"))
        handles = {(t.op, t.subtask) for t in plan.read_tasks}
        assert len(plan.read_tasks) > len(handles), src
        names = sorted(p.name for p in (tmp_path / f"whole-{i}").iterdir())
        assert names == sorted(p.name for p in (tmp_path / f"split-{i}").iterdir())
        for name in names:
            whole = (tmp_path / f"whole-{i}" / name).read_bytes()
            assert (tmp_path / f"split-{i}" / name).read_bytes() == whole, (src, name)

        # one task of a handle's middle: every byte of its file outside the task's key groups
        # overwritten, and the task still reads exactly its records (handles in files only:
        # an inline one is at most a few KB, in _metadata itself)
        rows = {
            t: pa.Table.from_batches(list(read_records(plan, t)), SCHEMA)
            for t in plan.read_tasks
            if t.key_groups.start > 0
        }
        task = max(rows, key=lambda t: rows[t].num_rows)
        before = rows[task]
        kh = meta.operators[task.op].subtasks[task.subtask].managed_keyed_state
        assert kh is not None and kh.delegate is not None and before.num_rows, src
        if kh.delegate.location is None:
            continue
        in_files += 1
        copy = tmp_path / f"copy-{i}"
        shutil.copytree(src.parent if src.name.startswith("chk-") else src, copy)
        path = copy / Path(str(kh.delegate.location)).relative_to(
            src.parent if src.name.startswith("chk-") else src
        )
        data = bytearray(path.read_bytes())
        first = kh.key_groups.start
        starts = sorted(o for o in kh.offsets if o)
        lo = kh.offsets[task.key_groups.start - first]
        after_kg = [o for o in starts if o > kh.offsets[task.key_groups.end - first]]
        hi = after_kg[0] if after_kg else len(data)
        data[starts[0] : lo] = b"\xff" * (lo - starts[0])
        data[hi:] = b"\xff" * (len(data) - hi)
        path.write_bytes(bytes(data))
        copied = read_metadata(str(copy / src.name if src.name.startswith("chk-") else copy))
        after = pa.Table.from_batches(
            list(read_records(dataclasses.replace(plan, meta=copied), task)), SCHEMA
        )
        assert after.equals(before), src
    assert in_files


def test_a_plan_travels_to_spark_tasks_by_pickle(flink_fixtures: FlinkFixtures) -> None:
    meta = read_metadata(str(flink_fixtures.java_job("rocksdb") / "chk-11"))
    plan = plan_rewrite(meta, RewriteOptions(max_parallelism=300))
    copy = pickle.loads(pickle.dumps(plan))
    rows = [sum(b.num_rows for b in read_records(p, p.read_tasks[0])) for p in (plan, copy)]
    assert rows[0] == rows[1] > 0


def test_dropping_an_operators_state_keeps_the_operator_without_keyed_state(
    canonical: FlinkSnapshotMetadata, tmp_path: Path
) -> None:
    report = rewrite_local(canonical, RewriteOptions(drop_operators=("agg",)), None, str(tmp_path))
    assert report["dropped_operators"] == ["agg"]
    out = read_metadata(str(tmp_path))
    agg = out.operator("agg")
    assert agg.parallelism == canonical.operator("agg").parallelism
    assert not agg.has_keyed_state
    assert list(snapshot_entries(out)) == []


def test_bulk_key_hashes_are_the_per_key_ones() -> None:
    import random

    import numpy as np

    from state_engine.flink.rewrite import fast

    rnd = random.Random(35)
    rows = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40))) for _ in range(300)]
    strings = ["", "a", "card-000000017", "x" * 126, "émigré", "z" * 127]
    for _ in range(200):
        strings.append("".join(chr(rnd.randrange(32, 127)) for _ in range(rnd.randrange(30))))
    longs = [0, -1, 1 << 62, -(1 << 63), *(rnd.randrange(-(1 << 63), 1 << 63) for _ in range(200))]
    ints = [0, -1, (1 << 31) - 1, -(1 << 31)]
    ints += [rnd.randrange(-(1 << 31), 1 << 31) for _ in range(99)]
    cases: list[tuple[str, list[bytes], Any, list[Any]]] = [
        ("binary-row", [struct.pack(">i", len(r)) + r for r in rows], binary_row_hash, rows),
        ("string", [_string_value(s) for s in strings], java_string_hash, strings),
        ("long", [struct.pack(">q", v) for v in longs], None, longs),
        ("int", [struct.pack(">i", v) for v in ints], None, ints),
    ]
    for kind, keys, hash_of, values in cases:
        data = b"".join(keys)
        at = np.cumsum([0, *(len(k) for k in keys[:-1])]).astype(np.int64)
        limit = at + np.array([len(k) for k in keys], dtype=np.int64)
        codes, ok = fast.scalar_codes(kind, np.frombuffer(data, np.uint8), at, limit)
        for code, good, value in zip(codes.tolist(), ok.tolist(), values, strict=True):
            if kind == "long":
                want = (value ^ (value >> 32)) & 0xFFFFFFFF
                want = want - (1 << 32) if want >= 1 << 31 else want
            elif kind == "int":
                want = value
            else:
                assert hash_of is not None
                want = hash_of(value)
            if kind == "string" and (not value.isascii() or len(value) >= 127):
                assert not good, value  # left to the per-record hasher
                continue
            assert good and code == want, (kind, value)
