"""The main job: fraud detection over a generated stream of card transactions.

Per card (the key) the job keeps

- ``profile``: a ValueState (JSON) with the card's recent amounts and its last location and time,
  with a TTL: a card silent for longer than :data:`PROFILE_TTL_MS` starts a new profile;
- ``session_merchants``: a MapState merchant -> count, namespaced by the session (a fixed window
  of :data:`SESSION_MS` of event time), with a TTL as a safety net;
- an event-time timer per session that closes it.

Rules (each emits an alert dict):

- ``amount_spike``: an amount above :data:`SPIKE_FACTOR` x the mean of the card's recent amounts;
- ``impossible_travel``: two transactions further apart than a plane could fly in between;
- ``merchant_burst``: more than :data:`MAX_SESSION_MERCHANTS` distinct merchants in one session
  (decided when the session's timer fires).

Reproducible by construction: every record depends only on (seed, partition, index); a card
lives in one partition, so its records always arrive in one order; TTL runs on processing time
taken from the records (:class:`RecordTimestampClock`), and the session alert depends only on the
session's own records (no record of a session is ever late). So the alerts are the same at any
parallelism, on either backend, and after any kill and restore.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Context,
    GeneratorSource,
    Job,
    JobRunner,
    JsonlSource,
    KeyedProcessFunction,
    RecordTimestampClock,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.runtime.sinks import Sink
from state_engine.runtime.sources import MalformedPolicy, Source
from state_engine.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

JOB_NAME = "fraud-detection"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 1_000  # per partition, between consecutive transactions
JITTER_MS = 400  # a partition's records are at most this far out of order
OUT_OF_ORDERNESS_MS = 500  # > JITTER_MS: no record is ever late, so session alerts are exact
MAX_PARALLELISM = 128

PARTITIONS = 4
RECORDS_PER_PARTITION = 2_500
CARDS_PER_PARTITION = 200
HOT_SHARE = 0.2  # a hot 1% of the cards makes a fifth of the traffic (as real card traffic)
TRAVEL_PROBABILITY = 0.01
SPIKE_PROBABILITY = 0.01
STRAY_PROBABILITY = 0.15

RECENT = 8  # amounts kept per card
MIN_HISTORY = 3  # amounts needed before the spike rule speaks
SPIKE_FACTOR = 5.0
MAX_SPEED_KMH = 900.0  # an airliner
MIN_JUMP_KM = 50.0  # GPS noise and neighbouring towns are not travel
SESSION_MS = 10 * 60 * 1000
MAX_SESSION_MERCHANTS = 6
PROFILE_TTL_MS = 15 * 60 * 1000
SESSION_TTL_MS = 2 * SESSION_MS

CITIES: tuple[tuple[str, float, float], ...] = (
    ("Amsterdam", 52.37, 4.90),
    ("Athens", 37.98, 23.73),
    ("Berlin", 52.52, 13.40),
    ("Dublin", 53.35, -6.26),
    ("Lisbon", 38.72, -9.14),
    ("London", 51.51, -0.13),
    ("Madrid", 40.42, -3.70),
    ("New York", 40.71, -74.01),
    ("Paris", 48.86, 2.35),
    ("Singapore", 1.35, 103.82),
    ("Tokyo", 35.68, 139.69),
    ("Warsaw", 52.23, 21.01),
)
MERCHANTS = tuple(f"merchant-{i:03d}" for i in range(60))


class StreamSize(TypedDict):
    """The generated transaction stream's size: ``**size`` into :func:`build_job`,
    :func:`reference_alerts` or :func:`write_transactions`."""

    partitions: int
    records_per_partition: int
    cards_per_partition: int


PROFILE = ValueStateDescriptor("profile", "json").enable_time_to_live(
    StateTtlConfig(PROFILE_TTL_MS)
)
SESSION_MERCHANTS = MapStateDescriptor("session_merchants", str, int).enable_time_to_live(
    StateTtlConfig(SESSION_TTL_MS)
)


# --- the stream ---


def card_id(partition: int, n: int) -> str:
    return f"card-{partition:02d}-{n:05d}"


def _card_traits(partition: int, n: int) -> tuple[int, float, tuple[str, ...]]:
    """A card's home city, typical amount and favourite merchants: fixed per card."""
    h = (partition * 1_000_003 + n) * 2_654_435_761 % 4_294_967_296
    home = h % len(CITIES)
    typical = 5.0 + (h >> 8) % 120
    favourites = tuple(MERCHANTS[(h >> (12 + 3 * k)) % len(MERCHANTS)] for k in range(4))
    return home, typical, favourites


