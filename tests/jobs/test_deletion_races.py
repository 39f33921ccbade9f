"""The deleting jobs racing others, on SQLite and PostgreSQL catalogs.

(1) orphan cleanup while a real CheckpointManager commits a checkpoint, paused after its files
are attached and, separately, after they are written but before they are attached;
(2) orphan cleanup while an expire holds the job's file lease: it refuses, or waits;
(3) a deleter whose lease expired (and was taken over) can no longer forget or delete;
(4) a commit whose writer was killed: PENDING, it holds orphan cleanup off shared/ until expire
fails it as stale.
Threads meet through threading.Events set from the jobs' hooks; nothing sleeps.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint.commit import PendingCommit
from state_engine.errors import (
    DeletionLeaseHeld,
    DeletionLeaseLost,
    InvalidJobParams,
    StaleFencingToken,
)
from state_engine.faults import ENV_VAR as CRASH_AT
from state_engine.jobs import expire, orphan_cleanup
from state_engine.maintenance import deletion
from state_engine.maintenance.deletion import (  # type: ignore[attr-defined]  # deletion re-exports it
    LEASE_TTL_S,
    file_lease_name,
)
from state_engine.verify import verify_job
from tests.fixtures.catalog import DATABASES, FakeClock
from tests.jobs.deletiondata import (
    JOB,
    apply,
    checkpoints,
    close,
    exists,
    files_under,
    make_subtasks,
    manager,
    observe,
    plant,
    referenced_urls,
    restored_state,
    set_age,
)

LEASE = file_lease_name(JOB)
WAIT = 60  # a bound on a hung test, never a synchronisation delay


@pytest.fixture
def clock() -> FakeClock:
    """The catalog's clock, moved by hand from the present: lease expiry without sleeping."""
    return FakeClock(datetime.now(UTC))


@pytest.fixture(params=DATABASES)
def cat(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Catalog]:
    url: str = request.getfixturevalue(f"{request.param}_catalog_url")
    with Catalog.open(url, clock=clock) as c:
        yield c


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    return t, out


def hook_for(kind: str, fn: Callable[[], None]) -> Callable[[str, str], None]:
    def hook(k: str, job: str) -> None:
        if k == kind:
            fn()

    return hook


def age_everything(storage) -> None:
    for url in files_under(storage):
        set_age(url, 30)  # no file is protected by being young


def pause_attach(monkeypatch, catalog: Catalog, *, before: bool) -> tuple[Any, Any]:
    """Pause the next attach of a checkpoint committing into ``catalog`` (the transaction that
    records its files) before it begins or after it committed."""
    reached, resume = threading.Event(), threading.Event()
    real = PendingCommit.attach

    def attach(self: PendingCommit, *args: Any, **kw: Any) -> Any:
        mine = self.catalog is catalog
        if mine and before:
            reached.set()
            assert resume.wait(WAIT)
        out = real(self, *args, **kw)
        if mine and not before:
            reached.set()
            assert resume.wait(WAIT)
        return out

    monkeypatch.setattr(PendingCommit, "attach", attach)
    return reached, resume


# --- (1) orphan cleanup during a checkpoint commit ---


@pytest.mark.parametrize("attached", [True, False], ids=["attached", "written-not-attached"])
def test_orphan_cleanup_during_a_commit_never_deletes_the_checkpoint(
    cat, storage, tmp_path: Path, monkeypatch, attached: bool
):
    subtasks = make_subtasks("rocksdb", tmp_path / "db")
    with manager(cat, storage, "native") as m:
        checkpoints(m, subtasks, 1)  # the next one is incremental: new SSTs go to shared/
        orphan = plant(storage, f"{JOB}/chk-77/keyed-0-dead.parquet")
        apply(subtasks, 7)
        expected = observe(subtasks)
        reached, resume = pause_attach(monkeypatch, cat, before=not attached)
        pending = m.trigger(subtasks)
        try:
            assert reached.wait(WAIT)
            age_everything(storage)
            report = orphan_cleanup.run(None, cat, job=JOB, older_than=0)
        finally:
            resume.set()
        record = pending.result(WAIT)
        assert record.status == "COMPLETED"
        files = cat.snapshot_files(record.id)
        assert files and all(exists(f.path) for f in files)
        assert restored_state(m, record.id, tmp_path) == expected
    close(subtasks)
    stats = report["stats"]
    assert not exists(orphan) and stats["deleted"]["items"] == [orphan]
    assert stats["pending_snapshots"] == [record.id]
    own = [f for f in files if f.created_by_snapshot_id == record.id]
    in_dir = [f for f in own if f.path.startswith(record.location.rstrip("/") + "/")]
    new_shared = [f for f in own if "/shared/" in f.path]
    assert in_dir and new_shared  # so both protections below were needed
    if attached:
        # attached: the catalog knows the files; nothing needed the PENDING rules
        assert stats["kept_pending"] == 0 and stats["deferred_shared"] == 0
    else:
        # written, not attached: kept only by the PENDING directory and the in-flight shared rule
        not_metadata = [f for f in in_dir if not f.path.endswith("/_metadata")]
        assert stats["kept_pending"] == len(not_metadata)
        assert stats["deferred_shared"] == len(new_shared)


