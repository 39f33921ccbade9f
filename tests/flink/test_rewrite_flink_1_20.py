"""Real Flink 1.20 restores the savepoints the writer produces from Flink 1.20 snapshots.

The proof of test_rewrite_flink.py, on Flink 1.20.5: the same harness (java/RewriteHarness.java)
compiled against that version's jars (``STATEKEEPER_FLINK_1_20_HOME``, the ``pyflink`` directory
of an ``apache-flink==1.20.*`` install; ``make test`` installs one into ``.venv-flink-1.20``)
produces the sources on a MiniCluster and restores every rewrite at its new max parallelism.
Flink 1.20 writes ``_metadata`` version 4, which has no operator uids: the writer keeps that
version, and the options name operators by OperatorID.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from state_engine.flink.metadata import read_metadata
from state_engine.flink.rewrite.ids import operator_id_of_uid

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

HOME_VAR = "STATEKEEPER_FLINK_1_20_HOME"


@pytest.fixture(scope="session")
def harness_1_20(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    given = os.environ.get(HOME_VAR, "").strip()
    return compile_harness(Path(given) if given else None, HOME_VAR, tmp_path_factory)


@pytest.fixture(scope="module")
def sources(harness_1_20: Harness) -> dict[str, Path]:
    found = produce_sources(harness_1_20)
    for name in ("hm", "rk", "sql"):
        assert read_metadata(str(found[name])).version == 4, name
    return found


@pytest.fixture(scope="module")
def restored(harness_1_20: Harness, sources: dict[str, Path]) -> dict[str, Case]:
    return rewrite_and_restore(harness_1_20, sources, by_operator_id=True)


def test_every_rewrite_of_a_1_20_snapshot_is_a_version_4_canonical_savepoint(
    restored: dict[str, Case],
) -> None:
    for name, case in restored.items():
        written = read_metadata(str(case.out))
        assert (written.version, written.kind, written.format) == (4, "savepoint", "canonical")
        assert case.report["metadata_version"] == 4, name
        assert {op.uid for op in written.operators} == {""}, name


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


def test_dropped_state_and_uid_changed_by_operator_id_restore(restored: dict[str, Case]) -> None:
    case = restored["surgery"]
    assert case.report["uid_changes"] == {operator_id_of_uid("agg-long"): "agg-long-v2"}
    written = {op.operator_id for op in read_metadata(str(case.out)).operators}
    assert operator_id_of_uid("agg-long-v2") in written
    assert operator_id_of_uid("agg-long") not in written
    assert_restored(case)


def test_flink_sql_group_by_rescaled_continues_as_an_uninterrupted_run(
    restored: dict[str, Case], sources: dict[str, Path], harness_1_20: Harness
) -> None:
    assert restored["sql"].report["max_parallelism_changed"]
    assert_sql_continues(harness_1_20, sources)
