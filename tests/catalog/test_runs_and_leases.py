"""Maintenance runs (idempotent by run id) and leases with fencing tokens."""

from __future__ import annotations

from typing import Any

import pytest

from state_engine.catalog import Catalog, FileRef
from state_engine.errors import (
    InvalidCatalogInput,
    InvalidRunTransition,
    LeaseExpired,
    LeaseHeld,
    NoSuchLease,
    NoSuchRun,
    RunIdConflict,
    StaleFencingToken,
)


def test_a_run_records_params_and_stats_and_retries_keep_its_id(catalog: Catalog) -> None:
    catalog.register_job("orders", max_parallelism=128)
    run = catalog.start_run(
        "compact-1", "compaction", job="orders", params={"target_mb": 128}, dag_id="maint",
        airflow_run_id="scheduled__1",
    )  # fmt: skip
    assert (run.status, run.attempts, run.job) == ("RUNNING", 1, "orders")
    failed = catalog.fail_run("compact-1", "executor lost")
    assert (failed.status, failed.error) == ("FAILED", "executor lost")
    retried = catalog.start_run("compact-1", "compaction", job="orders", params={"target_mb": 128})
    assert (retried.id, retried.status, retried.attempts) == (run.id, "RUNNING", 2)
    done = catalog.finish_run("compact-1", stats={"files_in": 9}, rows_in=90, rows_out=80)
    assert (done.status, done.stats, done.rows_out) == ("SUCCEEDED", {"files_in": 9}, 80)
    # A retry after success is told so, and changes nothing: its output already exists.
    assert catalog.start_run("compact-1", "compaction", job="orders") == done
    with pytest.raises(InvalidRunTransition, match="already SUCCEEDED"):
        catalog.finish_run("compact-1")
    with pytest.raises(RunIdConflict, match="its own id"):
        catalog.start_run("compact-1", "expire", job="orders")
    assert [r.run_id for r in catalog.list_runs(job="orders")] == ["compact-1"]
    assert catalog.get_run("compact-1") == done


def test_runs_are_listed_newest_first_and_unknown_runs_are_named(
    catalog: Catalog, clock: Any
) -> None:
    for n in range(3):
        catalog.start_run(f"r{n}", "orphan_cleanup")
        clock.advance(60)
    assert [r.run_id for r in catalog.list_runs(limit=2)] == ["r2", "r1"]
    with pytest.raises(NoSuchRun, match="statectl runs"):
        catalog.get_run("nope")
    with pytest.raises(InvalidCatalogInput, match="JSON"):
        catalog.start_run("r9", "expire", params={"when": object()})


def test_lease_tokens_grow_and_a_taken_over_holder_is_stale(catalog: Catalog, clock: Any) -> None:
    name = "job:1:delete"
    first = catalog.acquire_lease(name, "worker-a", 60)
    with pytest.raises(LeaseHeld, match="worker-a"):
        catalog.acquire_lease(name, "worker-b", 60)
    clock.advance(30)
    catalog.renew_lease(name, first, 60)
    clock.advance(61)  # expired: another worker may take it over
    second = catalog.acquire_lease(name, "worker-b", 60)
    assert second > first
    with pytest.raises(StaleFencingToken, match=f"current token is {second}"):
        catalog.check_lease(name, first)
    with pytest.raises(StaleFencingToken):
        catalog.renew_lease(name, first, 60)
    with pytest.raises(StaleFencingToken):
        catalog.release_lease(name, first)
    assert catalog.check_lease(name, second).owner == "worker-b"
    catalog.release_lease(name, second)
    with pytest.raises(LeaseExpired, match="released"):
        catalog.check_lease(name, second)
    assert catalog.acquire_lease(name, "worker-a", 60) == second + 1
    with pytest.raises(NoSuchLease):
        catalog.check_lease("never", 1)


def test_an_expired_lease_cannot_be_renewed(catalog: Catalog, clock: Any) -> None:
    token = catalog.acquire_lease("l", "a", 10)
    clock.advance(10)
    with pytest.raises(LeaseExpired, match="acquire it again"):
        catalog.renew_lease("l", token, 10)


def test_forgetting_files_needs_the_current_lease_and_spares_live_files(
    catalog: Catalog, clock: Any
) -> None:
    catalog.register_job("orders", max_parallelism=128)
    old = catalog.begin_snapshot("orders", location="file:///1", parallelism=1)
    catalog.attach_files(old.id, [FileRef("/o/1", 1), FileRef("/o/s", 1, shared=True)])
    catalog.complete_snapshot(old.id, 0)
    new = catalog.begin_snapshot("orders", location="file:///2", parallelism=1)
    catalog.attach_files(new.id, [FileRef("/o/2", 1), FileRef("/o/s", 1, shared=True)])
    catalog.complete_snapshot(new.id, 0)
    catalog.subsume_snapshot(old.id)
    stale = catalog.acquire_lease("job:orders:delete", "a", 10)
    clock.advance(11)
    token = catalog.acquire_lease("job:orders:delete", "b", 10)
    with pytest.raises(StaleFencingToken):
        catalog.forget_files("orders", ["/o/1"], lease="job:orders:delete", token=stale)
    with pytest.raises(InvalidCatalogInput, match="still referenced"):
        catalog.forget_files("orders", ["/o/1", "/o/s"], lease="job:orders:delete", token=token)
    assert catalog.known_paths("orders") == {"/o/1", "/o/2", "/o/s"}
    forgotten = catalog.forget_files(
        "orders", ["/o/1", "/o/gone"], lease="job:orders:delete", token=token
    )
    assert forgotten == 1
    assert catalog.known_paths("orders") == {"/o/2", "/o/s"}
    assert catalog.orphan_candidates("orders") == []
