"""Heap snapshots written by a forked child: same snapshot as the thread writes, and a child that
fails, dies or is cancelled leaves nothing the parent does not know about."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest

from state_engine.checkpoint.forked import (
    ForkedWrite,
    SnapshotWriterDied,
    can_fork,
    reap_exited,
    run_forked,
)
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.errors import SnapshotCancelled, SnapshotFileExists
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from tests.checkpoint.jobstate import (
    OP,
    add_operator_state,
    apply,
    close,
    factory,
    make_job,
    observe,
    operator_view,
)

pytestmark = pytest.mark.skipif(not can_fork(SnapshotDir.from_url("file:///tmp")), reason="Linux")

KEYS = [f"user-{i}" for i in range(1500)]


@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    """Local files: the only storage a forked child writes to (memory:// stays in the child)."""
    return CheckpointStorage((tmp_path / "checkpoints").as_uri())


def manager(catalog, storage, job: str, fmt: str, *, fork_writer: bool) -> CheckpointManager:
    return CheckpointManager(
        catalog, storage, job, max_parallelism=128, parallelism=2, format=fmt,
        row_group_bytes=4096, fork_writer=fork_writer,
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["canonical", "delta"])
def test_forked_and_threaded_writers_write_the_same_snapshots(catalog, storage, tmp_path, fmt):
    seen = {}
    for fork_writer in (True, False):
        name = f"job-{fmt}-{'fork' if fork_writer else 'thread'}"
        job = make_job("heap", tmp_path / name, 2, track_changes=True)
        with manager(catalog, storage, name, fmt, fork_writer=fork_writer) as m:
            snapshots = []
            for round_ in range(3):  # delta: a base, then deltas on it
                apply(job, KEYS[round_ * 200 : round_ * 200 + 700], round_=round_)
                add_operator_state(job, tag=str(round_))
                record = m.trigger(job).result()
                m.notify_checkpoint_complete()
                stats = [(s.key_group, s.rows) for s in catalog.key_group_stats(record.id, OP)]
                snapshots.append((record.entries, stats))
            restored = m.restore(record.id, parallelism=3, factory=factory("heap", tmp_path))
            seen[fork_writer] = (snapshots, observe(restored.subtasks, KEYS))
            seen[fork_writer, "operator"] = operator_view(restored.subtasks)
            close(restored.subtasks)
        expected = observe(job, KEYS)
        close(job)
        assert seen[fork_writer][1] == expected
    assert seen[True] == seen[False]
    assert seen[True, "operator"] == seen[False, "operator"]


def test_the_child_does_the_work_and_reports_its_files_as_it_opens_them():
    opened: list[str] = []

    def work(report):
        report("a.parquet")
        report("b.parquet")
        return {"pid": os.getpid(), "rows": 3}

    result = run_forked(work, cancelled=lambda: False, opened=opened.append)
    assert result["rows"] == 3 and result["pid"] != os.getpid()
    assert opened == ["a.parquet", "b.parquet"]


def test_an_error_in_the_child_is_raised_here_with_its_traceback():
    def work(report):
        raise SnapshotFileExists("file keyed-0.parquet exists already")

    with pytest.raises(SnapshotFileExists, match="exists already") as exc:
        run_forked(work, cancelled=lambda: False, opened=lambda p: None)
    assert "snapshot writer process" in "".join(exc.value.__notes__)


def test_an_error_that_cannot_be_pickled_still_arrives_as_text():
    class Local(Exception):  # a local class cannot be pickled
        pass

    def work(report):
        raise Local("the disk went away")

    with pytest.raises(SnapshotWriterDied, match="the disk went away"):
        run_forked(work, cancelled=lambda: False, opened=lambda p: None)


def test_a_child_that_dies_is_reported_with_the_files_it_had_opened():
    opened: list[str] = []

    def work(report):
        report("keyed-0-half.parquet")
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(SnapshotWriterDied, match="killed by signal 9"):
        run_forked(work, cancelled=lambda: False, opened=opened.append)
    assert opened == ["keyed-0-half.parquet"]


def test_cancelling_kills_the_child_and_reaps_it(tmp_path):
    marker = tmp_path / "started"
    opened: list[str] = []

    def work(report):
        report("keyed-0-never-finished.parquet")
        marker.touch()
        signal.pause()  # until killed

    child = ForkedWrite(work)
    assert child.wait(cancelled=marker.exists, opened=opened.append) is None
    assert opened == ["keyed-0-never-finished.parquet"]
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # not left behind, not even as a zombie


def test_a_snapshot_cancelled_while_the_child_writes_leaves_nothing(
    catalog, storage, tmp_path, monkeypatch
):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)
    marker = tmp_path / "child-wrote-its-files"
    with manager(catalog, storage, "job", "canonical", fork_writer=True) as m:
        before = {f.path for f in storage.list_files("job")}
        real = CheckpointManager._write_files

        def stalled(self, job_, opened, target=None):
            written = real(self, job_, opened, target)  # every file written, then it stalls
            marker.touch()
            signal.pause()
            return written

        monkeypatch.setattr(CheckpointManager, "_write_files", stalled)
        pending = m.trigger(job)
        for _ in range(3000):  # until the child has written (bounded: ~30 s)
            if marker.exists():
                break
            time.sleep(0.01)
        assert marker.exists()
        assert pending.cancel()
        with pytest.raises(SnapshotCancelled):
            pending.result()
        monkeypatch.undo()
        assert catalog.get_snapshot(pending.snapshot_id).status == "DISCARDED"
        assert {f.path for f in storage.list_files("job")} == before
        done = m.trigger(job).result()  # and the next one goes through
        assert done.status == "COMPLETED" and done.entries > 0
    close(job)


