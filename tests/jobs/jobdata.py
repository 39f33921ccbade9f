"""Real job state for the maintenance-job tests (see conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state_engine.backends.heap import HeapKeyedStateBackend
from state_engine.backends.operator_state import OperatorStateBackend
from state_engine.catalog import Catalog, SnapshotRecord
from state_engine.keygroups import compute_key_group_range_for_operator_index
from state_engine.maintenance.output import begin_output
from state_engine.maintenance.ranges import RangeOutput, WriteRange
from state_engine.serde import StrSerializer
from state_engine.snapshot.canonical import CanonicalWriter, write_operator_state
from state_engine.snapshot.metadata import OperatorSnapshot, SnapshotMetadata
from state_engine.snapshot.storage import CheckpointStorage
from state_engine.snapshot_enums import SnapshotFormat
from state_engine.state import (
    VOID_NAMESPACE,
    ListStateDescriptor,
    ManualClock,
    MapStateDescriptor,
    StateTtlConfig,
    TtlTimeDomain,
    ValueStateDescriptor,
)
from state_engine.state.meta import StateEntry

MAX_P = 128
OP = "agg"
T0 = 1_000_000
TTL_MS = 10_000
# count: processing-time TTL; seen: no TTL; tags: event-time TTL
COUNT = ValueStateDescriptor("count", int).enable_time_to_live(StateTtlConfig(TTL_MS))
SEEN = ListStateDescriptor("seen", str)
TAGS = MapStateDescriptor("tags", str, int).enable_time_to_live(
    StateTtlConfig(TTL_MS, time_domain=TtlTimeDomain.EVENT_TIME)
)


@dataclass
class MadeSnapshot:
    record: SnapshotRecord
    rows: list[StateEntry]
    states: dict[str, dict[str, Any]]
    operator_rows: list[tuple[Any, ...]]


def job_rows(keys: list[str], parallelism: int) -> tuple[list[StateEntry], dict[str, Any], list]:
    """The job's state: half the keys written at T0, the rest TTL_MS later (clock and watermark).

    At processing time T0 + TTL_MS the first half of ``count`` has expired; at watermark
    T0 + TTL_MS the first half of ``tags`` has.
    """
    clock = ManualClock(T0)
    rows: list[StateEntry] = []
    states: dict[str, Any] = {}
    op_rows: list[tuple[Any, ...]] = []
    for index in range(parallelism):
        rng = compute_key_group_range_for_operator_index(MAX_P, parallelism, index)
        b = HeapKeyedStateBackend(str, MAX_P, rng, clock)
        b.advance_watermark(T0)
        count, seen, tags = (b.get_state(d) for d in (COUNT, SEEN, TAGS))
        ob = OperatorStateBackend(index, parallelism)
        ob.get_list_state("offsets", int).add_all([index * 10, index * 10 + 1])
        op_rows.extend(ob.snapshot_rows())
        clock.set(T0)
        for phase in (0, 1):
            if phase:
                clock.set(T0 + TTL_MS)
                b.advance_watermark(T0 + TTL_MS)
            for i, k in enumerate(keys):
                if i % 2 != phase or rng.start > _kg(k) or _kg(k) > rng.end:
                    continue
                b.set_current_key(k)
                count.update(i)
                seen.add_all([f"{k}-a", f"{k}-b"])
                tags.put("x", i)
                tags.set_current_namespace(i % 3)
                tags.put("w", -i)
                tags.set_current_namespace(VOID_NAMESPACE)
        with b.snapshot_view() as view:
            rows.extend(sorted(view.iter_entries(), key=lambda r: r.key_group))
            states.update({n: m.to_dict() for n, m in view.states.items()})
    return rows, states, op_rows


def _kg(key: str) -> int:
    from state_engine.keygroups import assign_to_key_group

    return assign_to_key_group(key, MAX_P)


def make_snapshot(
    catalog: Catalog,
    storage: CheckpointStorage,
    *,
    job: str = "orders",
    keys: int = 300,
    parallelism: int = 2,
    kind: str = "CHECKPOINT",
    row_group_bytes: int = 4096,
) -> MadeSnapshot:
    """A COMPLETED canonical snapshot of ``job`` holding :func:`job_rows` state."""
    names = [f"user-{i}" for i in range(keys)]
    rows, states, op_rows = job_rows(names, parallelism)
    catalog.register_job(job, max_parallelism=MAX_P, location=storage.url_of(job))
    out = begin_output(
        catalog,
        storage,
        job,
        kind=kind,
        parallelism=parallelism,
        max_parallelism=MAX_P,
        tag="periodic",
    )
    outputs = []
    for index in range(parallelism):
        rng = compute_key_group_range_for_operator_index(MAX_P, parallelism, index)
        with CanonicalWriter(
            out.snapshot,
            subtask=index,
            max_parallelism=MAX_P,
            key_group_range=(rng.start, rng.end),
            row_group_bytes=row_group_bytes,
        ) as w:
            w.write(r for r in rows if rng.start <= r.key_group <= rng.end)
        written = w.finish()
        outputs.append(
            RangeOutput(
                WriteRange(OP, index, rng.start, rng.end), written.files, written.key_group_stats
            )
        )
    op_file = write_operator_state(out.snapshot, op_rows)
    template = SnapshotMetadata(
        job=job,
        checkpoint_id=out.record.checkpoint_id,
        kind=out.kind,
        format=SnapshotFormat.CANONICAL,
        max_parallelism=MAX_P,
        parallelism=parallelism,
        operators=(
            OperatorSnapshot(
                operator_id=OP,
                key_serializer=StrSerializer().snapshot().to_dict(),
                states=states,
                subtasks=(),
            ),
        ),  # fmt: skip
        files=(),
    )
    meta = out.metadata(template, outputs, {OP: [op_file]})
    record = out.commit(meta, outputs)
    return MadeSnapshot(record, rows, states, op_rows)