def test_cleanup_after_the_commit_deletes_what_the_checkpoint_left(cat, storage, tmp_path):
    """The deferred shared files are not kept forever: once nothing is PENDING they are judged."""
    subtasks = make_subtasks("rocksdb", tmp_path / "db")
    with manager(cat, storage, "native") as m:
        records, _ = checkpoints(m, subtasks, 2)
    close(subtasks)
    stray = plant(storage, f"{JOB}/shared/sst-00000000-3-000099.sst")
    age_everything(storage)
    report = orphan_cleanup.run(None, cat, job=JOB, older_than=0)
    assert report["stats"]["deleted"]["items"] == [stray]
    assert all(exists(u) for u in referenced_urls(cat, [r.id for r in records]))


# --- (2) orphan cleanup during an expire ---


def test_orphan_cleanup_during_an_expire_refuses_or_waits(cat, storage, tmp_path, monkeypatch):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(cat, storage, "delta") as m:
        records, states = checkpoints(m, subtasks, 3)
        orphans = [plant(storage, f"{JOB}/chk-90/f{i}") for i in range(3)]
        age_everything(storage)
        latest_files = referenced_urls(cat, [records[-1].id])

        holding, release, b_waiting = threading.Event(), threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            assert release.wait(WAIT)

        monkeypatch.setattr(deletion.hooks, "after_plan", hook_for("expire", hold))
        monkeypatch.setattr(
            deletion.hooks, "on_lease_wait", hook_for("orphan_cleanup", b_waiting.set)
        )
        a, a_out = in_thread(lambda: expire.run(None, cat, job=JOB, retain_last=1))
        try:
            assert holding.wait(WAIT)
            holder = cat.get_lease(LEASE)
            assert holder.owner.startswith("expire:")
            with pytest.raises(DeletionLeaseHeld, match="held by 'expire:"):
                orphan_cleanup.run(None, cat, job=JOB, older_than=0, run_id="refused")
            assert cat.get_run("refused").status == "FAILED"
            assert all(exists(u) for u in orphans)
            # the job's own manager takes the same lease: it does not delete meanwhile
            assert m.collect_garbage() == []
            b, b_out = in_thread(lambda: orphan_cleanup.run(None, cat, job=JOB, older_than=0,
                                                             wait=WAIT))  # fmt: skip
            assert b_waiting.wait(WAIT)
        finally:
            release.set()
        a.join(WAIT)
        b.join(WAIT)
        assert "error" not in a_out and "error" not in b_out, (a_out, b_out)
        assert a_out["result"]["stats"]["snapshots_expired"] == 2
        b_stats = b_out["result"]["stats"]
        assert b_stats["lease_waited"] is True
        assert b_stats["lease_token"] > a_out["result"]["stats"]["lease_token"]
        assert set(b_stats["deleted"]["items"]) == set(orphans)
        assert all(exists(u) for u in latest_files)
        assert restored_state(m, records[-1].id, tmp_path) == states[-1]
        assert cat.get_lease(LEASE).released_at is not None
    close(subtasks)