def make_transaction_fn(
    cards_per_partition: int,
) -> Callable[[int, int, random.Random], dict[str, Any]]:
    """``record_fn(partition, index, rng)`` for a GeneratorSource: one card transaction."""
    hot = max(1, cards_per_partition // 100)

    def transaction(partition: int, index: int, rng: random.Random) -> dict[str, Any]:
        n = rng.randrange(hot if rng.random() < HOT_SHARE else cards_per_partition)
        home, typical, favourites = _card_traits(partition, n)
        city = rng.randrange(len(CITIES)) if rng.random() < TRAVEL_PROBABILITY else home
        amount = typical * rng.lognormvariate(0.0, 0.35)
        if rng.random() < SPIKE_PROBABILITY:
            amount *= rng.uniform(8.0, 20.0)
        merchant = rng.choice(MERCHANTS if rng.random() < STRAY_PROBABILITY else favourites)
        name, lat, lon = CITIES[city]
        return {
            "card": card_id(partition, n),
            "amount": round(amount, 2),
            "merchant": merchant,
            "city": name,
            "lat": lat,
            "lon": lon,
            "ts": START_MS + index * STEP_MS + rng.randrange(JITTER_MS + 1),
        }

    return transaction


def watermarks() -> WatermarkStrategy:
    return WatermarkStrategy("ts", max_out_of_orderness_ms=OUT_OF_ORDERNESS_MS)


def make_source(
    partitions: int = PARTITIONS,
    records_per_partition: int = RECORDS_PER_PARTITION,
    *,
    cards_per_partition: int = CARDS_PER_PARTITION,
    seed: int = 42,
) -> GeneratorSource:
    """The generated transactions: ``partitions`` x ``records_per_partition`` records."""
    return GeneratorSource(
        partitions,
        records_per_partition,
        make_transaction_fn(cards_per_partition),
        seed=seed,
        watermarks=watermarks(),
        name="transactions",
    )


def write_transactions(
    directory: str | Path,
    partitions: int = PARTITIONS,
    records_per_partition: int = RECORDS_PER_PARTITION,
    *,
    cards_per_partition: int = CARDS_PER_PARTITION,
    seed: int = 42,
) -> list[Path]:
    """The same stream as JSON-lines files (one per partition), for a file-based run."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    source = make_source(
        partitions, records_per_partition, cards_per_partition=cards_per_partition, seed=seed
    )
    paths = []
    for part in source.partitions():
        path = out / f"{part}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for raw in source.open(part, 0):
                f.write(json.dumps(raw.value, sort_keys=True) + "\n")
        paths.append(path)
    return paths


def file_source(
    directory: str | Path, *, on_malformed: MalformedPolicy | str = MalformedPolicy.FAIL
) -> JsonlSource:
    """The transactions of :func:`write_transactions` read back from ``directory``."""
    return JsonlSource(directory, watermarks=watermarks(), on_malformed=on_malformed)


def card_of(transaction: dict[str, Any]) -> str:
    card: str = transaction["card"]
    return card


# --- the function ---


def distance_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance (haversine, mean Earth radius)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * 6371.0 * math.asin(min(1.0, math.sqrt(a)))


class FraudDetector(KeyedProcessFunction):
    """Per card: profile (recent amounts, last location), session merchants, alert rules."""

    def open(self, ctx: RuntimeContext) -> None:
        self.profile = ctx.get_state(PROFILE)
        self.merchants = ctx.get_state(SESSION_MERCHANTS)

    def process(self, tx: dict[str, Any], ctx: Context) -> None:
        ts = ctx.timestamp
        amount = tx["amount"]
        card = ctx.current_key
        profile = self.profile.value()
        if profile is not None:
            amounts = profile["amounts"]
            if len(amounts) >= MIN_HISTORY:
                mean = sum(amounts) / len(amounts)
                if amount > SPIKE_FACTOR * mean:
                    ctx.output(
                        {"rule": "amount_spike", "card": card, "ts": ts, "amount": amount,
                         "mean": round(mean, 2)}
                    )  # fmt: skip
            km = distance_km(profile["lat"], profile["lon"], tx["lat"], tx["lon"])
            hours = max(ts - profile["ts"], 1) / 3_600_000
            if km > MIN_JUMP_KM and km / hours > MAX_SPEED_KMH:
                ctx.output(
                    {"rule": "impossible_travel", "card": card, "ts": ts,
                     "from": profile["city"], "to": tx["city"], "km": round(km),
                     "minutes": round(hours * 60, 1)}
                )  # fmt: skip
            amounts = [*amounts[1 - RECENT :], amount]
        else:
            amounts = [amount]
        self.profile.update(
            {"amounts": amounts, "lat": tx["lat"], "lon": tx["lon"], "city": tx["city"], "ts": ts}
        )
        end = (ts // SESSION_MS + 1) * SESSION_MS
        self.merchants.set_current_namespace(end)
        merchant = tx["merchant"]
        self.merchants.put(merchant, (self.merchants.get(merchant) or 0) + 1)
        ctx.timer_service.register_event_time_timer(end - 1)

    def on_timer(self, timestamp: int, ctx: Context) -> None:
        end = timestamp + 1
        self.merchants.set_current_namespace(end)
        seen = self.merchants.items()
        if len(seen) > MAX_SESSION_MERCHANTS:
            ctx.output(
                {"rule": "merchant_burst", "card": ctx.current_key, "ts": timestamp,
                 "merchants": len(seen), "transactions": sum(n for _, n in seen)}
            )  # fmt: skip
        self.merchants.clear()


# --- the job ---


def build_job(
    parallelism: int = 2,
    backend_factory: Any = None,
    *,
    checkpoint_every: int | None = 10_000,
    format: str = "native",
    incremental: bool = True,
    sink: Sink | None = None,
    source: Source | None = None,
    partitions: int = PARTITIONS,
    records_per_partition: int = RECORDS_PER_PARTITION,
    cards_per_partition: int = CARDS_PER_PARTITION,
    seed: int = 42,
    name: str = JOB_NAME,
    retained: int = 3,
) -> Job:
    """The fraud job at ``parallelism`` on ``backend_factory`` (None: the heap).

    ``checkpoint_every``: records between checkpoints (None: checkpoints off). ``format`` and
    ``incremental``: see :class:`~state_engine.checkpoint.CheckpointManager` (``native`` +
    incremental is RocksDB's incremental checkpoint; heap backends write it canonical).
    ``sink``: where alerts go (default: a fresh in-memory CollectSink). ``source``: another
    source of transactions (e.g. :func:`file_source`); default: the generated stream.
    """
    if source is None:
        source = make_source(
            partitions, records_per_partition, cards_per_partition=cards_per_partition, seed=seed
        )
    return Job(
        name,
        source,
        card_of,
        FraudDetector(),
        sink if sink is not None else CollectSink(CollectedOutput()),
        parallelism=parallelism,
        max_parallelism=MAX_PARALLELISM,
        backend=backend_factory,
        clock=RecordTimestampClock(),
        checkpoint_interval_records=checkpoint_every,
        checkpoint_format=format,
        incremental=incremental,
        retained=retained,
    )


def alert_key(alert: Any) -> str:
    return json.dumps(alert, sort_keys=True)


def canonical_alerts(alerts: Iterable[Any]) -> list[dict[str, Any]]:
    """Alerts in one order (they arrive in an order that depends on parallelism)."""
    return sorted(alerts, key=alert_key)


def alert_counts(alerts: Iterable[Any]) -> Counter[str]:
    """Alerts as a multiset: equal multisets = every alert exactly once."""
    return Counter(alert_key(a) for a in alerts)


def reference_alerts(
    *,
    partitions: int = PARTITIONS,
    records_per_partition: int = RECORDS_PER_PARTITION,
    cards_per_partition: int = CARDS_PER_PARTITION,
    seed: int = 42,
    parallelism: int = 1,
    backend_factory: Any = None,
) -> list[dict[str, Any]]:
    """The alerts of an uninterrupted run (no checkpoints), in canonical order."""
    out = CollectedOutput()
    job = build_job(
        parallelism,
        backend_factory,
        checkpoint_every=None,
        sink=CollectSink(out),
        partitions=partitions,
        records_per_partition=records_per_partition,
        cards_per_partition=cards_per_partition,
        seed=seed,
    )
    with JobRunner(job) as runner:
        runner.run()
    return canonical_alerts(out.records)
