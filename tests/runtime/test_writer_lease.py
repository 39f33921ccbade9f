"""One run writes a job's snapshots: the writer lease, on SQLite and PostgreSQL catalogs.

A second run of a live job is refused and changes nothing (in threads and in processes); a
holder on another machine or alive here is never taken over, a dead one here is at once; a run
that lost its lease begins no snapshot and completes none; a run that takes over fails the
unfinished commits of earlier runs, and only theirs; a run that cannot start gives the job up.
The catalog's clock is frozen, so no lease here ever expires by time: every takeover is the
dead-process path. (The fault suite checks the failing of a killed run's commit at every crash
point of the checkpoint path, too.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory
from state_engine.checkpoint.commit import PendingCommit
from state_engine.checkpoint.writer_lease import WRITER_LEASE_TTL_S, Owner, writer_lease_name
from state_engine.errors import (
    JobAlreadyRunning,
    LeaseHeld,
    NoSuchSnapshot,
    StaleFencingToken,
    WriterLeaseLost,
)
from state_engine.examples import fraud
from state_engine.faults import ENV_VAR as CRASH_AT
from state_engine.jobs import orphan_cleanup
from state_engine.runtime import CollectedOutput, FileSink, JobRunner
from tests.fixtures.catalog import FakeClock, on_both_databases
from tests.runtime.sk_runtime_jobs import multiset, proof_job

pytest_generate_tests = on_both_databases

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "faults" / "sk_fault_driver.py"
LEASE = writer_lease_name("proof")


@pytest.fixture
def catalog_clock() -> FakeClock:
    """The catalog's clock, frozen at the test's start: leases expire only when moved."""
    return FakeClock(datetime.now(UTC))


def dead_pid() -> int:
    """The PID of a process of this machine that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def runner(catalog: Catalog, tmp_path: Path, out: CollectedOutput, **kw: Any) -> JobRunner:
    job = proof_job(1, HeapBackendFactory(), out, checkpoint_interval_records=100)
    return JobRunner(job, catalog=catalog, storage=str(tmp_path / "checkpoints"), **kw)


def snapshot_ids(catalog: Catalog, job: str) -> list[tuple[int, str]]:
    return [(s.id, s.status) for s in catalog.list_snapshots(job)]


@pytest.mark.parametrize("execution", ["threads", "processes"])
def test_a_second_run_of_a_live_job_is_refused_and_changes_nothing(
    catalog: Catalog, tmp_path: Path, execution: str
) -> None:
    out = CollectedOutput()
    job = proof_job(2, HeapBackendFactory(), out, execution, checkpoint_interval_records=100)
    first = JobRunner(job, catalog=catalog, storage=str(tmp_path / "checkpoints"))
    first.run_until(250, kill=False)
    first.checkpoint()  # and nothing in flight any more
    holder = catalog.get_lease(LEASE)
    assert holder is not None and holder.owner.startswith("runner/")
    before = snapshot_ids(catalog, "proof")
    assert [status for _, status in before] == ["COMPLETED"] * 3

    second = runner(catalog, tmp_path, CollectedOutput(), restore_from="latest")
    with pytest.raises(JobAlreadyRunning, match=f"{holder.owner}.*holds its writer lease"):
        second.run()
    second.close()
    assert snapshot_ids(catalog, "proof") == before
    now = catalog.get_lease(LEASE)
    assert now is not None and (now.owner, now.token) == (holder.owner, holder.token)

    done = first.run()  # the first run is not disturbed: it finishes, then gives the lease up
    assert done.finished and done.failed_checkpoints == []
    first.close()
    assert catalog.get_lease(LEASE).released_at is not None  # type: ignore[union-attr]
    with runner(catalog, tmp_path, CollectedOutput(), restore_from="latest") as third:
        assert third.run().finished  # now the job is free
        assert third.failed_stale_commits == []


def test_a_holder_is_taken_over_only_when_its_process_is_gone_from_this_machine(
    catalog: Catalog, tmp_path: Path
) -> None:
    here, gone = Owner.this_process(), dead_pid()
    # a PID free here says nothing of a process on another host, or in another PID namespace
    token = None
    for elsewhere in (
        Owner("another-host", here.machine, gone, "0000beef"),
        Owner(here.host, "0badb007.4026531836", gone, "0000f00d"),
    ):
        token = catalog.acquire_lease(LEASE, str(elsewhere), WRITER_LEASE_TTL_S, take_over=token)
        with pytest.raises(JobAlreadyRunning, match=str(elsewhere)):
            runner(catalog, tmp_path, CollectedOutput()).run()
        assert catalog.get_lease(LEASE).token == token  # type: ignore[union-attr]

    # a process of this machine that is alive holds it: refused; once it exited: taken over
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    try:
        alive = Owner(here.host, here.machine, proc.pid, "0000cafe")
        token = catalog.acquire_lease(LEASE, str(alive), WRITER_LEASE_TTL_S, take_over=token)
        with pytest.raises(JobAlreadyRunning, match=str(proc.pid)):
            runner(catalog, tmp_path, CollectedOutput()).run()
    finally:
        proc.communicate(b"")  # it exits and is reaped: its PID is free
    out = CollectedOutput()
    with runner(catalog, tmp_path, out) as run:
        assert run.run().finished
        assert run.manager is not None and run.manager.writer_lease is not None
        assert run.manager.writer_lease.took_over_from == str(alive)
    lease = catalog.get_lease(LEASE)
    assert lease is not None and lease.token == token + 1 and lease.released_at is not None