def test_a_waiting_deleter_gives_up_after_its_wait(cat, storage, tmp_path, monkeypatch):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(cat, storage) as m:
        checkpoints(m, subtasks, 2)
    close(subtasks)
    cat.acquire_lease(LEASE, "someone-else", 300)
    before = files_under(storage)
    waits = []
    monkeypatch.setattr(deletion.hooks, "on_lease_wait", lambda k, j: waits.append(k))
    monkeypatch.setattr(deletion, "POLL_S", 0.001)
    with pytest.raises(deletion.DeletionLeaseTimeout, match="still held by 'someone-else'"):
        expire.run(None, cat, job=JOB, retain_last=1, wait=0.01, run_id="gave-up")
    assert waits and files_under(storage) == before
    assert cat.get_run("gave-up").status == "FAILED"


# --- (3) a stale fencing token cannot delete ---


@pytest.mark.parametrize("how", ["taken-over", "expired"])
def test_a_deleter_that_lost_its_lease_deletes_nothing(
    cat, clock, storage, tmp_path, monkeypatch, how
):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(cat, storage) as m:
        records, _ = checkpoints(m, subtasks, 3)
    close(subtasks)
    old_files = referenced_urls(cat, [r.id for r in records[:2]])
    before = files_under(storage)
    seen: dict[str, int] = {}

    def lose_lease() -> None:
        seen["token"] = cat.get_lease(LEASE).token
        clock.advance(LEASE_TTL_S + 1)  # the lease ran out without a renewal
        if how == "taken-over":
            seen["intruder"] = cat.acquire_lease(LEASE, "intruder", 600)

    point = "before_forget" if how == "taken-over" else "after_plan"
    monkeypatch.setattr(deletion.hooks, point, hook_for("expire", lose_lease))
    error = StaleFencingToken if how == "taken-over" else DeletionLeaseLost
    with pytest.raises(error):
        expire.run(None, cat, job=JOB, retain_last=1, run_id="stale")
    assert cat.get_run("stale").status == "FAILED"
    assert files_under(storage) == before and all(exists(u) for u in old_files)
    if how == "taken-over":
        # refused inside forget_files: the catalog still lists the files for a later deleter
        assert {f.path for f in cat.releasable_files(JOB)} == old_files
        with pytest.raises(StaleFencingToken):
            cat.forget_files(JOB, sorted(old_files), lease=LEASE, token=seen["token"])
        lease = cat.get_lease(LEASE)  # the stale holder's exit did not release the new holder
        assert (lease.owner, lease.token, lease.released_at) == ("intruder", seen["intruder"], None)
        cat.release_lease(LEASE, seen["intruder"])
    else:
        # stopped before it changed anything
        assert all(cat.get_snapshot(r.id).status == "COMPLETED" for r in records)
    monkeypatch.setattr(deletion.hooks, point, None)
    report = expire.run(None, cat, job=JOB, retain_last=1, run_id="stale")
    assert report["attempt"] == 2 and set(report["stats"]["deleted"]["items"]) >= old_files
    assert not any(exists(u) for u in old_files)


def test_files_that_vanished_do_not_stop_an_expire(cat, storage, tmp_path):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(cat, storage) as m:
        records, _ = checkpoints(m, subtasks, 2)
    close(subtasks)
    gone = referenced_urls(cat, [records[0].id])
    shutil.rmtree(tmp_path / "checkpoints" / JOB / "chk-1")  # someone removed them by hand
    report = expire.run(None, cat, job=JOB, retain_last=1)
    stats = report["stats"]
    assert stats["snapshots_expired"] == 1 and stats["files_deleted"] == 0
    assert stats["files_already_gone"] == len(gone) > 0
    assert not {f.path for f in cat.releasable_files(JOB)} & gone
    assert cat.get_lease(LEASE).released_at is not None


# --- (4) a commit whose writer was killed ---

REPO = Path(__file__).resolve().parents[2]
# Two incremental RocksDB checkpoints of the deletiondata job; the process SIGKILLs itself once
# the second one's files are attached (new SSTs in shared/ among them), before its _metadata.
KILLED_WRITER = """
import sys
from pathlib import Path
from state_engine.catalog import Catalog
from state_engine.snapshot.storage import CheckpointStorage
from tests.jobs.deletiondata import checkpoints, make_subtasks, manager

url, root, db = sys.argv[1:]
with Catalog.open(url) as catalog:
    m = manager(catalog, CheckpointStorage(root), "native")
    checkpoints(m, make_subtasks("rocksdb", Path(db)), 2)
"""


