"""The TTL rule of the maintenance jobs on canonical rows: which entries expired.

An entry expired once ``expires_at <= now`` (the engine's rule, see ``state/ttl.py``), where
``now`` is the processing time for states with a processing-time TTL and the event-time
watermark for states with an event-time TTL. Used by ttl_cleanup and by savepoint (which may drop
expired entries on the way); runs inside Spark tasks, so it stays off pandas.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state_engine.snapshot.canonical import arrow_array, int_values, is_valid
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.state.ttl import INT64_MIN

# state name -> expiry threshold (an entry with expires_at <= threshold is dropped)
Thresholds = dict[str, int]


def thresholds_for(
    meta: SnapshotMetadata, at: int, watermark: int | None
) -> tuple[dict[str, Thresholds], dict[str, str]]:
    """Per operator, the threshold of every state with an active TTL; and why others are kept."""
    out: dict[str, Thresholds] = {}
    skipped: dict[str, str] = {}
    for op in meta.operators:
        per_state: Thresholds = {}
        for name, info in op.states.items():
            ttl = info.get("ttl") if isinstance(info, dict) else None
            if not ttl or ttl.get("update_type") == "DISABLED":
                continue
            if ttl.get("time_domain", "PROCESSING_TIME") == "EVENT_TIME":
                if watermark is None:
                    skipped[f"{op.operator_id}/{name}"] = "event-time TTL and no watermark given"
                    continue
                per_state[name] = watermark
            else:
                per_state[name] = at
        out[op.operator_id] = per_state
    return out, skipped


def expired_mask(batch: pa.RecordBatch, thresholds: Thresholds) -> np.ndarray:
    """True for the rows of ``batch`` whose TTL expired under ``thresholds``."""
    if not thresholds or batch.num_rows == 0:
        return np.zeros(batch.num_rows, dtype=bool)
    names = list(thresholds)
    idx = pc.index_in(batch.column("state"), value_set=arrow_array(names, pa.string()))
    # not pc.fill_null with a Python scalar: that imports pandas in every Spark worker
    idx_np = int_values(idx, null=-1)
    limits = np.array([*thresholds.values(), INT64_MIN], dtype=np.int64)
    expires = batch.column("expires_at")
    has_expiry = is_valid(expires)
    values = int_values(expires)  # nulls read as 0, masked by has_expiry
    mask: np.ndarray = has_expiry & (idx_np >= 0) & (values <= limits[idx_np])
    return mask
