"""Canonical snapshot write speed against plain pyarrow Parquet writing the same rows.

Both sides start from the same list of StateEntry tuples (what a backend's export yields) and
end with a Parquet file on local disk: plain = columns -> one Arrow table -> pq.write_table with
pyarrow's defaults; canonical = CanonicalWriter (key-group-aligned row groups, index, statistics,
streamed checksum). Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from state_engine.snapshot.canonical import KEYED_SCHEMA, CanonicalWriter, StateEntry
from state_engine.snapshot.storage import CheckpointStorage


def make_rows(n: int, max_parallelism: int, seed: int = 1) -> list[StateEntry]:
    rnd = random.Random(seed)
    return [
        StateEntry(
            key_group=i * max_parallelism // n,
            key_hash=rnd.randint(-(2**31), 2**31 - 1),
            key=b"user-%010d" % rnd.getrandbits(32),
            namespace=b"",
            state="counts" if i % 3 else "last_seen",
            user_key=None,
            value=rnd.randbytes(16) + b"\x00" * 24,
            expires_at=None if i % 2 else 1_700_000_000_000 + i,
        )
        for i in range(n)
    ]


def plain(rows: list[StateEntry], path: Path) -> None:
    columns = list(zip(*rows, strict=True))
    table = pa.table(
        [pa.array(c, type=f.type) for c, f in zip(columns, KEYED_SCHEMA, strict=True)],
        schema=KEYED_SCHEMA,
    )
    pq.write_table(table, path)


def canonical(rows: list[StateEntry], root: Path, checkpoint_id: int, max_p: int) -> int:
    snap = CheckpointStorage(root.as_uri()).checkpoint("bench", checkpoint_id)
    with CanonicalWriter(snap, subtask=0, max_parallelism=max_p) as writer:
        writer.write(rows)
    return writer.finish().bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = make_rows(args.rows, args.max_parallelism)
    plain_s: list[float] = []
    canon_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain(rows[:1000], root / "warmup.parquet")
        for i in range(args.repeat):
            t = time.perf_counter()
            plain(rows, root / f"plain-{i}.parquet")
            plain_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            canon_bytes = canonical(rows, root / "chk", i, args.max_parallelism)
            canon_s.append(time.perf_counter() - t)
        plain_bytes = (root / "plain-0.parquet").stat().st_size
    p, c = statistics.median(plain_s), statistics.median(canon_s)
    result = {
        "bench": "canonical_format",
        "rows": args.rows,
        "plain_seconds": round(p, 4),
        "canonical_seconds": round(c, 4),
        "plain_rows_per_s": round(args.rows / p),
        "canonical_rows_per_s": round(args.rows / c),
        "plain_bytes": plain_bytes,
        "canonical_bytes": canon_bytes,
        "targets": [
            {
                "name": "canonical_vs_plain_parquet",
                "value": round(p / c, 3),
                "op": ">=",
                "target": 0.7,
            }
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
