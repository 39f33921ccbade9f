"""Flink's state benchmark operations on the heap and RocksDB keyed backends.

Each op is what Flink's state benchmark times: set the current key, then one state call. Every
backend holds ``--keys`` keys (value, a list of ``LIST_LEN`` elements, a map of ``MAP_LEN`` entries
per key); an op runs over a chunk of ``CHUNK`` of them (within the backend's key cache, as Flink's
benchmark keys carry their cached hash), the chunk repeated until a sample lasts >= 0.2 s.

Baselines in the same run, compared side by side: a plain dict doing the same logical work (heap),
rocksdict used directly with the same options, column families, key bytes (real key-group prefix),
value layout and serialization calls (RocksDB), and the backend itself without TTL (TTL cost) or
without change tracking (tracking cost). Sides of one comparison group run one after another in
each round (order rotated per round), each warmed up on the round's chunk first; a ratio is the
median over rounds of the per-round ratio. The cyclic GC is off during the timed phase for every
side. TTL runs use the production clock (wall clock, sampled once per record).

The last stdout line is one JSON object: ops/s (medians), ratios, targets.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rocksdict as rd

from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.backends.rocksdb import RocksDBKeyedStateBackend
from state_engine.hashing import key_hash, murmur_hash
from state_engine.keygroups import KeyGroupRange, key_group_prefix
from state_engine.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

_Q = struct.Struct(">q")
MAX_P = 128
CHUNK = 50_000  # < the backend's key cache (65,536 keys)
LIST_LEN = 10
MAP_LEN = 10  # Flink's state benchmark: mapKeyCount = 10
SAMPLE_S = 0.2
UK = "uk0"
OPS = [
    "valueUpdate",
    "valueGet",
    "listAppend",
    "listGet",
    "mapPut",
    "mapGet",
    "mapIterate",
]
# An op takes (chunk of keys, repetitions); "reset" restores the appended lists of a chunk.
Op = Callable[[list[str], int], None]


def backend_side(backend: Any, keys: list[str], ttl: bool) -> dict[str, Op]:
    def d(desc: Any) -> Any:
        return desc.enable_time_to_live(StateTtlConfig(10**9)) if ttl else desc

    v = backend.get_state(d(ValueStateDescriptor("v", int)))
    la = backend.get_state(d(ListStateDescriptor("la", int)))
    lg = backend.get_state(d(ListStateDescriptor("lg", int)))
    m = backend.get_state(d(MapStateDescriptor("m", str, int)))
    sk = backend.set_current_key
    base = list(range(LIST_LEN))
    entries = {f"uk{j}": j for j in range(MAP_LEN)}
    for i, k in enumerate(keys):
        sk(k)
        v.update(i)
        la.update([0])
        lg.update(base)
        m.put_all(entries)

    def value_update(ks: list[str], reps: int) -> None:
        upd = v.update
        for _ in range(reps):
            for i, k in enumerate(ks):
                sk(k)
                upd(i)

    def value_get(ks: list[str], reps: int) -> None:
        get = v.value
        for _ in range(reps):
            for k in ks:
                sk(k)
                get()

    def list_append(ks: list[str], reps: int) -> None:
        add = la.add
        for _ in range(reps):
            for i, k in enumerate(ks):
                sk(k)
                add(i)

    def list_get(ks: list[str], reps: int) -> None:
        get = lg.get
        for _ in range(reps):
            for k in ks:
                sk(k)
                get()

    def map_put(ks: list[str], reps: int) -> None:
        put = m.put
        for _ in range(reps):
            for i, k in enumerate(ks):
                sk(k)
                put(UK, i)

    def map_get(ks: list[str], reps: int) -> None:
        get = m.get
        for _ in range(reps):
            for k in ks:
                sk(k)
                get(UK)

    def map_iterate(ks: list[str], reps: int) -> None:
        items = m.items
        for _ in range(reps):
            for k in ks:
                sk(k)
                for _e in items():
                    pass

    def reset(ks: list[str], reps: int) -> None:
        upd = la.update
        for k in ks:
            sk(k)
            upd([0])

    return {
        "valueUpdate": value_update,
        "valueGet": value_get,
        "listAppend": list_append,
        "listGet": list_get,
        "mapPut": map_put,
        "mapGet": map_get,
        "mapIterate": map_iterate,
        "reset": reset,
    }


def dict_side(keys: list[str]) -> dict[str, Op]:
    """The same logical work on plain dicts keyed by the key (no key groups, no serialization)."""
    vd: dict[str, int] = {}
    la: dict[str, list[int]] = {}
    lg: dict[str, list[int]] = {}
    md: dict[str, dict[str, int]] = {}
    base = list(range(LIST_LEN))
    entries = {f"uk{j}": j for j in range(MAP_LEN)}
    for i, k in enumerate(keys):
        vd[k] = i
        la[k] = [0]
        lg[k] = list(base)
        md[k] = dict(entries)

    def value_update(ks: list[str], reps: int) -> None:
        for _ in range(reps):
            for i, k in enumerate(ks):
                vd[k] = i

    def value_get(ks: list[str], reps: int) -> None:
        get = vd.get
        for _ in range(reps):
            for k in ks:
                get(k)

    def list_append(ks: list[str], reps: int) -> None:
        get = la.get
        for _ in range(reps):
            for i, k in enumerate(ks):
                e = get(k)
                if e is None:
                    la[k] = [i]
                else:
                    e.append(i)

    def list_get(ks: list[str], reps: int) -> None:
        # A copy, as the backend returns one (the caller may keep or change it).
        get = lg.get
        for _ in range(reps):
            for k in ks:
                list(get(k, ()))

    def map_put(ks: list[str], reps: int) -> None:
        get = md.get
        for _ in range(reps):
            for i, k in enumerate(ks):
                e = get(k)
                if e is None:
                    md[k] = {UK: i}
                else:
                    e[UK] = i

    def map_get(ks: list[str], reps: int) -> None:
        get = md.get
        for _ in range(reps):
            for k in ks:
                e = get(k)
                if e is not None:
                    e.get(UK)

    def map_iterate(ks: list[str], reps: int) -> None:
        # A snapshot of the items, as the backend returns (the caller may write while iterating).
        get = md.get
        for _ in range(reps):
            for k in ks:
                e = get(k)
                for _e in list(e.items()) if e is not None else ():
                    pass

    def reset(ks: list[str], reps: int) -> None:
        for k in ks:
            la[k] = [0]

    return {
        "valueUpdate": value_update,
        "valueGet": value_get,
        "listAppend": list_append,
        "listGet": list_get,
        "mapPut": map_put,
        "mapGet": map_get,
        "mapIterate": map_iterate,
        "reset": reset,
    }


def rocksdict_side(path: Path, keys: list[str]) -> tuple[dict[str, Op], Any]:
    """rocksdict directly: raw mode, WAL off, a column family per state, the backend's key bytes."""
    o = rd.Options(raw_mode=True)
    o.create_if_missing(True)
    o.create_missing_column_families(True)
    db = rd.Rdict(str(path), o)
    w = rd.WriteOptions()
    w.disable_wal = True
    db.set_write_options(w)
    cfs = {}
    for name in ("v", "la", "lg", "m"):
        cf = db.create_column_family("s:" + name, rd.Options(raw_mode=True))
        cf.set_write_options(w)
        cfs[name] = cf
    pack, unpack = _Q.pack, _Q.unpack
    # The key bytes the backend caches per key at set_current_key: key-group prefix, length, key,
    # then the void namespace's length byte.
    kb: dict[str, bytes] = {}
    for k in keys:
        e = k.encode()
        kb[k] = key_group_prefix(murmur_hash(key_hash(k)) % MAX_P, MAX_P) + bytes((len(e),)) + e
    enc_base = b"".join(b"\x08" + pack(j) for j in range(LIST_LEN))
    for i, k in enumerate(keys):
        p = kb[k] + b"\x00"
        cfs["v"].put(p, pack(i))
        cfs["la"].put(p, b"\x08" + pack(0))
        cfs["lg"].put(p, enc_base)
        for j in range(MAP_LEN):
            cfs["m"].put(p + f"uk{j}".encode(), pack(j))
    vput, vget = cfs["v"].put, cfs["v"].get
    laput, laget = cfs["la"].put, cfs["la"].get
    lgget = cfs["lg"].get
    mcf = cfs["m"]
    mput, mget = mcf.put, mcf.get

    def value_update(ks: list[str], reps: int) -> None:
        for _ in range(reps):
            for i, k in enumerate(ks):
                vput(kb[k] + b"\x00", pack(i))

    def value_get(ks: list[str], reps: int) -> None:
        for _ in range(reps):
            for k in ks:
                raw = vget(kb[k] + b"\x00")
                if raw is not None:
                    unpack(raw)[0]

    def list_append(ks: list[str], reps: int) -> None:
        # One value per list: read, append the length-prefixed element, write.
        for _ in range(reps):
            for i, k in enumerate(ks):
                lk = kb[k] + b"\x00"
                raw = laget(lk)
                e = b"\x08" + pack(i)
                laput(lk, e if raw is None else raw + e)

    def list_get(ks: list[str], reps: int) -> None:
        for _ in range(reps):
            for k in ks:
                raw = lgget(kb[k] + b"\x00")
                if raw is None:
                    continue
                out, pos, end = [], 0, len(raw)
                while pos < end:
                    n = raw[pos]
                    out.append(unpack(raw[pos + 1 : pos + 1 + n])[0])
                    pos += 1 + n

    def map_put(ks: list[str], reps: int) -> None:
        ukb = UK.encode
        for _ in range(reps):
            for i, k in enumerate(ks):
                mput(kb[k] + b"\x00" + ukb(), pack(i))

    def map_get(ks: list[str], reps: int) -> None:
        ukb = UK.encode
        for _ in range(reps):
            for k in ks:
                raw = mget(kb[k] + b"\x00" + ukb())
                if raw is not None:
                    unpack(raw)[0]

    def map_iterate(ks: list[str], reps: int) -> None:
        # rocksdict's fastest bounded prefix scan: items() with an upper bound.
        items = mcf.items
        for _ in range(reps):
            for k in ks:
                p = kb[k] + b"\x00"
                n = len(p)
                ro = rd.ReadOptions()
                ro.set_iterate_upper_bound(kb[k] + b"\x01")
                rows = items(from_key=p, read_opt=ro)
                for _e in [(x[n:].decode(), unpack(v)[0]) for x, v in rows]:
                    pass

    def reset(ks: list[str], reps: int) -> None:
        e = b"\x08" + pack(0)
        for k in ks:
            laput(kb[k] + b"\x00", e)

    ops = {
        "valueUpdate": value_update,
        "valueGet": value_get,
        "listAppend": list_append,
        "listGet": list_get,
        "mapPut": map_put,
        "mapGet": map_get,
        "mapIterate": map_iterate,
        "reset": reset,
    }
    return ops, db