def test_a_run_that_lost_its_lease_begins_no_snapshot(catalog: Catalog, tmp_path: Path) -> None:
    out = CollectedOutput()
    first = runner(catalog, tmp_path, out)
    first.run_until(150, kill=False)
    lease = first.manager.writer_lease  # type: ignore[union-attr]
    assert lease is not None and lease.token is not None
    # its renewals stalled past the TTL and another run took the job over
    catalog.acquire_lease(LEASE, "runner/x/y/1/successor", WRITER_LEASE_TTL_S,
                          take_over=lease.token)  # fmt: skip
    lease.renew()  # what the background renewal does next
    before = [i for i, _ in snapshot_ids(catalog, "proof")]  # checkpoint 1 may be in flight
    with pytest.raises(WriterLeaseLost, match="lost its writer lease"):
        first.checkpoint()
    with pytest.raises(WriterLeaseLost):
        first.run()  # its next periodic checkpoint
    first.kill()
    assert [i for i, _ in snapshot_ids(catalog, "proof")] == before  # nothing new begun
    assert catalog.get_lease(LEASE).owner == "runner/x/y/1/successor"  # type: ignore[union-attr]


def test_a_stalled_run_cannot_complete_a_checkpoint_after_it_was_taken_over(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint was begun under the lease; the run stalls before completing it, and
    another run takes the job over meanwhile: the completion's fencing check refuses it."""
    first = runner(catalog, tmp_path, CollectedOutput())
    first.run_until(150, kill=False)
    first.checkpoint()  # whatever was in flight has completed
    lease = first.manager.writer_lease  # type: ignore[union-attr]
    assert lease is not None and lease.token is not None
    reached, resume = threading.Event(), threading.Event()
    real = PendingCommit.complete

    def stalled(self: PendingCommit, *args: Any, **kw: Any) -> Any:
        reached.set()
        assert resume.wait(60)  # a bound on a hung test, never a synchronisation delay
        return real(self, *args, **kw)

    monkeypatch.setattr(PendingCommit, "complete", stalled)
    outcome: dict[str, Any] = {}

    def take_checkpoint() -> None:
        try:
            outcome["record"] = first.checkpoint()
        except BaseException as exc:
            outcome["error"] = exc

    t = threading.Thread(target=take_checkpoint)
    t.start()
    assert reached.wait(60)
    catalog.acquire_lease(LEASE, "runner/x/y/1/successor", WRITER_LEASE_TTL_S,
                          take_over=lease.token)  # fmt: skip
    resume.set()
    t.join(60)
    assert isinstance(outcome.get("error"), StaleFencingToken), outcome
    (stalled_snapshot,) = [s for s in catalog.list_snapshots("proof") if s.status != "COMPLETED"]
    assert stalled_snapshot.status in ("FAILED", "DISCARDED")  # aborted as a failed checkpoint
    latest = catalog.latest_snapshot("proof")
    assert latest is not None and latest.checkpoint_id < stalled_snapshot.checkpoint_id
    first.kill()


def test_the_next_run_fails_the_commit_a_killed_run_left(
    catalog: Catalog, catalog_url: str, tmp_path: Path
) -> None:
    """The fraud job in a process SIGKILLed once checkpoint 2's files are attached: its commit
    is PENDING, its lease live for a minute more. The next run takes the job over at once,
    fails that commit and removes its directory, and finishes with every alert exactly once."""
    storage = (tmp_path / "checkpoints").as_uri()
    stream = {"partitions": 2, "records_per_partition": 300, "cards_per_partition": 20}
    args = [sys.executable, str(DRIVER), "job", "--catalog", catalog_url, "--storage", storage,
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "alerts"),
            "--config", "heap-delta", "--parallelism", "2", "--every", "150"]  # fmt: skip
    args += [a for k, v in stream.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    env = {**os.environ, CRASH_AT: "checkpoint.after_attach:2"}
    killed = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (dead,) = catalog.list_snapshots(fraud.JOB_NAME, status="PENDING")
    dead_dir = Path(dead.location.removeprefix("file://"))
    assert dead_dir.is_dir()
    holder = catalog.get_lease(writer_lease_name(fraud.JOB_NAME))
    assert holder is not None and holder.released_at is None  # held by the dead process
    held = orphan_cleanup.run(None, catalog, job=fraud.JOB_NAME, older_than=0, dry_run=True)
    assert held["stats"]["pending_snapshots"] == [dead.id]

    job = fraud.build_job(2, HeapBackendFactory(track_changes=True), checkpoint_every=150,
                          format="delta", incremental=True, sink=FileSink(tmp_path / "alerts"),
                          **stream)  # type: ignore[arg-type]  # fmt: skip
    with JobRunner(job, catalog=catalog, storage=storage, restore_from="latest") as run:
        assert [s.id for s in run.failed_stale_commits] == []  # not started yet
        result = run.run()
        assert [s.id for s in run.failed_stale_commits] == [dead.id]
        assert run.manager is not None and run.manager.writer_lease is not None
        assert run.manager.writer_lease.took_over_from == holder.owner
    assert result.finished and result.restored_from is not None
    assert result.restored_from.checkpoint_id == dead.checkpoint_id - 1
    failed = catalog.get_snapshot(dead.id)
    assert failed.status == "FAILED"
    assert "its run stopped before completing it" in (failed.error or "")
    assert not dead_dir.exists()
    swept = orphan_cleanup.run(None, catalog, job=fraud.JOB_NAME, older_than=0, dry_run=True)
    assert swept["stats"]["pending_snapshots"] == [] and swept["stats"]["deferred_shared"] == 0
    alerts = FileSink(tmp_path / "alerts").read_committed()
    expected = fraud.alert_counts(fraud.reference_alerts(**stream))  # type: ignore[arg-type]
    assert fraud.alert_counts(alerts) == expected


def test_runs_one_after_another_share_nothing_but_the_catalog(
    catalog: Catalog, tmp_path: Path
) -> None:
    outs = [CollectedOutput(), CollectedOutput()]
    with runner(catalog, tmp_path, outs[0]) as a:
        a.run()
    with runner(catalog, tmp_path, outs[1]) as b:
        b.run()
    assert multiset(outs[0].records) == multiset(outs[1].records)
    lease = catalog.get_lease(LEASE)
    assert lease is not None and lease.token == 2 and lease.released_at is not None


def test_only_the_commits_of_earlier_runs_are_failed(catalog: Catalog, tmp_path: Path) -> None:
    """A run fails the PENDING snapshots earlier runs began, never one begun without a writer
    lease (a maintenance run's output, a CheckpointManager driven directly), whatever its
    trigger."""
    with runner(catalog, tmp_path, CollectedOutput()) as first:
        first.run()
    storage = tmp_path / "checkpoints" / "proof"
    dead = Owner(Owner.this_process().host, Owner.this_process().machine, dead_pid(), "00dead00")
    left = catalog.begin_snapshot("proof", location=(storage / "chk-90").as_uri(),
                                  parallelism=1, writer=str(dead))  # fmt: skip
    theirs = [
        catalog.begin_snapshot(
            "proof", location=(storage / f"chk-{n}").as_uri(), parallelism=1, trigger=trigger
        )  # fmt: skip
        for n, trigger in ((91, "periodic"), (92, "run-0123abcd"))
    ]
    with runner(catalog, tmp_path, CollectedOutput(), restore_from="latest") as second:
        second.run()
        assert [s.id for s in second.failed_stale_commits] == [left.id]
    assert catalog.get_snapshot(left.id).status == "FAILED"
    assert [catalog.get_snapshot(s.id).status for s in theirs] == ["PENDING", "PENDING"]


def test_a_run_that_cannot_start_gives_the_job_up(catalog: Catalog, tmp_path: Path) -> None:
    broken = runner(catalog, tmp_path, CollectedOutput(), restore_from=12345)
    with pytest.raises(NoSuchSnapshot):
        broken.run()
    lease = catalog.get_lease(LEASE)
    assert lease is not None and lease.released_at is not None
    with runner(catalog, tmp_path, CollectedOutput()) as fresh:
        assert fresh.run().finished


def test_of_two_runs_taking_over_one_dead_holder_one_wins(catalog: Catalog) -> None:
    dead = catalog.acquire_lease(LEASE, "runner/h/m/1/dead", WRITER_LEASE_TTL_S)
    catalog.acquire_lease(LEASE, "runner/h/m/2/first", WRITER_LEASE_TTL_S, take_over=dead)
    with pytest.raises(LeaseHeld, match="runner/h/m/2/first"):
        catalog.acquire_lease(LEASE, "runner/h/m/3/second", WRITER_LEASE_TTL_S, take_over=dead)


def test_a_job_name_too_long_for_a_lease_name_gets_a_digest() -> None:
    long_a, long_b = "j" * 200, "j" * 199 + "k"
    names = {writer_lease_name(long_a), writer_lease_name(long_b)}
    assert len(names) == 2 and all(len(n) <= 200 for n in names)
    assert writer_lease_name("fraud") == "writer:fraud"
