"""Processing time for the local runtime: any :class:`~state_engine.state.Clock`, or one driven by
the records themselves so that a run (and its replay after a restore) is reproducible."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class RecordDrivenClock(Protocol):
    """A clock the runner moves: to each record's timestamp before the record is processed, and to
    a timer's timestamp before an event-time timer fires."""

    def now_ms(self) -> int: ...

    def observe(self, timestamp: int) -> None: ...


class RecordTimestampClock:
    """Processing time = the timestamp of the record (or event-time timer) being handled.

    Wall-clock processing time makes TTL expiry and processing-time timers depend on how fast the
    job ran; this clock makes them depend on the data only. Per key the time follows that key's
    records, so as long as a key's records arrive in one order (one partition, read in order) the
    key's state evolves identically at any parallelism and after any restore. It is not monotonic
    across keys, by design: a global maximum would depend on how partitions interleave.
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._now = int(start_ms)

    def now_ms(self) -> int:
        return self._now

    def observe(self, timestamp: int) -> None:
        self._now = timestamp
