"""Catalog benchmark: register snapshots of 10,000 files each, then ask the common questions.

Baseline, in the same run and on the same database: a raw DBAPI ``executemany`` of the same file,
file reference group and key-group-stat rows into the same tables. Prints one JSON object last.
Usage: ``bench/catalog.py [--quick] [--pg-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow, upgrade
from state_engine.catalog.engine import parse_url

FILES_PER_SNAPSHOT = 10_000
KEY_GROUPS = 1_024
PARALLELISM = 8
REPEATS = 5


def _snapshot_rows(n: int) -> tuple[list[FileRef], list[KeyGroupStatRow]]:
    span = KEY_GROUPS // PARALLELISM
    files = [
        FileRef(
            f"/bench/job/chk-{n}/{i:05d}.sst",
            4096 + i,
            checksum=f"{n:04d}{i:08d}",
            operator=f"op{i % 4}",
            subtask=i % PARALLELISM,
            key_group_start=(i % PARALLELISM) * span,
            key_group_end=(i % PARALLELISM) * span + span - 1,
        )
        for i in range(FILES_PER_SNAPSHOT)
    ]
    stats = [
        KeyGroupStatRow("op0", kg, rows=1000 + kg % 13, bytes=64_000) for kg in range(KEY_GROUPS)
    ]
    return files, stats


def _register(catalog: Catalog, snapshots: int) -> Iterator[tuple[float, int]]:
    """Per snapshot: seconds spent in the catalog, rows registered."""
    catalog.register_job("job", max_parallelism=KEY_GROUPS)
    for n in range(snapshots):
        files, stats = _snapshot_rows(n)
        start = time.perf_counter()
        snap = catalog.begin_snapshot("job", location=f"file:///bench/chk-{n}", parallelism=8)
        catalog.attach_files(snap.id, files)
        catalog.record_key_group_stats(snap.id, stats)
        catalog.complete_snapshot(snap.id, snap.version)
        if n >= 2:
            catalog.subsume_snapshot(snap.id - 2)  # keep the last two, as a checkpointer would
        yield time.perf_counter() - start, 2 * len(files) + len(stats)


def _baseline(url: str, snapshots: int, sqlite: bool) -> Iterator[tuple[float, int]]:
    """Raw executemany of the same rows: files, file reference groups, key_group_stats (per
    snapshot)."""
    now = datetime.now(UTC)
    stamp = now.replace(tzinfo=None).isoformat(" ") if sqlite else now
    mark = "?" if sqlite else "%s"
    if sqlite:
        import sqlite3

        conn: Any = sqlite3.connect(parse_url(url).database or "")
        # The catalog's own settings (engine.py): the same durability and the same foreign-key
        # checks on every row, or the baseline would skip work the catalog cannot.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
    else:
        conn = psycopg.connect(parse_url(url).set(drivername="postgresql").render_as_string(False))
    cur = conn.cursor()
    cur.execute(
        f"INSERT INTO sk_jobs (name, max_parallelism, properties, created_at) "
        f"VALUES ('raw', {KEY_GROUPS}, '{{}}', {mark})",
        (stamp,),
    )
    cur.execute("SELECT id FROM sk_jobs WHERE name = 'raw'")
    job_id = cur.fetchone()[0]
    cur.execute(
        f"INSERT INTO sk_operators (job_id, uid, created_at) VALUES ({mark}, 'op0', {mark})",
        (job_id, stamp),
    )
    cur.execute("SELECT id FROM sk_operators WHERE job_id = " + str(job_id))
    op_id = cur.fetchone()[0]
    conn.commit()
    for n in range(snapshots):
        files, stats = _snapshot_rows(n)
        start = time.perf_counter()
        cur.execute(
            "INSERT INTO sk_snapshots (job_id, checkpoint_id, kind, format, status, parallelism, "
            "max_parallelism, location, bytes, entries, created_at, trigger, version) VALUES "
            f"({mark}, {mark}, 'CHECKPOINT', 'CANONICAL', 'COMPLETED', 8, {KEY_GROUPS}, 'x', 0, 0, "
            f"{mark}, 'raw', 0)",
            (job_id, n + 1, stamp),
        )
        cur.execute(
            f"SELECT id FROM sk_snapshots WHERE job_id = {mark} AND checkpoint_id = {mark}",
            (job_id, n + 1),
        )
        sid = cur.fetchone()[0]
        cur.executemany(
            "INSERT INTO sk_files (job_id, path, size, checksum, shared, created_by_snapshot_id, "
            "last_used_snapshot_id, live_refs, created_at) VALUES "
            f"({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark}, 1, {mark})",
            [(job_id, "/raw" + f.path, f.size, f.checksum, False, sid, sid, stamp) for f in files],
        )
        # Ids back through the unique path index, each database's fastest way: one array
        # parameter on PostgreSQL (psycopg parses a statement of thousands of placeholders in
        # Python), IN lists on SQLite.
        paths = ["/raw" + f.path for f in files]
        ids: dict[str, int] = {}
        if sqlite:
            for at in range(0, len(paths), 5000):
                part = paths[at : at + 5000]
                cur.execute(
                    f"SELECT path, id FROM sk_files WHERE path IN ({', '.join('?' * len(part))})",
                    part,
                )
                ids.update(cur.fetchall())
        else:
            cur.execute("SELECT path, id FROM sk_files WHERE path = ANY(%s)", (paths,))
            ids.update(cur.fetchall())
        file_ids = [ids[p] for p in paths]
        # the references as the catalog stores them: a group per operator subtask and range
        groups: dict[tuple[Any, ...], list[int]] = {}
        for fid, f in zip(file_ids, files, strict=True):
            key = (f.subtask, f.key_group_start, f.key_group_end)
            groups.setdefault(key, []).append(fid)
        cur.executemany(
            "INSERT INTO sk_snapshot_file_groups (snapshot_id, operator_id, subtask, "
            "key_group_start, key_group_end, foreign_files, file_ids) VALUES "
            f"({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark})",
            [(sid, op_id, *key, False, json.dumps(ids)) for key, ids in groups.items()],
        )
        cur.executemany(
            "INSERT INTO sk_key_group_stats (snapshot_id, operator_id, key_group, rows, bytes) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark})",
            [(sid, op_id, s.key_group, s.rows, s.bytes) for s in stats],
        )
        conn.commit()
        yield time.perf_counter() - start, 2 * len(files) + len(stats)
    conn.close()


def _ms(fn: Any) -> float:
    fn()  # warm the statement cache
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 2)


def _measure(url: str, snapshots: int, sqlite: bool) -> dict[str, Any]:
    upgrade(url)
    base_s = base_rows = reg_s = reg_rows = 0.0
    with Catalog.open(url) as catalog:
        # Interleaved snapshot by snapshot: both sides see the same table sizes and the same
        # machine load (other processes share its cores), so drift cannot bias the ratio.
        for (b_s, b_rows), (r_s, r_rows) in zip(
            _baseline(url, snapshots, sqlite), _register(catalog, snapshots), strict=True
        ):
            base_s, base_rows, reg_s, reg_rows = (
                base_s + b_s,
                base_rows + b_rows,
                reg_s + r_s,
                reg_rows + r_rows,
            )
        queries = {
            "latest_snapshot_ms": _ms(lambda: catalog.latest_snapshot("job")),
            "size_history_ms": _ms(lambda: catalog.state_size_history("job")),
            "orphan_candidates_ms": _ms(lambda: catalog.orphan_candidates("job", limit=1000)),
        }
    registration = reg_rows / reg_s
    baseline = base_rows / base_s
    return {
        "registration_rows_per_s": round(registration),
        "baseline_rows_per_s": round(baseline),
        "ratio": round(registration / baseline, 3),
        **queries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10 snapshots instead of 100")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    snapshots = 10 if args.quick else 100
    result: dict[str, Any] = {
        "snapshots": snapshots,
        "files_per_snapshot": FILES_PER_SNAPSHOT,
        "key_groups": KEY_GROUPS,
    }
    targets: list[dict[str, Any]] = []

    def add(backend: str, measured: dict[str, Any]) -> None:
        result[backend] = measured
        targets.append(
            {"name": f"{backend}_registration_vs_raw_executemany", "value": measured["ratio"],
             "op": ">=", "target": 0.5}
        )  # fmt: skip
        for key in ("latest_snapshot_ms", "size_history_ms", "orphan_candidates_ms"):
            targets.append(
                {"name": f"{backend}_{key}", "value": measured[key], "op": "<=", "target": 50}
            )

    with tempfile.TemporaryDirectory() as tmp:
        add("sqlite", _measure(f"sqlite:///{Path(tmp) / 'catalog.db'}", snapshots, sqlite=True))

    admin = args.pg_url
    name = f"sk_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        result["postgresql"] = {"skipped": f"PostgreSQL unreachable: {' '.join(str(exc).split())}"}
    else:
        try:
            url = parse_url(admin).set(database=name).render_as_string(hide_password=False)
            add("postgresql", _measure(url, snapshots, sqlite=False))
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result["targets"] = targets
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
