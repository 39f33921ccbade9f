"""The code Spark tasks run stays off pandas: importing it costs a fresh Python worker seconds,
and every maintenance run on a cluster (spark-submit per run) starts fresh workers."""

from __future__ import annotations

import subprocess
import sys

TASK_CODE = r"""
import sys
import numpy as np
import pyarrow as pa
from state_engine.snapshot.canonical import KEYED_SCHEMA, arrow_array, bool_values, int_values
from state_engine.jobs import rescale, snapshot_read
from state_engine.maintenance import expiry
from state_engine.keygroups import key_groups_for_hashes

n = 1000
cols = [
    arrow_array(np.sort(np.arange(n, dtype=np.int32) % 128)),
    arrow_array(np.arange(n, dtype=np.int32) * 7919),
    arrow_array([b"k%d" % i for i in range(n)]),
    arrow_array([b""] * n),
    arrow_array(["count" if i % 2 else "seen" for i in range(n)], pa.string()),
    arrow_array([None] * n),
    arrow_array([b"v"] * n),
    arrow_array([None if i % 3 else i for i in range(n)], pa.int64()),
]
batch = pa.RecordBatch.from_arrays(cols, schema=KEYED_SCHEMA)
table = pa.Table.from_batches([batch])
dropped = expiry.expired_mask(batch, {"count": 500})
kept = batch.filter(arrow_array(~dropped))
new_kg = key_groups_for_hashes(int_values(batch.column("key_hash")), 256)
merged = list(rescale._merged([table], 0, 127))
same = snapshot_read._same_as_previous(table, ["key_group", "state"])
flags = bool_values(arrow_array(same))
assert kept.num_rows + int(dropped.sum()) == n and sum(b.num_rows for b in merged) == n
print("pandas" in sys.modules)
"""


def test_maintenance_task_code_does_not_import_pandas() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TASK_CODE], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr
