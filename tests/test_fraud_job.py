"""The fraud job: deterministic alerts, equal at any parallelism and on either backend, and
equal after a kill at parallelism 2 (RocksDB, native incremental) and a resume at 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.examples import fraud
from state_engine.runtime import FileSink, GeneratorSource, JobRunner

SMALL: fraud.StreamSize = {
    "partitions": 4,
    "records_per_partition": 1_500,
    "cards_per_partition": 60,
}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    return fraud.reference_alerts(**SMALL)


def test_alerts_are_deterministic_and_every_rule_fires(reference: list[dict[str, Any]]) -> None:
    assert fraud.reference_alerts(**SMALL) == reference
    rules = {a["rule"] for a in reference}
    assert rules == {"amount_spike", "impossible_travel", "merchant_burst"}
    assert fraud.reference_alerts(**SMALL, seed=43) != reference


def _one_card(amounts_and_gaps: list[tuple[float, int]]) -> list[dict[str, Any]]:
    """The alerts for one card's transactions (amount, ms since the previous one)."""
    times = []
    t = fraud.START_MS
    for _, gap in amounts_and_gaps:
        t += gap
        times.append(t)

    def tx(partition: int, index: int, rng: Any) -> dict[str, Any]:
        return {"card": "card-x", "amount": amounts_and_gaps[index][0], "merchant": "m",
                "city": "Paris", "lat": 48.86, "lon": 2.35, "ts": times[index]}  # fmt: skip

    source = GeneratorSource(1, len(times), tx, watermarks=fraud.watermarks())
    job = fraud.build_job(1, checkpoint_every=None, source=source)
    with JobRunner(job) as runner:
        runner.run()
    return job.sink.records  # type: ignore[attr-defined]  # the job was built with a CollectSink


def test_the_profile_ttl_forgets_an_idle_card() -> None:
    minute = 60_000
    history = [(10.0, minute)] * 4
    spike = [(100.0, minute)]
    assert [a["rule"] for a in _one_card(history + spike)] == ["amount_spike"]
    # the same spike after a silence longer than the TTL meets an empty profile: no history
    late = [(100.0, fraud.PROFILE_TTL_MS + minute)]
    assert _one_card(history + late) == []
    # ...but one just inside the TTL still sees it
    inside = [(100.0, fraud.PROFILE_TTL_MS - minute)]
    assert [a["rule"] for a in _one_card(history + inside)] == ["amount_spike"]


@pytest.mark.parametrize("parallelism", [1, 2, 3])
@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_alerts_equal_at_any_parallelism_on_both_backends(
    tmp_path: Path, reference: list[dict[str, Any]], parallelism: int, backend: str
) -> None:
    factory = HeapBackendFactory() if backend == "heap" else RocksDBBackendFactory(tmp_path)
    alerts = fraud.reference_alerts(**SMALL, parallelism=parallelism, backend_factory=factory)
    assert alerts == reference


def test_a_file_source_gives_the_generators_alerts(
    tmp_path: Path, reference: list[dict[str, Any]]
) -> None:
    fraud.write_transactions(tmp_path / "in", **SMALL)
    job = fraud.build_job(2, checkpoint_every=None, source=fraud.file_source(tmp_path / "in"))
    with JobRunner(job) as runner:
        result = runner.run()
    assert result.records_in == SMALL["partitions"] * SMALL["records_per_partition"]
    assert fraud.canonical_alerts(job.sink.records) == reference  # type: ignore[attr-defined]  # the job was built with a CollectSink


def test_killed_at_p2_on_rocksdb_native_incremental_resumed_at_p3_gives_the_same_alerts(
    tmp_path: Path, catalog: Catalog, reference: list[dict[str, Any]]
) -> None:
    storage = (tmp_path / "checkpoints").as_uri()
    every = 1_000

    def job(p: int, base: str) -> Any:
        return fraud.build_job(
            p,
            RocksDBBackendFactory(tmp_path / base),
            checkpoint_every=every,
            format="native",
            incremental=True,
            sink=FileSink(tmp_path / "alerts"),
            **SMALL,
        )

    killed = JobRunner(job(2, "a"), catalog=catalog, storage=storage).run_until(3_500)
    assert killed.killed and [c.checkpoint_id for c in killed.checkpoints] == [1, 2, 3]
    assert {c.format for c in killed.checkpoints} == {"NATIVE"}
    # incremental: a later checkpoint reuses SSTs that an earlier one uploaded to shared/
    shared = [
        {f.path for f in catalog.snapshot_files(c.id) if f.shared} for c in killed.checkpoints
    ]
    assert shared[0] & shared[1] and shared[1] & shared[2]
    before = len(FileSink(tmp_path / "alerts").read_committed())
    assert 0 < before < len(reference)

    with JobRunner(job(3, "b"), catalog=catalog, storage=storage, restore_from="latest") as r:
        done = r.run()
    assert done.finished and done.restored_from.checkpoint_id == 3 and done.parallelism == 3
    assert done.records_in == SMALL["partitions"] * SMALL["records_per_partition"] - 3 * every
    alerts = FileSink(tmp_path / "alerts").read_committed()
    assert fraud.alert_counts(alerts) == fraud.alert_counts(reference)  # each alert exactly once