def test_expire_fails_a_commit_whose_writer_was_killed_once_it_is_stale(
    cat, storage, clock, tmp_path
):
    url = cat.engine.url.render_as_string(hide_password=False)
    env = {**os.environ, CRASH_AT: "checkpoint.after_attach:2"}
    args = [sys.executable, "-c", KILLED_WRITER, url, storage.url_of(""), str(tmp_path / "db")]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    completed, dead = sorted(cat.list_snapshots(JOB), key=lambda r: r.checkpoint_id)
    assert (completed.status, dead.status) == ("COMPLETED", "PENDING")
    kept = referenced_urls(cat, [completed.id])
    pinned = referenced_urls(cat, [dead.id]) - kept  # attached by the dead writer alone
    assert any("/shared/" in u for u in pinned)
    never_written = dead.location.rstrip("/") + "/_metadata"  # attached, written last
    assert files_under(storage) == kept | pinned - {never_written}
    # and files it wrote but had not attached yet (another subtask's, say): one in its
    # directory, one uploaded to shared/
    in_dir = plant(storage, f"{JOB}/chk-{dead.checkpoint_id}/keyed-1-unattached.parquet")
    assert in_dir.startswith(dead.location.rstrip("/") + "/")
    unattached = {in_dir, plant(storage, f"{JOB}/shared/sst-00000001-1-000099.sst")}
    age_everything(storage)

    # while it is PENDING: orphan cleanup stays out of shared/, and an expire with a cut-off
    # older than the commit leaves it alone
    held = orphan_cleanup.run(None, cat, job=JOB, older_than=0, dry_run=True)["stats"]
    assert held["pending_snapshots"] == [dead.id]
    assert (held["kept_pending"], held["deferred_shared"], held["files_found"]) == (1, 1, 0)
    (finding,) = [f for f in verify_job(cat, JOB).findings if f.kind == "pending"]
    assert finding.snapshot_id == dead.id
    assert f"maintain expire --job {JOB} --abort-pending-older-than" in finding.message
    fresh = expire.run(None, cat, job=JOB, abort_pending_older_than="1h")["stats"]
    assert fresh["pending_aborted"] == 0 and cat.get_snapshot(dead.id).status == "PENDING"

    clock.advance(2 * 3600)  # the commit has been PENDING for two hours now
    before = files_under(storage)
    dry = expire.run(None, cat, job=JOB, abort_pending_older_than="1h", dry_run=True)["stats"]
    assert [p["id"] for p in dry["would_abort_pending"]] == [dead.id]
    assert {i["path"] for i in dry["would_delete"]["items"]} == pinned
    assert files_under(storage) == before and cat.get_snapshot(dead.id).status == "PENDING"

    report = expire.run(None, cat, job=JOB, abort_pending_older_than="1h")
    stats = report["stats"]
    assert [p["id"] for p in stats["aborted_pending"]] == [dead.id]
    assert stats["snapshots_expired"] == 0 and stats["files_already_gone"] == 1
    assert set(stats["deleted"]["items"]) == pinned - {never_written}
    failed = cat.get_snapshot(dead.id)
    assert failed.status == "FAILED" and "presumed dead" in (failed.error or "")
    assert cat.get_run(report["run_id"]).params["abort_pending_older_than"] == "1h"
    assert not any(exists(u) for u in pinned) and all(exists(u) for u in kept)

    # nothing PENDING: orphan cleanup judges shared/ again and takes the rest of the dead commit
    swept = orphan_cleanup.run(None, cat, job=JOB, older_than=0)["stats"]
    assert swept["pending_snapshots"] == [] and swept["deferred_shared"] == 0
    assert set(swept["deleted"]["items"]) == unattached
    assert files_under(storage) == kept
    subtasks = make_subtasks("heap", tmp_path / "expected")
    apply(subtasks, 0)
    with manager(cat, storage, "native") as m:
        assert restored_state(m, completed.id, tmp_path) == observe(subtasks)
    close(subtasks)


def test_a_bad_pending_cut_off_changes_nothing(cat, storage, tmp_path):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(cat, storage) as m:
        records, _ = checkpoints(m, subtasks, 2)
    close(subtasks)
    before = files_under(storage)
    with pytest.raises(InvalidJobParams, match="abort_pending_older_than 'soon'"):
        expire.run(None, cat, job=JOB, abort_pending_older_than="soon", retain_last=1)
    assert files_under(storage) == before
    assert all(cat.get_snapshot(r.id).status == "COMPLETED" for r in records)
