"""Sinks: the two-phase commit protocol, recovery after a crash, idempotent commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from state_engine.backends.operator_state import OperatorStateBackend, group_by_subtask
from state_engine.errors import SinkCommitFailed
from state_engine.runtime import CollectedOutput, CollectSink, FileSink, SinkWriter
from state_engine.runtime.sinks import Sink


def restore(writers: list[SinkWriter], sink: Sink, new_p: int) -> list[SinkWriter]:
    """A crash and a restore at ``new_p`` from the writers' operator state as it is now."""
    backends = [w.operator_state for w in writers]
    rows = [row for b in backends for row in b.snapshot_rows()]
    meta = backends[0].state_meta()
    restored = OperatorStateBackend.restore_rescaled(
        group_by_subtask(rows, len(writers)), meta, new_p
    )
    new = [SinkWriter(sink, b, "attempt-2") for b in restored]
    sink.recover([c for w in new for c in w.restored_committables()])
    return new


@pytest.fixture(params=["file", "collect"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Sink:
    return FileSink(tmp_path / "out") if request.param == "file" else CollectSink()


def committed(sink: Sink) -> list[Any]:
    if isinstance(sink, FileSink):
        return sink.read_committed()
    assert isinstance(sink, CollectSink)
    return list(sink.records)


def writers_for(sink: Sink, p: int) -> list[SinkWriter]:
    return [SinkWriter(sink, OperatorStateBackend(i, p), "attempt-1") for i in range(p)]


def test_output_is_visible_only_once_its_checkpoint_completes(sink: Sink) -> None:
    a, b = writers_for(sink, 2)
    a.write({"n": 1})
    b.write({"n": 2})
    assert committed(sink) == []
    a.prepare_commit(1)
    b.prepare_commit(1)
    a.write({"n": 3})  # after barrier 1: belongs to checkpoint 2
    assert committed(sink) == []
    a.notify_checkpoint_complete(1)
    b.notify_checkpoint_complete(1)
    assert sorted(r["n"] for r in committed(sink)) == [1, 2]
    a.prepare_commit(2)
    a.notify_checkpoint_complete(2)
    assert sorted(r["n"] for r in committed(sink)) == [1, 2, 3]


@pytest.mark.parametrize("new_p", [1, 3])
def test_crash_after_completion_before_notify_commits_on_restore(sink: Sink, new_p: int) -> None:
    a, b = writers_for(sink, 2)
    for n in range(6):
        (a if n % 2 else b).write({"n": n})
    a.prepare_commit(1)
    b.prepare_commit(1)  # checkpoint 1 takes the state here, then completes...
    a.write({"n": 100})  # ...and this pending output is after it
    b.prepare_commit(2)  # barrier 2 pre-committed nothing of b's; its checkpoint never completes
    a.prepare_commit(2)
    # The crash: restore the state as checkpoint 1 saw it. Its committables were not notified.
    state_at_1 = [
        SinkWriter(sink, OperatorStateBackend(i, 2), "replay") for i in range(2)
    ]  # rebuilt below from the rows checkpoint 1 holds
    for w, orig in zip(state_at_1, (a, b), strict=True):
        for c in orig._state.get():  # noqa: SLF001
            if c["barrier"] <= 1:
                w._state.add(c)  # noqa: SLF001
    restored = restore(state_at_1, sink, new_p)
    assert sorted(r["n"] for r in committed(sink)) == list(range(6))
    if isinstance(sink, FileSink):
        assert list(sink.staging.iterdir()) == []  # barrier 2's staged part was discarded
    # a second recovery of the same state commits nothing twice
    restore(state_at_1, sink, 1)
    assert sorted(r["n"] for r in committed(sink)) == list(range(6))
    restored[0].write({"n": 7})
    restored[0].prepare_commit(1)
    restored[0].notify_checkpoint_complete(1)
    assert sorted(r["n"] for r in committed(sink)) == [*range(6), 7]


def test_file_sink_refuses_to_lose_a_committable(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out")
    (w,) = writers_for(sink, 1)
    w.write({"n": 1})
    w.prepare_commit(1)
    for staged in sink.staging.iterdir():
        staged.unlink()
    with pytest.raises(SinkCommitFailed, match="neither staged"):
        w.notify_checkpoint_complete(1)


def test_collect_sink_commits_a_transaction_once() -> None:
    target = CollectedOutput()
    sink = CollectSink(target)
    (w,) = writers_for(sink, 1)
    w.write([1, "x"])
    w.prepare_commit(1)
    (committable,) = w._state.get()  # noqa: SLF001
    sink.commit([committable])
    sink.commit([committable])
    assert target.records == [[1, "x"]] and target.transactions == 1