def run_group(
    sides: dict[str, dict[str, Op]], keys: list[str], rounds: int, log: Callable[[str], None]
) -> dict[str, dict[str, list[float]]]:
    """Per side and op, the ops/s of every round (sides interleaved, order rotated per round)."""
    names = list(sides)
    chunk = min(CHUNK, len(keys))
    out: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in names}
    for op in OPS:
        for r in range(rounds):
            start = (r * chunk) % len(keys)
            ks = keys[start : start + chunk]
            order = names[r % len(names) :] + names[: r % len(names)]
            for s in order:
                fn = sides[s][op]
                if op == "listAppend":
                    sides[s]["reset"](ks, 1)
                # Warm-up over the chunk (key cache, block cache), then enough repetitions of it
                # for one sample of >= SAMPLE_S.
                t0 = time.perf_counter()
                fn(ks, 1)
                reps = max(1, math.ceil(SAMPLE_S / (time.perf_counter() - t0)))
                if op == "listAppend":
                    sides[s]["reset"](ks, 1)
                t0 = time.perf_counter()
                fn(ks, reps)
                out[s][op].append(reps * len(ks) / (time.perf_counter() - t0))
        log(op + " " + " ".join(f"{s}={statistics.median(out[s][op]):,.0f}" for s in names))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="50k keys instead of 1M, 3 rounds")
    ap.add_argument("--keys", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    n = args.keys or (50_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 5)
    keys = [f"key-{i:08d}" for i in range(n)]
    kgr = KeyGroupRange.of(0, MAX_P - 1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-state-ops-"))
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    res: dict[str, dict[str, list[float]]] = {}
    try:
        heap_sides = {
            "dict": dict_side(keys),
            "heap": backend_side(HeapKeyedStateBackend(str, MAX_P, kgr), keys, False),
            "heap+track": backend_side(
                HeapKeyedStateBackend(str, MAX_P, kgr, track_changes=True), keys, False
            ),
            "heap+ttl": backend_side(HeapKeyedStateBackend(str, MAX_P, kgr), keys, True),
        }
        log("heap group set up")
        gc.collect()
        gc.freeze()
        gc.disable()
        res.update(run_group(heap_sides, keys, rounds, log))
        del heap_sides
        gc.enable()
        gc.unfreeze()
        gc.collect()
        rocks = RocksDBKeyedStateBackend(tmp / "rocks", str, MAX_P, kgr)
        rocks_ttl = RocksDBKeyedStateBackend(tmp / "rocks-ttl", str, MAX_P, kgr)
        direct, db = rocksdict_side(tmp / "direct", keys)
        rocks_sides = {
            "rocksdict": direct,
            "rocksdb": backend_side(rocks, keys, False),
            "rocksdb+ttl": backend_side(rocks_ttl, keys, True),
        }
        log("rocksdb group set up")
        gc.collect()
        gc.disable()
        res.update(run_group(rocks_sides, keys, rounds, log))
        gc.enable()
        rocks.close()
        rocks_ttl.close()
        db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(a: str, b: str, op: str) -> float:
        pairs = zip(res[a][op], res[b][op], strict=True)
        return round(statistics.median(x / y for x, y in pairs), 3)

    ratios: dict[str, float] = {}
    targets = []
    for op in OPS:
        r_heap = ratio("heap", "dict", op)
        r_rocks = ratio("rocksdb", "rocksdict", op)
        ttl_heap = ratio("heap", "heap+ttl", op)
        ttl_rocks = ratio("rocksdb", "rocksdb+ttl", op)
        track_heap = ratio("heap", "heap+track", op)
        ratios.update(
            {
                f"heap/dict {op}": r_heap,
                f"rocksdb/rocksdict {op}": r_rocks,
                f"heap ttl cost {op}": ttl_heap,
                f"rocksdb ttl cost {op}": ttl_rocks,
                f"heap tracking cost {op}": track_heap,
            }
        )
        targets += [
            {"name": f"heap/dict {op}", "value": r_heap, "op": ">=", "target": 0.25},
            {"name": f"rocksdb/rocksdict {op}", "value": r_rocks, "op": ">=", "target": 0.6},
            {"name": f"heap ttl cost {op}", "value": ttl_heap, "op": "<=", "target": 1.5},
            {"name": f"rocksdb ttl cost {op}", "value": ttl_rocks, "op": "<=", "target": 1.5},
        ]
    for op in OPS:
        log(
            f"{op:12} heap/dict {ratios[f'heap/dict {op}']:.3f}  "
            f"rocksdb/rocksdict {ratios[f'rocksdb/rocksdict {op}']:.3f}  "
            f"ttl heap {ratios[f'heap ttl cost {op}']:.3f} "
            f"rocksdb {ratios[f'rocksdb ttl cost {op}']:.3f}  "
            f"track {ratios[f'heap tracking cost {op}']:.3f}"
        )
    missed = [t["name"] for t in targets if not _met(t)]
    log(f"targets missed: {len(missed)}/{len(targets)}: {', '.join(missed) or 'none'}")
    ops_s = {s: {op: round(statistics.median(v)) for op, v in r.items()} for s, r in res.items()}
    print(
        json.dumps(
            {
                "keys": n,
                "rounds": rounds,
                "chunk": min(CHUNK, n),
                "ops_per_s": ops_s,
                "ratios": ratios,
                "targets": targets,
            }
        )
    )


def _met(t: dict[str, Any]) -> bool:
    return t["value"] >= t["target"] if t["op"] == ">=" else t["value"] <= t["target"]


if __name__ == "__main__":
    main()
