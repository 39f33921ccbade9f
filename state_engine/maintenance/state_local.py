"""``statectl state show`` without Spark for small snapshots.

Starting a JVM costs longer than reading a few megabytes of Parquet: below
:data:`LOCAL_READ_BYTES` of keyed files (after the key filter picked its row groups' files), the
canonical files are read here with pyarrow through the snapshot's own file system and decoded with
the same decoder the Spark path uses, so both paths print the same rows. Above it, Spark.

Every refusal (unknown snapshot, not COMPLETED, not canonical, unknown operator or state, a key
of the wrong type) happens in :func:`plan_show`, before either path starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from state_engine.catalog import Catalog
from state_engine.maintenance.inputs import InputSnapshot, load_input
from state_engine.maintenance.state_decode import (
    COLUMNS,
    StateDecoder,
    decoder_specs,
    operators_to_read,
    read_plan,
)
from state_engine.snapshot.metadata import SnapshotFile

#: Keyed bytes up to which ``state show`` reads the files itself instead of starting Spark.
LOCAL_READ_BYTES = 64 << 20


@dataclass(frozen=True)
class ShowPlan:
    """What ``state show`` reads: per operator, the files and (for a key) the row groups."""

    inp: InputSnapshot
    specs: dict[str, dict[str, Any]]
    files: dict[str, list[tuple[SnapshotFile, list[int] | None]]]
    key_bytes: dict[str, bytes]
    state: str | None

    @property
    def bytes(self) -> int:
        return sum(f.size for fs in self.files.values() for f, _ in fs)

    @property
    def local(self) -> bool:
        return self.bytes <= LOCAL_READ_BYTES


def plan_show(
    catalog: Catalog,
    snapshot_id: int,
    *,
    state: str | None = None,
    key: str | None = None,
    operator: str | None = None,
) -> ShowPlan:
    """Check the request against the catalog and ``_metadata``; nothing is read yet."""
    inp = load_input(catalog, snapshot_id)
    specs = decoder_specs(inp.meta)
    operators = operators_to_read(snapshot_id, specs, operator, state)
    files: dict[str, list[tuple[SnapshotFile, list[int] | None]]] = {}
    key_bytes: dict[str, bytes] = {}
    for op in operators:
        chosen, (first, last), serialized = read_plan(inp, op, specs, key)
        if serialized is None:
            files[op] = [(f, None) for f in chosen]
        else:  # only the row groups of the key's key group
            key_bytes[op] = serialized
            files[op] = [(f, f.row_groups_for(first, last)) for f in chosen]
    return ShowPlan(inp, specs, files, key_bytes, state)


def _decoded(decoder: StateDecoder, operator: str, table: pa.Table) -> list[dict[str, Any]]:
    """The Spark path's decoding (:meth:`StateDecoder.columns`) as dicts."""
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    text = decoder.columns(
        operator, cols["state"], cols["key"], cols["namespace"], cols["user_key"], cols["value"]
    )
    return [
        {
            "operator": operator,
            "key_group": cols["key_group"][i],
            "state": state,
            "key": text["key"][i],
            "namespace": text["namespace"][i],
            "user_key": text["user_key"][i],
            "value": text["value"][i],
            "expires_at": cols["expires_at"][i],
        }
        for i, state in enumerate(cols["state"])
    ]


def read_rows(plan: ShowPlan, limit: int | None = 100) -> list[dict[str, Any]]:
    """The decoded rows of ``plan`` read with pyarrow, in the Spark path's order."""
    snap = plan.inp.snapshot
    decoder = StateDecoder(plan.specs)
    rows: list[dict[str, Any]] = []
    for op, chosen in plan.files.items():
        for f, groups in chosen:
            with snap.open_input(f.path) as handle:
                parquet = pq.ParquetFile(handle)
                table = parquet.read() if groups is None else parquet.read_row_groups(groups)
            if op in plan.key_bytes:
                table = table.filter(
                    pc.equal(table.column("key"), pa.scalar(plan.key_bytes[op], pa.binary()))
                )
            if plan.state is not None:
                table = table.filter(pc.equal(table.column("state"), plan.state))
            rows.extend(_decoded(decoder, op, table))
    rows.sort(
        key=lambda r: (
            r["operator"],
            r["key_group"],
            r["key"] is not None,
            r["key"] or "",
            r["state"],
        )
    )
    if limit is not None:
        rows = rows[:limit]
    return [{c: r[c] for c in COLUMNS} for r in rows]
