"""Flink snapshots: import, keyed-state decoding and orphan cleanup against bare baselines.

Three measurements, each against its baseline in the same run (ratios, not absolute times):

* import: ``import_flink`` of a generated Flink job directory (3 retained incremental checkpoints
  whose ``_metadata`` reference 10,000 shared files) into a fresh SQLite catalog, vs a bare
  ``fsspec`` listing of the same tree plus reading every ``_metadata``; ``catalog_rows_floor_s``
  is the time bare sqlite3 takes to insert the file rows that import wrote, 500 rows a statement
  (no target: the least any import into this catalog schema can cost);
* decode: every keyed entry of a generated canonical savepoint stream (the Java fixture job's
  states: Long VALUE, TTL VALUE, MAP<String, Long>, LIST<Long>; 1/3 of the user keys not ASCII)
  decoded by ``canonical_columns`` (what ``statectl state show`` uses) into one Arrow table per
  state -- key group, key, namespace, user key, value, TTL timestamp columns holding every
  record's decoded values (no lazy view: the tables are complete when the timer stops) -- vs
  reading the same bytes through ``pyarrow.input_stream`` plus one ``struct`` unpack per record;
  reported in MB/s too, with the record-at-a-time reader's time for comparison (outside the
  timer, the tables are checked equal to that reader's entries);
* orphan cleanup (dry run: plan only) over 100,000 files of that job directory, vs a bare listing.

``--quick`` is a smoke run (20,000 keys, 5,000 shared files, 20,000 files in the orphan tree): the
import's fixed cost weighs more there, so its ratio is lower than at full size.

The ``_metadata`` files are written here from the format (docs/flink-format.md §2) with the
``CheckpointProperties`` trailer and keyed-backend header copied from the real fixture archive
(``/work/shared/flink/flink-java-dev.tar.gz`` or ``--fixtures``). Prints one JSON object last.
Each ratio is baseline time / measured time (best of ``--repeat``), wall clock; ``cpu_ratio`` is the
same with process CPU time, steadier on a shared machine (the targets use the wall-clock ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa

from state_engine.flink.columnar import canonical_columns
from state_engine.flink.keyed_state import canonical_entries, read_proxy_header

ARCHIVE = Path(os.environ.get("STATEKEEPER_FLINK_FIXTURES", "/work/shared/flink"))
JAVA = "flink-java-dev.tar.gz"
ROCKS_CHK = "flink-java-dev/rocksdb/checkpoints/0cf791d2fa2585d18b369593e6ac454d/chk-11/_metadata"
HASHMAP_SP = "flink-java-dev/hashmap/savepoints/savepoint-24b66e-d8d099a6f7d1"
MERCHANTS = ["amazon", "ikea", "café-de-flore", "Müller-Markt", "京东商城", "🍕-pizza-place"]


#: process CPU seconds of the last best() call's fastest run (the machine is shared: wall-clock
#: ratios swing with the load, CPU-time ratios much less; both are reported)
CPU: list[float] = [0.0]


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, cpus, result = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    CPU[0] = min(cpus)
    return min(times), result


# --- writers of Flink's encodings (only what the generated data needs) ---


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string_value(s: str) -> bytes:
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    return _varint(len(units) + 1) + b"".join(_varint(u) for u in units)


def utf(s: str) -> bytes:
    b = s.encode("utf-8")  # the names written here have no NUL or supplementary characters
    return struct.pack(">H", len(b)) + b


# --- decode ---


def canonical_stream(
    header: bytes, ids: dict[str, int], keys: int, seed: int = 7
) -> tuple[bytes, list[int], int]:
    """A one-subtask canonical savepoint file (key groups 0..127) and its key-group offsets."""
    rnd = random.Random(seed)
    by_kg: dict[int, list[str]] = {}
    for i in range(keys):
        by_kg.setdefault(i % 128, []).append(f"card-{i:07d}")
    out = bytearray(header)
    offsets = []
    records = 0
    for kg in range(128):
        offsets.append(len(out))
        runs: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        for state in ("total", "lastSeen", "merchants", "recent"):
            recs = []
            for k in by_kg.get(kg, []):
                key = bytes([kg]) + string_value(k) + b"\x00"
                if state == "total":
                    recs.append((key, struct.pack(">q", rnd.randrange(1, 10**6))))
                elif state == "lastSeen":
                    recs.append((key, struct.pack(">qq", 1_795_485_260_770, rnd.randrange(10**12))))
                elif state == "merchants":
                    for m in rnd.sample(MERCHANTS, 3):
                        recs.append(
                            (key + string_value(m), b"\x00" + struct.pack(">q", rnd.randrange(9)))
                        )
                else:
                    recs.append(
                        (key, b",".join(struct.pack(">q", rnd.randrange(20000)) for _ in range(5)))
                    )
            runs.append((ids[state], recs))
        out += struct.pack(">h", runs[0][0])
        for r, (_sid, recs) in enumerate(runs):
            for j, (k, v) in enumerate(recs):
                last = j == len(recs) - 1
                if last:
                    k = bytes([k[0] | 0x80]) + k[1:]
                out += struct.pack(">i", len(k)) + k + struct.pack(">i", len(v)) + v
                if last:
                    nxt = runs[r + 1][0] if r + 1 < len(runs) else 0xFFFF
                    out += struct.pack(">H", nxt)
                records += 1
    return bytes(out), offsets, records


def bench_decode(fixtures: Path, work: Path, keys: int, repeat: int) -> dict[str, Any]:
    sp = fixtures / HASHMAP_SP
    data_file = next(p for p in sp.iterdir() if p.name != "_metadata")
    raw = data_file.read_bytes()
    header = read_proxy_header(raw, str(data_file))
    ids = {s.name: s.state_id for s in header.states}
    stream, offsets, records = canonical_stream(raw[: header.end], ids, keys)
    path = work / "canonical-savepoint-stream"
    path.write_bytes(stream)
    unpack = struct.Struct(">i").unpack_from
    limit = len(stream) - 4

    def baseline() -> int:
        with pa.input_stream(str(path)) as f:
            data = f.read()
        n = 0
        for i in range(records):
            n += unpack(data, (i * 13) % limit)[0] & 1
        return n

    def decode() -> list[Any]:
        # what `statectl state show` decodes with: every record's key group, key, user key,
        # value and TTL timestamp into the columns of one Arrow table per state
        with open(path, "rb") as f:
            data = f.read()
        return list(canonical_columns(data, offsets, 128, str(path)))

    def per_record() -> int:
        # the record-at-a-time reader (one Entry per record), for comparison
        with open(path, "rb") as f:
            data = f.read()
        return sum(1 for _ in canonical_entries(data, offsets, 128, str(path)))

    t_base, _ = best(baseline, repeat)
    c_base = CPU[0]
    t_dec, columns = best(decode, repeat)
    c_dec = CPU[0]
    t_rec, per_record_entries = best(per_record, 1)
    entries = sum(len(c) for c in columns)
    assert entries == per_record_entries == records, (entries, per_record_entries, records)
    vectorized = sorted(c.state.name for c in columns if c.table is not None)
    _check_same(columns, stream, offsets, str(path))
    mb = len(stream) / 1e6
    return {
        "records": records,
        "entries": entries,
        "arrow_tables": vectorized,
        "bytes": len(stream),
        "baseline_s": round(t_base, 4),
        "decode_s": round(t_dec, 4),
        "per_record_decode_s": round(t_rec, 4),
        "baseline_mb_s": round(mb / t_base, 1),
        "decode_mb_s": round(mb / t_dec, 1),
        "ratio": round(t_base / t_dec, 3),
        "cpu_ratio": round(c_base / c_dec, 3),
    }


def _check_same(columns: list[Any], stream: bytes, offsets: list[int], where: str) -> None:
    """The tables hold what the record-at-a-time reader gives (per state, key group order)."""

    def rows(entries: Any) -> dict[str, list[tuple[Any, ...]]]:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for e in entries:
            out.setdefault(e.state, []).append(
                (e.key_group, e.key, e.namespace, e.user_key, e.value, e.expires_at)
            )
        return {k: sorted(v, key=lambda r: r[0]) for k, v in out.items()}

    got = rows(e for c in columns for e in c.entries())
    assert got == rows(canonical_entries(stream, offsets, 128, where)), "decoded tables differ"


# --- a generated Flink job directory ---


def _file_handle(path: Path, size: int) -> bytes:
    return b"\x02" + struct.pack(">q", size) + utf("file:" + str(path))


def _inline(name: str, data: bytes) -> bytes:
    return b"\x01" + utf(name) + struct.pack(">i", len(data)) + data


def metadata_bytes(
    checkpoint_id: int,
    subtasks: list[tuple[list[tuple[str, Path, int]], list[tuple[str, Path, int]]]],
    meta_state: bytes,
    trailer: bytes,
) -> bytes:
    """A version-6 ``_metadata``: one keyed operator; per subtask its shared/private files."""
    p = len(subtasks)
    out = bytearray(struct.pack(">ii", 0x4960672D, 6))
    out += struct.pack(">qii", checkpoint_id, 0, 1)
    out += utf("aggregate") + utf("agg")
    out += struct.pack(">qqii", 0x66C179F06330F542, 0x5345, p, 128)
    out += b"\x00"  # no coordinator state
    out += struct.pack(">i", p)
    for i, (shared, private) in enumerate(subtasks):
        start = (i * 128 + p - 1) // p
        end = ((i + 1) * 128 - 1) // p
        out += struct.pack(">iii", i, 0, 0)
        out += b"\x0b" + struct.pack(">q", checkpoint_id) + utf(f"backend-{i}")
        out += struct.pack(">iiq", start, end - start + 1, sum(s for _, _, s in shared))
        out += _inline(f"meta-{checkpoint_id}-{i}", meta_state)
        for files in (shared, private):
            out += struct.pack(">i", len(files))
            for local, path, size in files:
                out += utf(local) + _file_handle(path, size)
        out += utf(f"handle-{checkpoint_id}-{i}")
        out += b"\x00"  # no raw keyed state
        out += struct.pack(">ii", 0, 0)  # no channel state
    return bytes(out) + trailer


def generate_job(fixtures: Path, root: Path, shared_files: int, orphans: int) -> tuple[Path, int]:
    """``<root>/<job-id>`` with chk-1..3 over ``shared_files`` SSTs, plus ``orphans`` strays."""
    real = (fixtures / ROCKS_CHK).read_bytes()
    trailer = real[real.rindex(b"\xac\xed\x00\x05") :]
    meta_state = (
        next(p for p in (fixtures / HASHMAP_SP).iterdir() if p.name != "_metadata")
    ).read_bytes()[:2322]
    job = root / "5d1f0e3c9b2a4c6d8e7f00112233aabb"
    shared = job / "shared"
    shared.mkdir(parents=True)
    (job / "taskowned").mkdir()
    payload = b"s" * 64
    sst = []
    for i in range(shared_files):
        path = shared / f"{i:08x}-0000-4000-8000-sst"
        path.write_bytes(payload)
        sst.append((f"{i:06d}.sst", path, len(payload)))
    # chk-1 uses the first 60%, chk-2 the middle, chk-3 the last 60%: every file is referenced
    n = shared_files
    windows = {1: (0, int(n * 0.6)), 2: (int(n * 0.2), int(n * 0.8)), 3: (int(n * 0.4), n)}
    for cid, (a, b) in windows.items():
        chk = job / f"chk-{cid}"
        chk.mkdir()
        mine = sst[a:b]
        subtasks = []
        for i in range(2):
            part = mine[i::2]
            opts = shared / f"options-{cid}-{i}"
            opts.write_bytes(b"o" * 128)
            subtasks.append((part, [(f"OPTIONS-{cid:06d}", opts, 128)]))
        (chk / "_metadata").write_bytes(metadata_bytes(cid, subtasks, meta_state, trailer))
    stray = job / "shared"
    for i in range(orphans):
        (stray / f"orphan-{i:08d}").write_bytes(b"x")
    old = time.time() - 30 * 86400  # older than any --older-than margin
    for dirpath, _dirs, files in os.walk(job):
        for f in files:
            os.utime(os.path.join(dirpath, f), (old, old))
    total = sum(len(files) for _d, _s, files in os.walk(job))
    return job, total


def bench_import(fixtures: Path, work: Path, shared_files: int, repeat: int) -> dict[str, Any]:
    from state_engine.catalog import Catalog
    from state_engine.catalog.migrate import upgrade
    from state_engine.flink.import_job import import_flink

    job, files = generate_job(fixtures, work / "import", shared_files, 0)
    fs = fsspec.filesystem("file")

    def baseline() -> int:
        listing = fs.find(str(job), detail=True)
        n = 0
        for path in listing:
            if path.endswith("/_metadata"):
                n += len(fs.cat_file(path))
        return n

    counter = iter(range(1000))

    def imported() -> Any:
        url = f"sqlite:///{work / f'import-{next(counter)}.db'}"
        upgrade(url)
        with Catalog.open(url) as cat:
            t, c = time.perf_counter(), time.process_time()
            report = import_flink(cat, [str(job)], "bench")
            return time.perf_counter() - t, time.process_time() - c, report

    def rows_floor() -> float:
        """The catalog rows the import wrote, inserted again by bare sqlite3 into a fresh catalog
        (in INSERTs of 500 rows, as the catalog's own bulk inserts).

        Not a target: the least any import into this schema can cost (no parsing, no checks),
        which says how much of the import's time is the catalog's own writing.
        """
        import sqlite3

        src = sqlite3.connect(work / "import-0.db")
        tables = {
            t: src.execute(f"SELECT * FROM {t}").fetchall()  # noqa: S608 -- the bench's tables
            for t in ("sk_files", "sk_snapshot_file_groups")
        }
        src.close()
        url = f"sqlite:///{work / f'floor-{next(counter)}.db'}"
        upgrade(url)
        dst = sqlite3.connect(url.removeprefix("sqlite:///"))
        dst.execute("PRAGMA journal_mode = WAL")
        dst.execute("PRAGMA synchronous = NORMAL")
        dst.execute("PRAGMA foreign_keys = OFF")  # the rows' jobs and snapshots are not copied
        t = time.perf_counter()
        for table, rows in tables.items():
            row = "(" + ", ".join("?" * len(rows[0])) + ")"
            for start in range(0, len(rows), 500):  # as the catalog inserts them (Bulk)
                chunk = rows[start : start + 500]
                dst.execute(
                    f"INSERT INTO {table} VALUES {', '.join([row] * len(chunk))}",  # noqa: S608
                    [v for r in chunk for v in r],
                )
        dst.commit()
        elapsed = time.perf_counter() - t
        dst.close()
        return elapsed

    t_base, _ = best(baseline, repeat)
    c_base = CPU[0]
    runs = [imported() for _ in range(repeat)]
    t_imp = min(t for t, _, _ in runs)
    c_imp = min(c for _, c, _ in runs)
    floor = min(rows_floor() for _ in range(repeat))
    return {
        "files": files,
        "shared_files": shared_files,
        "baseline_s": round(t_base, 4),
        "import_s": round(t_imp, 4),
        "catalog_rows_floor_s": round(floor, 4),
        "catalog_rows_floor_vs_baseline": round(t_base / floor, 3),
        "ratio": round(t_base / t_imp, 3),
        "cpu_ratio": round(c_base / c_imp, 3),
    }


def bench_orphans(fixtures: Path, work: Path, total_files: int, repeat: int) -> dict[str, Any]:
    from state_engine.catalog import Catalog
    from state_engine.catalog.migrate import upgrade
    from state_engine.flink.import_job import import_flink
    from state_engine.flink.retention import run_maintenance

    shared_files = 10_000
    job, files = generate_job(
        fixtures, work / "orphans", shared_files, total_files - shared_files - 6 - 3
    )
    fs = fsspec.filesystem("file")

    def baseline() -> int:
        return len(fs.find(str(job), detail=True))

    t_base, listed = best(baseline, repeat)
    c_base = CPU[0]
    url = f"sqlite:///{work / 'orphans.db'}"
    upgrade(url)
    with Catalog.open(url) as cat:
        import_flink(cat, [str(job)], "bench")
        counter = iter(range(1000))

        def cleanup() -> dict[str, Any]:
            return run_maintenance(
                cat, "orphan_cleanup", None, job="bench", dry_run=True, older_than="1d",
                run_id=f"bench-orphans-{next(counter)}",
            )  # fmt: skip

        t_orph, report = best(cleanup, repeat)
        c_orph = CPU[0]
    found = (report.get("deleted") or {}).get(
        "count", len((report.get("deleted") or {}).get("items", []))
    )
    return {
        "files": listed,
        "orphans_found": found,
        "baseline_s": round(t_base, 4),
        "orphan_cleanup_s": round(t_orph, 4),
        "ratio": round(t_base / t_orph, 3),
        "cpu_ratio": round(c_base / c_orph, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, help="extracted flink-java-dev archive parent")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="20,000 keys, 5,000 shared files, 20,000 files in the orphan tree",
    )
    ap.add_argument("--keys", type=int, help="keys in the decoded stream (50,000)")
    ap.add_argument("--shared-files", type=int, help="shared files of the import (10,000)")
    ap.add_argument("--orphan-files", type=int, help="files in the orphan tree (100,000)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    quick = {"keys": 20_000, "shared_files": 5_000, "orphan_files": 20_000}
    full = {"keys": 50_000, "shared_files": 10_000, "orphan_files": 100_000}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    with tempfile.TemporaryDirectory(prefix="bench-flink-") as tmp:
        work = Path(tmp)
        fixtures = args.fixtures
        if fixtures is None:
            fixtures = work / "fixtures"
            with tarfile.open(ARCHIVE / JAVA) as tar:
                tar.extractall(fixtures, filter="data")
        results: dict[str, Any] = {"decode": bench_decode(fixtures, work, args.keys, args.repeat)}
        print(json.dumps({"decode": results["decode"]}), flush=True)
        for name, fn, size in (
            ("import", bench_import, args.shared_files),
            ("orphan_cleanup", bench_orphans, args.orphan_files),
        ):
            try:
                results[name] = fn(fixtures, work, size, args.repeat)
            except Exception as exc:  # part A's APIs: report, do not hide the other numbers
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500], "ratio": None}
            print(json.dumps({name: results[name]}), flush=True)
    targets = [
        {
            "name": f"{name}_vs_baseline",
            "value": results[name].get("ratio"),
            "op": ">=",
            "target": 0.5,
        }
        for name in ("import", "decode", "orphan_cleanup")
    ]
    results["decode_mb_s"] = results["decode"]["decode_mb_s"]
    results["quick"] = args.quick
    results["targets"] = targets
    print(json.dumps(results))


if __name__ == "__main__":
    main()
