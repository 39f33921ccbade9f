"""Real Flink 2.3 restores the savepoints the writer produces (state_engine.flink.rewrite).

One Java harness (tests/flink/java/RewriteHarness.java), compiled once per session with javac
against the apache-flink package's jars, runs every job on a MiniCluster in its own JVM: it
produces the source snapshots (a DataStream job with String and Long keys, Value/List/Map and
TTL state and event-time timers; a Flink SQL GROUP BY), and restores each rewritten savepoint at
its new max parallelism, where the job reports the whole state of every key it is asked about
and every timer that fires. The expected state is what the existing readers read from the source
snapshot, changed as the rewrite says. The runs are sk_rewrite_harness's, shared with the proof
on Flink 1.20 (test_rewrite_flink_1_20.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.flink_cluster import flink_home

from .sk_rewrite_harness import (
    Case,
    Harness,
    assert_rescaled,
    assert_restored,
    assert_sql_continues,
    assert_switched,
    assert_ttl_leaves_no_trace,
    compile_harness,
    produce_sources,
    rewrite_and_restore,
)

pytestmark = [pytest.mark.flink, pytest.mark.slow]


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return compile_harness(flink_home(), "STATEKEEPER_FLINK_HOME", tmp_path_factory)


@pytest.fixture(scope="module")
def sources(harness: Harness) -> dict[str, Path]:
    return produce_sources(harness)


@pytest.fixture(scope="module")
def restored(harness: Harness, sources: dict[str, Path]) -> dict[str, Case]:
    return rewrite_and_restore(harness, sources)


def test_rescale_to_new_max_parallelism_restores_every_key_on_rocksdb(
    restored: dict[str, Case],
) -> None:
    assert_rescaled(restored["rescale"], 300)


def test_rocksdb_incremental_checkpoint_written_canonical_restores_into_hashmap(
    restored: dict[str, Case], sources: dict[str, Path]
) -> None:
    assert_switched(restored["switch"], sources["rk"])


def test_ttl_cleanup_drops_exactly_the_expired_entries(restored: dict[str, Case]) -> None:
    case = restored["ttl"]
    assert_restored(case)
    assert_ttl_leaves_no_trace(case)


def test_dropped_state_and_changed_uid_restore_with_allow_non_restored_state(
    restored: dict[str, Case],
) -> None:
    case = restored["surgery"]
    assert case.report["uid_changes"] == {"agg-long": "agg-long-v2"}
    assert_restored(case)


def test_flink_sql_group_by_rescaled_continues_as_an_uninterrupted_run(
    restored: dict[str, Case], sources: dict[str, Path], harness: Harness
) -> None:
    case = restored["sql"]
    assert (
        "GroupAggregate" in " ".join(o["uid"] or "" for o in case.report["operators"])
        or (case.report["max_parallelism_changed"])
    )
    assert_sql_continues(harness, sources)
