"""The least a checkpoint of the counts workload's heap state can cost in CPython.

Issue 14 asks checkpointing to cost the heap path at most 10% of its throughput on the counts
workload (bench/peers.py: 300,000 records, 10,000 keys, per key a (count, sum) value and a
merchant -> count map, a checkpoint every 10,000 records). This measures what any heap
checkpoint must pay before it writes a byte or touches the catalog, on the cheapest record path
there is: a plain dict loop over the same records (no runtime, no state API).

* ``track``: marking the keys and map entries each record changes (a delta needs them, or a walk
  of the whole state per checkpoint);
* ``marshal``: ``track`` plus, at each barrier, the changed entries serialized in the task thread
  with the fastest serializer CPython has (marshal), which a checkpoint written in-process pays;
* ``fork``: ``track`` plus, at each barrier, a forked child that holds the state as it was (and
  exits at once: it writes nothing), which a checkpoint written by a child pays: the fork, and
  the parent's copy-on-write faults on every page it touches afterwards (CPython writes a
  reference count on each object it reads).

Each is a share of the loop's throughput (1 - off / with), and the same seconds are put against
Statekeeper's own heap run without checkpoints (bench/peers.py's run, in its child process):
``share_of_statekeeper`` = the floor's seconds over Statekeeper's seconds plus them, what the
floor alone would cost Statekeeper's heap path. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import gc
import json
import marshal
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (the workload and Statekeeper's run of it)

EVERY = peers.EVERY


def loop(records: list[tuple[str, str, int]], mode: str) -> tuple[float, list[float]]:
    """The counts workload as a plain dict loop; (seconds, per-barrier capture seconds)."""
    agg: dict[str, list[int]] = {}
    merchants: dict[str, dict[str, int]] = {}
    dirty: set[str] = set()
    dirty_entries: set[tuple[str, str]] = set()
    track = mode != "off"
    captures = []
    child = 0
    started = time.perf_counter()
    for at in range(0, len(records), EVERY):
        for key, merchant, amount in records[at : at + EVERY]:
            v = agg.get(key)
            agg[key] = [1, amount] if v is None else [v[0] + 1, v[1] + amount]
            m = merchants.get(key)
            if m is None:
                m = merchants[key] = {}
            m[merchant] = m.get(merchant, 0) + 1
            if track:
                dirty.add(key)
                dirty_entries.add((key, merchant))
        t = time.perf_counter()
        if mode == "marshal":
            marshal.dumps(
                (
                    {k: agg[k] for k in dirty},
                    {(k, e): merchants[k][e] for k, e in dirty_entries},
                )
            )
        elif mode == "fork":
            if child:  # the previous barrier's child, long gone: as the runtime reaps them
                os.waitpid(child, 0)
            child = os.fork()
            if child == 0:  # pragma: no cover - the child holds the state and goes
                os._exit(0)
        dirty.clear()
        dirty_entries.clear()
        captures.append(time.perf_counter() - t)
    if child:
        os.waitpid(child, 0)
    return time.perf_counter() - started, captures


def statekeeper_off(data: list[dict[str, Any]], work: Path, runs: int) -> float:
    """Median seconds of Statekeeper's heap run of the workload without checkpoints: the run of
    bench/peers.py (its child process, a fresh catalog and directory each)."""
    data_file = work / "counts.pickle"
    with open(data_file, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    times = []
    for n in range(runs):
        run = work / f"sk-{n}"
        run.mkdir()
        spec = {
            "system": "statekeeper",
            "workload": "counts",
            "data": str(data_file),
            "work": str(run),
            "cfg": {"backend": "heap", "format": None},
        }
        proc = subprocess.run(
            [sys.executable, peers.__file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=True,
            cwd=peers.REPO,
        )
        times.append(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    data = peers.counts_records(300_000, 10_000)
    records = [(r["key"], r["merchant"], r["amount"]) for r in data]
    modes = ("off", "track", "marshal", "fork")
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    capture: dict[str, list[float]] = {m: [] for m in modes}
    gc.disable()  # the loop makes no cycles; a collection would copy the forked pages too
    for _ in range(args.rounds):
        for mode in modes:  # interleaved rounds: the machine's drift hits every mode alike
            s, c = loop(records, mode)
            seconds[mode].append(s)
            capture[mode].extend(c)
    gc.enable()
    med = {m: statistics.median(v) for m, v in seconds.items()}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-floor-") as tmp:
        sk_off = statekeeper_off(data, Path(tmp), 3)
    checkpoints = len(records) // EVERY
    # the floors' own seconds: what each adds to the loop without checkpoints
    extra = {m: max(med[m] - med["off"], 0.0) for m in ("track", "marshal", "fork")}
    out: dict[str, Any] = {
        "records": len(records),
        "checkpoints": checkpoints,
        "loop_records_per_s": {m: round(len(records) / med[m]) for m in modes},
        "capture_ms_median": {
            m: round(statistics.median(capture[m]) * 1000, 2) for m in ("marshal", "fork")
        },
        "share_of_loop": {m: round(1 - med["off"] / med[m], 3) for m in extra},
        "statekeeper_heap_off_s": round(sk_off, 3),
        "statekeeper_records_per_s": round(len(records) / sk_off),
        "share_of_statekeeper": {m: round(x / (sk_off + x), 3) for m, x in extra.items()},
    }
    # a delta needs what changed: the cheapest complete capture is the lesser of the two
    floor = min(out["share_of_statekeeper"]["marshal"], out["share_of_statekeeper"]["fork"])
    out["floor_share_of_statekeeper"] = floor
    out["targets"] = [
        {
            "name": "heap_checkpoint_cost_share_floor_counts",
            "value": floor,
            "op": "<=",
            "target": 0.10,
        }
    ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
