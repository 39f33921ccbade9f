"""Exactly-once sinks by two-phase commit, as Flink's ``FileSink`` / ``TwoPhaseCommitSinkFunction``.

A :class:`SinkWriter` (one per subtask) collects output into an open transaction. At a checkpoint
barrier the transaction is pre-committed (``prepare_commit``: made durable but invisible) and its
committable goes into the subtask's operator state, so the checkpoint holds it. When the checkpoint
completes the committables are committed (made visible). After a crash the restored state lists the
committables of the restored checkpoint: they are committed then (commits are idempotent, as some
may have been committed before the crash), and whatever else was staged is discarded. So output
appears once per record, whatever happened in between.

Savepoints pre-commit like checkpoints but do not commit (as Flink >= 1.15): the next checkpoint,
or a restore from the savepoint, commits their committables.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from state_engine.backends.operator_state import OperatorListState, OperatorStateBackend
from state_engine.errors import InvalidJob, SinkCommitFailed
from state_engine.serde import TypeSerializer, get_serializer

Committable = dict[str, Any]

#: The operator list state (SPLIT) holding a subtask's pre-committed, not yet committed output.
COMMITTABLES_STATE = "sink-committables"


class Sink(ABC):
    """Creates the writers of a job's subtasks and commits (or discards) their transactions."""

    @abstractmethod
    def writer(self, subtask_index: int, attempt: str) -> SinkTransactions:
        """The transaction factory of one subtask in one run (``attempt`` is unique per run)."""

    @abstractmethod
    def commit(self, committables: Sequence[Committable]) -> None:
        """Make pre-committed output visible; a committable already committed is skipped."""

    @abstractmethod
    def recover(self, committables: Sequence[Committable]) -> None:
        """On restore, before anything runs: commit ``committables`` (the restored checkpoint's)
        and discard every other transaction an earlier run left pre-committed or open."""


class SinkTransactions(ABC):
    """The open transaction of one subtask."""

    @abstractmethod
    def write(self, value: Any) -> None: ...

    @abstractmethod
    def pre_commit(self, barrier: int) -> Committable | None:
        """Close the open transaction durably; None when it holds nothing."""

    def abort(self) -> None:  # noqa: B027 (optional hook)
        """Drop the open transaction (the job is killed)."""


class SinkWriter:
    """The sink side of one subtask: open transaction plus committables in operator state."""

    def __init__(self, sink: Sink, operator_state: OperatorStateBackend, attempt: str) -> None:
        self.sink = sink
        self.subtask_index = operator_state.subtask_index
        self._tx = sink.writer(self.subtask_index, attempt)
        self.operator_state = operator_state
        self._state: OperatorListState = operator_state.get_list_state(COMMITTABLES_STATE, "json")
        self.written = 0

    def restored_committables(self) -> list[Committable]:
        """What the restored state holds (handed to :meth:`Sink.recover` once, for all subtasks),
        then forgotten: after recovery it is committed."""
        restored = self._state.get()
        self._state.clear()
        return restored

    def write(self, value: Any) -> None:
        self._tx.write(value)
        self.written += 1

    def prepare_commit(self, barrier: int) -> None:
        """At a barrier, before the snapshot's sync phase: the committable joins the state."""
        committable = self._tx.pre_commit(barrier)
        if committable is not None:
            self._state.add({**committable, "barrier": barrier})

    def notify_checkpoint_complete(self, barrier: int) -> int:
        """Commit everything pre-committed up to ``barrier``; returns how many committables."""
        pending = self._state.get()
        done = [c for c in pending if c["barrier"] <= barrier]
        if done:
            self.sink.commit(done)
            self._state.update([c for c in pending if c["barrier"] > barrier])
        return len(done)

    def abort(self) -> None:
        self._tx.abort()


# --- files ---


