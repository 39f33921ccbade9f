"""``statectl jobs``, ``snapshots``, ``show``, ``files`` and ``runs``: what the catalog holds."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from state_engine.cli.catalog import open_catalog
from state_engine.cli.output import command, print_json, print_records
from state_engine.formatting import BYTE_COLUMNS, format_table


def cmd_jobs(args: argparse.Namespace) -> int:
    with open_catalog() as catalog:
        jobs = catalog.list_jobs()
        latest = {s.job_id: s for s in catalog.latest_snapshots()}
        # the directories a Flink job's snapshots are imported from (none for Statekeeper jobs)
        dirs = {j.id: catalog.job_directories(j.id) for j in jobs if j.origin == "flink"}
    if args.json:
        print_json(
            [
                {
                    **dataclasses.asdict(j),
                    "latest_snapshot": latest.get(j.id),
                    "directories": [{"path": p, "role": r} for p, r in dirs.get(j.id, [])],
                }
                for j in jobs
            ]
        )
        return 0
    rows = []
    for j in jobs:
        snap = latest.get(j.id)
        rows.append(
            [
                j.id,
                j.name,
                j.max_parallelism,
                None if snap is None else snap.id,
                None if snap is None else snap.checkpoint_id,
                None if snap is None else snap.bytes,
                None if snap is None else snap.completed_at,
                ",".join(j.manage) or "read-only",
            ]
        )
    columns = [
        "id", "name", "max_parallelism", "latest", "checkpoint", "bytes", "completed_at", "manage",
    ]  # fmt: skip
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))
    return 0


def cmd_snapshots(args: argparse.Namespace) -> int:
    from state_engine.formatting import ESTIMATE_NOTE, estimate_text, is_estimated

    with open_catalog() as catalog:
        snaps = catalog.list_snapshots(args.job, status=args.status, limit=args.limit)
    if args.json:
        print_json(
            [{**dataclasses.asdict(s), "entries_estimated": is_estimated(s.format)} for s in snaps]
        )
        return 0
    columns = [
        "id", "checkpoint_id", "kind", "format", "status", "parallelism", "bytes", "entries",
        "created_at", "completed_at", "trigger",
    ]  # fmt: skip
    rows = [
        [estimate_text(s.entries, s.format) if c == "entries" and is_estimated(s.format)
         else getattr(s, c) for c in columns]
        for s in snaps
    ]  # fmt: skip
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))
    if any(is_estimated(s.format) for s in snaps):
        print(f"~ entries of native snapshots are {ESTIMATE_NOTE}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with open_catalog() as catalog:
        snap = catalog.get_snapshot(args.snapshot)
        sizes = [p for p in catalog.state_size_history(snap.job_id) if p.snapshot_id == snap.id]
        skew = catalog.key_group_skew(snap.id)
    from state_engine.formatting import (
        ESTIMATE_NOTE,
        cell_text,
        escape_control,
        estimate_text,
        human_bytes,
        is_estimated,
    )

    estimated = is_estimated(snap.format)
    if args.json:
        print_json(
            {
                "snapshot": {**dataclasses.asdict(snap), "entries_estimated": estimated},
                "sizes": sizes,
                "skew": [{**dataclasses.asdict(k), "estimated": estimated} for k in skew],
            }
        )
        return 0
    fields = dataclasses.asdict(snap)
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        text = human_bytes(value) if key in BYTE_COLUMNS and value is not None else value
        if key == "entries" and estimated:
            text = f"{estimate_text(value, snap.format)} ({ESTIMATE_NOTE})"
        print(f"{key.ljust(width)}  {escape_control(cell_text(text))}")
    if sizes:
        print("\nstate size per operator")
        print(
            format_table(
                ["operator", "files", "bytes", "shared_bytes"],
                [[p.operator, p.files, p.bytes, p.shared_bytes] for p in sizes],
                sizes=BYTE_COLUMNS,
            )
        )
    if skew:
        print(
            "\nkey-group skew (max / mean rows per key group)"
            + (f" ~ ESTIMATED: {ESTIMATE_NOTE}" if estimated else "")
        )
        print(
            format_table(
                ["operator", "key_groups", "total_rows", "max_rows", "mean_rows", "skew"],
                [[k.operator, k.key_groups, k.total_rows, k.max_rows, k.mean_rows, k.skew]
                 for k in skew],
                sizes=BYTE_COLUMNS,
            )
        )  # fmt: skip
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    with open_catalog() as catalog:
        files = catalog.snapshot_files(args.snapshot)
    columns = [
        "path", "size", "shared", "operator", "subtask", "key_group_start", "key_group_end",
        "created_by_snapshot_id",
    ]  # fmt: skip
    print_records(args, files, columns)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    with open_catalog() as catalog:
        runs = catalog.list_runs(job=args.job, kind=args.kind, limit=args.limit)
    if args.json:
        print_json([dataclasses.asdict(r) for r in runs])
        return 0
    from state_engine.formatting import human_bytes
    from state_engine.maintenance.scope import deleted_by

    columns = [
        "run_id", "kind", "job", "status", "attempts", "started_at", "finished_at", "rows_out",
        "bytes_out", "deleted", "error",
    ]  # fmt: skip
    rows = []
    for r in runs:
        gone = deleted_by(r.stats)  # a deletion writes nothing: bytes_out alone would say 0 B
        deleted = None if gone is None else f"{gone.count} ({human_bytes(gone.bytes)})"
        rows.append([deleted if c == "deleted" else getattr(r, c) for c in columns])
    print(format_table(columns, rows, sizes=BYTE_COLUMNS))
    return 0


def register(commands: Any) -> None:
    """Add ``jobs``, ``snapshots``, ``show``, ``files`` and ``runs`` to statectl."""
    command(commands, "jobs", cmd_jobs, "list jobs with their latest completed snapshot")

    snapshots = command(commands, "snapshots", cmd_snapshots, "list a job's snapshots")
    snapshots.add_argument("job", metavar="JOB", help="job name")
    snapshots.add_argument("--status", help="only this status (e.g. COMPLETED)")
    snapshots.add_argument("--limit", type=int, default=None, help="at most this many")

    show = command(commands, "show", cmd_show, "show one snapshot: sizes and key-group skew")
    show.add_argument("snapshot", metavar="SNAPSHOT", type=int, help="snapshot id")

    files = command(commands, "files", cmd_files, "list the files of a snapshot")
    files.add_argument("snapshot", metavar="SNAPSHOT", type=int, help="snapshot id")

    runs = command(commands, "runs", cmd_runs, "maintenance history, newest first")
    runs.add_argument("--job", help="only runs of this job")
    runs.add_argument("--kind", help="only runs of this kind (e.g. compaction)")
    runs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
