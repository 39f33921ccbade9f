"""The cluster tests' stream job: per user a running click count (ValueState), clicks per page
(MapState) and the last page seen (ValueState with a one-day TTL, so TTL cleanup has work); every
click emits the user's new count, so the output proves exactly-once."""

from __future__ import annotations

import random
from typing import Any

from state_engine.checkpoint import HeapBackendFactory
from state_engine.runtime import (
    CollectSink,
    Context,
    GeneratorSource,
    Job,
    KeyedProcessFunction,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

PARTITIONS, PER_PARTITION = 2, 1000
FRESH_PER_PARTITION, HOT_USERS = 200, 5
DAY_MS = 86_400_000


def click(partition: int, index: int, rng: random.Random) -> dict[str, Any]:
    # Many users once at first, then a few hot ones: heap delta checkpoints stay small next to
    # their base.
    fresh = index < FRESH_PER_PARTITION
    user = f"u{partition}-{index:03d}" if fresh else f"hot{rng.randrange(HOT_USERS)}"
    page = rng.choice("abcde")
    return {"user": user, "page": page, "ts": 1_700_000_000_000 + 100 * index}


class ClickCounts(KeyedProcessFunction):
    """Per user a running click count and per page a count; every click emits the new count."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.pages = ctx.get_state(MapStateDescriptor("pages", str, int))
        self.last_page = ctx.get_state(
            ValueStateDescriptor("last_page", str).enable_time_to_live(StateTtlConfig(DAY_MS))
        )

    def process(self, record: dict[str, Any], ctx: Context) -> None:
        count = self.count.value() + 1
        self.count.update(count)
        self.pages.put(record["page"], (self.pages.get(record["page"]) or 0) + 1)
        self.last_page.update(record["page"])
        ctx.output(f"{ctx.current_key}:{count}")


def clicks_job(parallelism: int, sink: CollectSink, job: str = "clicks", **kw: Any) -> Job:
    return Job(
        job,
        GeneratorSource(
            PARTITIONS, PER_PARTITION, click, seed=5, watermarks=WatermarkStrategy("ts")
        ),
        lambda r: r["user"],
        ClickCounts(),
        sink,
        parallelism=parallelism,
        backend=HeapBackendFactory(),
        **kw,
    )