def _json_line(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode() + b"\n"


class _FileTransactions(SinkTransactions):
    def __init__(self, sink: FileSink, subtask: int, attempt: str) -> None:
        self._sink = sink
        self._prefix = f"{attempt}-{subtask}"
        self._file: Any = None
        self._name = ""
        self._count = 0
        self._part = 0

    def write(self, value: Any) -> None:
        if self._file is None:
            self._part += 1
            self._name = f"part-{self._prefix}-{self._part}.jsonl"
            self._sink.staging.mkdir(parents=True, exist_ok=True)
            # "x": a staged name is never reused, so nothing committed can be overwritten.
            self._file = open(self._sink.staging / self._name, "xb")  # noqa: SIM115
            self._count = 0
        self._file.write(_json_line(value))
        self._count += 1

    def pre_commit(self, barrier: int) -> Committable | None:
        if self._file is None:
            return None
        f, self._file = self._file, None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        return {"file": self._name, "records": self._count}

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FileSink(Sink):
    """JSON-lines part files in ``directory``; staged under ``directory/.staging`` until their
    checkpoint completes, then renamed into place (one atomic rename per part file)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.staging = self.directory / ".staging"

    def writer(self, subtask_index: int, attempt: str) -> SinkTransactions:
        return _FileTransactions(self, subtask_index, attempt)

    def commit(self, committables: Sequence[Committable]) -> None:
        for c in committables:
            name = c["file"]
            staged, final = self.staging / name, self.directory / name
            if staged.exists():
                os.replace(staged, final)
            elif not final.exists():
                raise SinkCommitFailed(
                    f"part file {name} is neither staged in {self.staging} nor committed in "
                    f"{self.directory}: its {c.get('records', '?')} records are lost (was the "
                    "staging directory cleaned while a checkpoint still referenced it?)"
                )
        if committables:
            _fsync_dir(self.directory)

    def recover(self, committables: Sequence[Committable]) -> None:
        self.commit(committables)
        keep = {c["file"] for c in committables}
        if self.staging.is_dir():
            for staged in self.staging.iterdir():
                if staged.name not in keep:
                    staged.unlink()

    def committed_files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.glob("part-*.jsonl") if p.is_file())

    def read_committed(self) -> list[Any]:
        """Every committed record (part files in name order, lines in file order)."""
        out: list[Any] = []
        for path in self.committed_files():
            with path.open("rb") as f:
                out.extend(json.loads(line) for line in f if line.strip())
        return out


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not every platform can open a directory; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- in-memory collection ---


class CollectedOutput:
    """The external system a :class:`CollectSink` writes to; keep it across a kill and restore.

    It remembers committed transaction ids, as a transactional store would, so a commit repeated
    after a crash is a no-op.
    """

    def __init__(self) -> None:
        self.records: list[Any] = []
        self._committed: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # a copy (e.g. in a worker process) holds the records, not the lock
        with self._lock:
            return {"records": list(self.records), "_committed": set(self._committed)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.records = state["records"]
        self._committed = state["_committed"]
        self._lock = threading.Lock()

    def _commit(self, txn: str, values: Iterable[Any]) -> bool:
        with self._lock:
            if txn in self._committed:
                return False
            self.records.extend(values)
            self._committed.add(txn)
            return True

    @property
    def transactions(self) -> int:
        return len(self._committed)


class _CollectTransactions(SinkTransactions):
    def __init__(self, sink: CollectSink, subtask: int, attempt: str) -> None:
        self._ser = sink.serializer.serialize
        self._prefix = f"{attempt}-{subtask}"
        self._values: list[str] = []
        self._txns = 0

    def write(self, value: Any) -> None:
        # Serialized now: a value mutated after output() must not change what is committed.
        self._values.append(base64.b64encode(self._ser(value)).decode("ascii"))

    def pre_commit(self, barrier: int) -> Committable | None:
        if not self._values:
            return None
        self._txns += 1
        values, self._values = self._values, []
        # The data rides in the checkpoint itself: memory is all an in-memory sink has.
        return {"txn": f"{self._prefix}-{self._txns}", "values": values}

    def abort(self) -> None:
        self._values = []


class CollectSink(Sink):
    """Collects output into ``target.records``, exactly once (values round-trip ``serializer``)."""

    def __init__(self, target: CollectedOutput | None = None, serializer: Any = "json") -> None:
        if target is not None and not isinstance(target, CollectedOutput):
            raise InvalidJob(f"CollectSink target must be a CollectedOutput, got {target!r}")
        self.target = target if target is not None else CollectedOutput()
        self.serializer: TypeSerializer = get_serializer(serializer)

    def writer(self, subtask_index: int, attempt: str) -> SinkTransactions:
        return _CollectTransactions(self, subtask_index, attempt)

    def commit(self, committables: Sequence[Committable]) -> None:
        read = self.serializer.deserialize
        for c in committables:
            self.target._commit(c["txn"], [read(base64.b64decode(v)) for v in c["values"]])

    def recover(self, committables: Sequence[Committable]) -> None:
        # Open transactions of the dead run lived in its memory: nothing to discard.
        self.commit(committables)

    @property
    def records(self) -> list[Any]:
        return self.target.records


def new_attempt_id() -> str:
    """Unique per run, so a restored run never reuses a name an earlier run staged."""
    return uuid.uuid4().hex[:12]
