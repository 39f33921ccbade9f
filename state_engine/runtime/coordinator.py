"""The checkpoint coordinator of the local runtime: when to snapshot, and what to do when done.

The runner drives every subtask from one thread and asks :meth:`CheckpointCoordinator.due` between
records, so a barrier is aligned by construction: when it is triggered no subtask has processed a
record after it, and the snapshot's synchronous phase is taken before any subtask moves on. At most
``max_concurrent`` checkpoints are in flight (Flink's ``maxConcurrentCheckpoints``): when the next
one is due and that many are still writing, the runner waits for the oldest, so the checkpoint
positions stay a function of the record count only. Snapshots complete, and their participants are
notified, in trigger order (the manager's checkpoint thread takes them one at a time); a sink's
pre-committed output of barrier N is committed once checkpoint N completed, whatever is still in
flight after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from state_engine.errors import InvalidJob, StatekeeperError
from state_engine.snapshot_enums import SnapshotKind

if TYPE_CHECKING:
    from state_engine.catalog import SnapshotRecord
    from state_engine.checkpoint.manager import CheckpointManager
    from state_engine.checkpoint.state import SubtaskState


#: Records between two looks at the snapshots in flight (each look costs about as much as a
#: record's routing) when checkpoints are due by record count, whose barriers stay exact.
CHECK_EVERY_RECORDS = 64


class BarrierParticipant(Protocol):
    """A subtask as the coordinator sees it."""

    def prepare_snapshot(self, barrier: int) -> SubtaskState:
        """Pre-commit output up to the barrier; the state to snapshot."""
        ...

    def notify_checkpoint_complete(self, barrier: int) -> None: ...


@dataclass
class _InFlight:
    barrier: int
    kind: str
    pending: Any  # PendingSnapshot
    trigger: str


@dataclass
class CheckpointStats:
    """What the coordinator did, for the job result."""

    completed: list[Any] = field(default_factory=list)  # SnapshotRecord of checkpoints
    savepoints: list[Any] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    sync_ms: list[float] = field(default_factory=list)
    #: barriers that waited for an older snapshot to finish (``max_concurrent`` were in flight)
    waited: int = 0


class CheckpointCoordinator:
    """Triggers snapshots every ``interval_records`` records and/or ``interval_seconds`` seconds
    (and on demand) and notifies the participants of each completed checkpoint."""

    def __init__(
        self,
        manager: CheckpointManager,
        participants: Sequence[BarrierParticipant],
        *,
        interval_records: int | None = None,
        interval_seconds: float | None = None,
        max_concurrent: int = 1,
        time_fn: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_records is not None and (
            type(interval_records) is not int or interval_records < 1
        ):
            raise InvalidJob(
                f"checkpoint interval_records must be an int >= 1, got {interval_records!r}"
            )
        if interval_seconds is not None and not interval_seconds > 0:
            raise InvalidJob(f"checkpoint interval_seconds must be > 0, got {interval_seconds!r}")
        if type(max_concurrent) is not int or max_concurrent < 1:
            raise InvalidJob(
                f"max concurrent checkpoints must be an int >= 1, got {max_concurrent!r}"
            )
        self.max_concurrent = max_concurrent
        self.manager = manager
        self.participants = list(participants)
        self.interval_records = interval_records
        self.interval_seconds = interval_seconds
        self._time = time_fn
        self._barrier = 0
        self._last_records = 0
        self._last_time = time_fn()
        self._in_flight: list[_InFlight] = []
        self.stats = CheckpointStats()

    def next_check(self, records: int) -> int:
        """The record count at which the runner should next :meth:`poll` and ask :meth:`due`:
        every record under a time interval (records may be slow), exactly at a record
        interval's barrier and at least every :data:`CHECK_EVERY_RECORDS` otherwise."""
        if self.interval_seconds is not None:
            return records + 1
        nxt = records + CHECK_EVERY_RECORDS
        if self.interval_records is not None:
            nxt = min(nxt, self._last_records + self.interval_records)
        return nxt

    def next_barrier(self) -> int | None:
        """The record count at which a record-interval checkpoint is next due (None: none)."""
        if self.interval_records is None:
            return None
        return self._last_records + self.interval_records

    def due(self, records: int) -> bool:
        every = self.interval_records
        if every is not None and records - self._last_records >= every:
            return True
        return (
            self.interval_seconds is not None
            and self._time() - self._last_time >= self.interval_seconds
        )

    def trigger(
        self,
        records: int,
        *,
        kind: str = SnapshotKind.CHECKPOINT,
        savepoint_dir: str | None = None,
        trigger: str = "periodic",
    ) -> _InFlight:
        """Cut a barrier now; returns the in-flight snapshot (see :meth:`wait`). Waits first
        for the oldest snapshots in flight until fewer than ``max_concurrent`` are."""
        self.poll()
        while len(self._in_flight) >= self.max_concurrent:
            self._finish(self._in_flight.pop(0), notify=True)
            self.stats.waited += 1
        self._barrier += 1
        barrier = self._barrier
        states = [p.prepare_snapshot(barrier) for p in self.participants]
        pending = self.manager.trigger(
            states, kind=kind, savepoint_dir=savepoint_dir, trigger=trigger
        )
        self._last_records, self._last_time = records, self._time()
        self.stats.sync_ms.append(float(getattr(pending.stats, "sync_ms", 0.0)))
        flight = _InFlight(barrier, kind.upper(), pending, trigger)
        self._in_flight.append(flight)
        return flight

    def poll(self) -> None:
        """Finish the snapshots whose asynchronous phase is done (never blocks)."""
        while self._in_flight and self._in_flight[0].pending.done():
            self._finish(self._in_flight.pop(0), notify=True)

    def wait(self, flight: _InFlight) -> SnapshotRecord:
        """Block until ``flight`` (and those before it) finished; its record, or raise."""
        while flight in self._in_flight:
            self._finish(self._in_flight.pop(0), notify=True)
        return self._outcome(flight)

    def wait_all(self, *, notify: bool) -> None:
        """Finish every snapshot in flight. ``notify=False`` models a crash right after the
        snapshots completed: nothing learns of their completion (a restore must commit)."""
        while self._in_flight:
            self._finish(self._in_flight.pop(0), notify=notify)

    def _finish(self, flight: _InFlight, *, notify: bool) -> None:
        try:
            record = flight.pending.result()
        except StatekeeperError as exc:
            # As Flink: a failed checkpoint fails alone; the next one covers its output.
            flight.pending = exc
            self.stats.failed.append(f"{flight.kind} at barrier {flight.barrier}: {exc}")
            return
        flight.pending = record
        if flight.kind == SnapshotKind.SAVEPOINT:
            self.stats.savepoints.append(record)
            return
        self.stats.completed.append(record)
        if notify:
            self.manager.notify_checkpoint_complete(record.checkpoint_id)
            for p in self.participants:
                p.notify_checkpoint_complete(flight.barrier)

    @staticmethod
    def _outcome(flight: _InFlight) -> SnapshotRecord:
        if isinstance(flight.pending, BaseException):
            raise flight.pending
        record: SnapshotRecord = flight.pending  # finished: the committed snapshot's record
        return record

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)