def test_closing_without_waiting_stops_children_of_snapshots_never_taken_up(
    catalog, storage, tmp_path
):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)
    m = manager(catalog, storage, "job", "canonical", fork_writer=True)
    gate = threading.Event()
    m._executor.submit(gate.wait)  # hold the checkpoint thread
    pending = m.trigger(job)
    child = m._in_flight[pending.snapshot_id].child
    assert child is not None
    m.close(wait=False)
    gate.set()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # killed and reaped
    assert catalog.get_snapshot(pending.snapshot_id).status == "PENDING"  # as after a crash
    close(job)


def test_when_fork_fails_the_checkpoint_thread_writes_the_snapshot(
    catalog, storage, tmp_path, monkeypatch
):
    job = make_job("heap", tmp_path, 2)
    apply(job, KEYS)

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    reap_exited(block=True)  # no child of an earlier test keeps the collector frozen
    fds = len(os.listdir("/proc/self/fd"))
    with manager(catalog, storage, "job", "canonical", fork_writer=True) as m:
        record = m.trigger(job).result()
        restored = m.restore(record.id, parallelism=1, factory=factory("heap", tmp_path))
        assert observe(restored.subtasks, KEYS) == observe(job, KEYS)
        close(restored.subtasks)
    close(job)
    # the failed fork left the collector as it was, and no pipe open
    assert gc.get_freeze_count() == 0
    assert len(os.listdir("/proc/self/fd")) <= fds


def test_the_result_arrives_before_the_child_exits_which_is_reaped_later(tmp_path, monkeypatch):
    go = tmp_path / "go"
    real_exit = os._exit

    def exit_when_told(code: int) -> None:  # the child's exit waits until the test says so
        while not go.exists():
            time.sleep(0.005)
        real_exit(code)

    monkeypatch.setattr(os, "_exit", exit_when_told)
    child = ForkedWrite(lambda report: {"rows": 1})
    assert child.wait(cancelled=lambda: False, opened=lambda p: None) == {"rows": 1}
    assert os.waitpid(child.pid, os.WNOHANG) == (0, 0)  # still there: not waited for
    reap_exited()  # not blocking: leaves a child that has not exited
    assert os.waitpid(child.pid, os.WNOHANG) == (0, 0)
    go.touch()
    reap_exited(block=True)
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped: not even a zombie is left
    assert gc.get_freeze_count() == 0  # the collector walks every object again
