"""The proof job: real keyed state of every kind, TTL, and event-time timers, over a generated
stream whose records depend only on their position (so any replay is exact)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Context,
    GeneratorSource,
    Job,
    KeyedProcessFunction,
    RecordTimestampClock,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateEntry,
    StateTtlConfig,
    ValueStateDescriptor,
)

START_MS = 1_700_000_000_000
STEP_MS = 100  # per partition, between consecutive records
JITTER_MS = 50  # records are at most this much out of order within a partition
OUT_OF_ORDERNESS_MS = 60  # > JITTER_MS: no record is ever late
BUCKET_MS = 1_000
USERS_PER_PARTITION = 12
CATEGORIES = ("books", "food", "games", "music", "travel")
LAST_SEEN_TTL_MS = 1_500
BIG_AMOUNT = 90


def make_record(partition: int, index: int, rng: random.Random) -> dict[str, Any]:
    # Each user lives in one partition, so a user's records always arrive in one order.
    return {
        "user": f"u{partition}-{rng.randrange(USERS_PER_PARTITION):02d}",
        "cat": rng.choice(CATEGORIES),
        "amount": rng.randrange(1, 100),
        "ts": START_MS + index * STEP_MS + rng.randrange(JITTER_MS + 1),
    }


def make_source(partitions: int, per_partition: int, seed: int = 11) -> GeneratorSource:
    return GeneratorSource(
        partitions,
        per_partition,
        make_record,
        seed=seed,
        watermarks=WatermarkStrategy("ts", max_out_of_orderness_ms=OUT_OF_ORDERNESS_MS),
    )


def user_of(record: dict[str, Any]) -> str:
    return record["user"]


class UserActivity(KeyedProcessFunction):
    """Per user: count and sum, spend per category, the last three amounts, a last-seen stamp
    with a TTL (a visit after it expired counts as a return), and a per-bucket summary emitted by
    an event-time timer once the watermark passes the bucket's end."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", int, default=0))
        self.returns = ctx.get_state(ValueStateDescriptor("returns", int, default=0))
        self.per_category = ctx.get_state(MapStateDescriptor("per_category", str, int))
        self.recent = ctx.get_state(ListStateDescriptor("recent", int))
        self.buckets = ctx.get_state(MapStateDescriptor("buckets", int, "json"))
        self.last_seen = ctx.get_state(
            ValueStateDescriptor("last_seen", int).enable_time_to_live(
                StateTtlConfig(LAST_SEEN_TTL_MS)
            )
        )

    def process(self, record: dict[str, Any], ctx: Context) -> None:
        amount = record["amount"]
        count = self.count.value() + 1
        self.count.update(count)
        self.total.update(self.total.value() + amount)
        self.per_category.put(record["cat"], (self.per_category.get(record["cat"]) or 0) + amount)
        recent = self.recent.get()
        if len(recent) >= 3:
            self.recent.update([*recent[-2:], amount])
        else:
            self.recent.add(amount)
        if self.last_seen.value() is None and count > 1:
            self.returns.update(self.returns.value() + 1)
        self.last_seen.update(ctx.timestamp)
        end = (ctx.timestamp // BUCKET_MS + 1) * BUCKET_MS
        n, s = self.buckets.get(end) or (0, 0)
        self.buckets.put(end, [n + 1, s + amount])
        ctx.timer_service.register_event_time_timer(end - 1)
        if amount >= BIG_AMOUNT:
            ctx.output({"kind": "big", "user": ctx.current_key, "ts": ctx.timestamp, "n": count})

    def on_timer(self, timestamp: int, ctx: Context) -> None:
        end = timestamp + 1
        n, s = self.buckets.get(end)
        self.buckets.remove(end)
        ctx.output({"kind": "bucket", "user": ctx.current_key, "end": end, "count": n, "sum": s})


def expected_output(partitions: int, per_partition: int, seed: int = 11) -> Counter[str]:
    """The job's output computed without the runtime: a model to check the reference run."""

    source = make_source(partitions, per_partition, seed)
    out: list[dict[str, Any]] = []
    buckets: dict[tuple[str, int], list[int]] = {}
    counts: Counter[str] = Counter()
    for part in source.partitions():
        for raw in source.open(part, 0):
            r = raw.value
            counts[r["user"]] += 1
            if r["amount"] >= BIG_AMOUNT:
                n = counts[r["user"]]
                out.append({"kind": "big", "user": r["user"], "ts": r["ts"], "n": n})
            end = (r["ts"] // BUCKET_MS + 1) * BUCKET_MS
            b = buckets.setdefault((r["user"], end), [0, 0])
            b[0] += 1
            b[1] += r["amount"]
    for (user, end), (n, s) in buckets.items():
        out.append({"kind": "bucket", "user": user, "end": end, "count": n, "sum": s})
    return multiset(out)


def multiset(records: Iterable[Any]) -> Counter[str]:
    import json

    return Counter(json.dumps(r, sort_keys=True) for r in records)


def state_set(entries: Iterable[StateEntry]) -> set[tuple[Any, ...]]:
    """Rows compared as (key, namespace, state, user key, value, expires_at): not key group or
    hash (they follow from the key) and not row order."""
    return {(e.key, e.namespace, e.state, e.user_key, e.value, e.expires_at) for e in entries}


def proof_job(
    p: int,
    backend: Any,
    out: CollectedOutput,
    execution: str | None = None,
    *,
    per_partition: int = 150,
    **kw: Any,
) -> Job:
    """The proof job over 4 partitions of ``per_partition`` records at parallelism ``p``; its
    output in ``out``."""
    return Job(
        "proof",
        make_source(4, per_partition),
        user_of,
        UserActivity(),
        CollectSink(out),
        parallelism=p,
        backend=backend,
        clock=RecordTimestampClock(),
        execution=execution,
        **kw,
    )
