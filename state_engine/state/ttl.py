"""State time-to-live: Flink's ``StateTtlConfig`` plus an injectable clock.

Expiry is kept as an absolute ``expires_at`` timestamp in milliseconds (the canonical snapshot
column): ``write_or_access_time + ttl_ms``; a value is expired once ``expires_at <= now`` (Flink:
``lastAccess + ttl <= now``). In the event-time domain ``now`` is the backend's current watermark.
It starts at the int64 minimum, so event-time state written before the first watermark expires at
the first real watermark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from state_engine.errors import InvalidStateDescriptor

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


@runtime_checkable
class Clock(Protocol):
    """A source of processing time in epoch milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock processing time."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to: tests advance it instead of sleeping."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = int(start_ms)

    def now_ms(self) -> int:
        return self._now

    def advance(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise InvalidStateDescriptor(
                f"ManualClock cannot move backwards (advance by {delta_ms} ms): "
                "pass a non-negative delta"
            )
        self._now += int(delta_ms)

    def set(self, now_ms: int) -> None:
        self._now = int(now_ms)


class UpdateType(Enum):
    """When the expiry of a value is pushed forward. DISABLED turns TTL off (as in Flink)."""

    DISABLED = "DISABLED"
    ON_CREATE_AND_WRITE = "ON_CREATE_AND_WRITE"
    ON_READ_AND_WRITE = "ON_READ_AND_WRITE"


class StateVisibility(Enum):
    """Whether a read may return an expired value that has not been cleaned up yet."""

    NEVER_RETURN_EXPIRED = "NEVER_RETURN_EXPIRED"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "RETURN_EXPIRED_IF_NOT_CLEANED_UP"


class TtlTimeDomain(Enum):
    """Processing time (the backend's clock) or event time (the backend's watermark)."""

    PROCESSING_TIME = "PROCESSING_TIME"
    EVENT_TIME = "EVENT_TIME"


@dataclass(frozen=True)
class CleanupStrategies:
    """Background cleanup of expired state, besides the lazy cleanup on every read.

    - ``full_snapshot``: expired entries are left out of every snapshot export.
    - ``incremental_size``: heap backend; every state access checks this many entries (0: off),
      cycling through the state with a persistent cursor; ``incremental_every_record`` also runs
      one step per ``set_current_key``.
    - ``rocksdb_compaction``: RocksDB backend; rocksdict cannot install a Python compaction filter,
      so this enables the explicit ``cleanup_expired()`` sweep instead (see that method).
    """

    full_snapshot: bool = False
    incremental_size: int = 0
    incremental_every_record: bool = False
    rocksdb_compaction: bool = False

    def __post_init__(self) -> None:
        if type(self.incremental_size) is not int or self.incremental_size < 0:
            raise InvalidStateDescriptor(
                f"incremental cleanup size {self.incremental_size!r} is not a non-negative int: "
                "pass the number of entries to check per state access (Flink's default is 5)"
            )
        if self.incremental_every_record and not self.incremental_size:
            raise InvalidStateDescriptor(
                "incremental_every_record needs incremental_size > 0: "
                "set the number of entries to check per step"
            )


@dataclass(frozen=True)
class StateTtlConfig:
    """Flink's ``StateTtlConfig``: expire state ``ttl_ms`` after its last write (or read)."""

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup: CleanupStrategies = field(default_factory=CleanupStrategies)
    time_domain: TtlTimeDomain = TtlTimeDomain.PROCESSING_TIME

    def __post_init__(self) -> None:
        if type(self.ttl_ms) is not int or self.ttl_ms <= 0:
            raise InvalidStateDescriptor(
                f"TTL {self.ttl_ms!r} is not a positive int of milliseconds: "
                "pass e.g. StateTtlConfig(ttl_ms=60_000) for one minute"
            )
        for name, enum in (
            ("update_type", UpdateType),
            ("visibility", StateVisibility),
            ("time_domain", TtlTimeDomain),
        ):
            if not isinstance(getattr(self, name), enum):
                raise InvalidStateDescriptor(
                    f"TTL {name} {getattr(self, name)!r} is not a {enum.__name__}: "
                    f"use one of {[m.name for m in enum]}"
                )
        if not isinstance(self.cleanup, CleanupStrategies):
            raise InvalidStateDescriptor(
                f"TTL cleanup {self.cleanup!r} is not a CleanupStrategies: "
                "pass CleanupStrategies(full_snapshot=..., incremental_size=...)"
            )

    @property
    def enabled(self) -> bool:
        return self.update_type is not UpdateType.DISABLED

    @property
    def update_on_read(self) -> bool:
        return self.update_type is UpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        return self.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP

    def to_dict(self) -> dict[str, Any]:
        c = self.cleanup
        return {
            "ttl_ms": self.ttl_ms,
            "update_type": self.update_type.value,
            "visibility": self.visibility.value,
            "time_domain": self.time_domain.value,
            "cleanup": {
                "full_snapshot": c.full_snapshot,
                "incremental_size": c.incremental_size,
                "incremental_every_record": c.incremental_every_record,
                "rocksdb_compaction": c.rocksdb_compaction,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StateTtlConfig:
        try:
            return cls(
                ttl_ms=data["ttl_ms"],
                update_type=UpdateType(data.get("update_type", "ON_CREATE_AND_WRITE")),
                visibility=StateVisibility(data.get("visibility", "NEVER_RETURN_EXPIRED")),
                time_domain=TtlTimeDomain(data.get("time_domain", "PROCESSING_TIME")),
                cleanup=CleanupStrategies(**data.get("cleanup", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidStateDescriptor):
                raise
            raise InvalidStateDescriptor(
                f"cannot read a TTL config from {data!r}: {exc}; "
                "expected the dict that StateTtlConfig.to_dict() writes"
            ) from exc


def expiry(now: int, ttl_ms: int) -> int:
    """``now + ttl_ms`` clamped to int64 (the canonical ``expires_at`` column is int64)."""
    t = now + ttl_ms
    return t if t <= INT64_MAX else INT64_MAX
