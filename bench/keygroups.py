"""Keys per second: scalar assign_to_key_group vs vectorised assign_to_key_groups.

Usage: python bench/keygroups.py [--quick]

Every key is distinct and the scalar caches (string hashes, murmur results) are cleared before each
run, so the headline scalar numbers are the cost of new keys, not cache hits. For information, the
"repeated" numbers replay 10k distinct keys many times with warm caches, as a keyed stream does.
Each timing is the best of a few repeats.
Prints one JSON object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from state_engine.keygroups import (  # noqa: E402
    assign_to_key_group,
    assign_to_key_groups,
    clear_caches,
)

MAX_PARALLELISM = 4096


def best_seconds(fn: Callable[[], object], repeats: int, before: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k keys instead of 1M")
    args = parser.parse_args()
    n = 100_000 if args.quick else 1_000_000
    repeats = 3

    rng = np.random.default_rng(42)
    int_array = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    int_array[: min(n, 1000)] = np.arange(min(n, 1000))  # small ids too, like real keys
    int_list = int_array.tolist()
    str_list = [f"user-{i:09d}" for i in range(n)]
    str_array = pa.array(str_list, type=pa.string())

    def scalar(keys: list) -> Callable[[], object]:
        return lambda: [assign_to_key_group(k, MAX_PARALLELISM) for k in keys]

    def vector(keys: object) -> Callable[[], object]:
        return lambda: assign_to_key_groups(keys, MAX_PARALLELISM)

    clear = clear_caches

    # The answers must agree before the speeds mean anything.
    sample = slice(0, min(n, 20_000))
    assert assign_to_key_groups(int_array[sample], MAX_PARALLELISM).tolist() == [
        assign_to_key_group(k, MAX_PARALLELISM) for k in int_list[sample]
    ]
    assert assign_to_key_groups(str_array[sample], MAX_PARALLELISM).tolist() == [
        assign_to_key_group(k, MAX_PARALLELISM) for k in str_list[sample]
    ]

    t_scalar_int = best_seconds(scalar(int_list), repeats, clear)
    t_vector_int = best_seconds(vector(int_array), repeats, clear)
    t_scalar_str = best_seconds(scalar(str_list), repeats, clear)
    t_vector_str = best_seconds(vector(str_array), repeats, clear)
    hot = 10_000
    repeated_ints = [int_list[i % hot] for i in rng.permutation(n)]
    repeated_strs = [str_list[i % hot] for i in rng.permutation(n)]
    scalar(repeated_ints)()
    scalar(repeated_strs)()
    t_repeated_int = best_seconds(scalar(repeated_ints), repeats, lambda: None)
    t_repeated_str = best_seconds(scalar(repeated_strs), repeats, lambda: None)

    ratio_int = t_scalar_int / t_vector_int
    result = {
        "keys": n,
        "max_parallelism": MAX_PARALLELISM,
        "scalar_int_keys_per_s": round(n / t_scalar_int),
        "vector_int_keys_per_s": round(n / t_vector_int),
        "ratio_int": round(ratio_int, 1),
        "scalar_str_keys_per_s": round(n / t_scalar_str),
        "vector_str_keys_per_s": round(n / t_vector_str),
        "ratio_str": round(t_scalar_str / t_vector_str, 1),
        "repeated_scalar_int_keys_per_s": round(n / t_repeated_int),
        "repeated_scalar_str_keys_per_s": round(n / t_repeated_str),
        "targets": [
            {
                "name": "vectorised_vs_scalar_int",
                "value": round(ratio_int, 1),
                "op": ">=",
                "target": 20,
            }
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
