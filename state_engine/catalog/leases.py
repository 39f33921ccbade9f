"""Leases with fencing tokens: who may delete (or otherwise guard a write) right now.

A lease is held until released or until its TTL runs out; every acquisition gets a token one
higher than the last, so a writer whose lease was taken over is recognisably stale.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from state_engine.catalog.models import Lease
from state_engine.catalog.records import LeaseRecord
from state_engine.catalog.store import Store, as_seconds, check_name
from state_engine.errors import LeaseExpired, LeaseHeld, NoSuchLease, StaleFencingToken


class _RaceLost(Exception):
    """Internal: a concurrent first acquisition inserted the lease row first."""


class LeaseMixin(Store):
    def acquire_lease(
        self, name: str, owner: str, ttl: float | timedelta, *, take_over: int | None = None
    ) -> int:
        """Take the lease for ``ttl`` (seconds or timedelta); returns its new fencing token.

        LeaseHeld if another holder's lease is still live (even the same owner's: renew instead),
        unless ``take_over`` is that holder's token: the caller knows the holder is dead (its
        process is gone) and takes the live lease from it, by compare-and-swap on the token, so
        of two callers that both saw the dead holder only one wins.
        """
        check_name(name, "a lease name")
        check_name(owner, "a lease owner")
        delta = as_seconds(ttl)
        try:
            return self._acquire(name, owner, delta, take_over)
        except _RaceLost:
            # Two first-time acquirers raced on the insert; the loser sees the winner's row now.
            return self._acquire(name, owner, delta, take_over)

    def _acquire(self, name: str, owner: str, ttl: timedelta, take_over: int | None) -> int:
        now = self.now()
        with self._write() as s:
            lease = self._lease_row(s, name)
            if lease is None:
                try:
                    with s.begin_nested():
                        s.add(
                            Lease(
                                name=name,
                                owner=owner,
                                token=1,
                                acquired_at=now,
                                expires_at=now + ttl,
                            )
                        )
                except IntegrityError as exc:
                    raise _RaceLost from exc
                return 1
            live = lease.released_at is None and lease.expires_at > now
            if live and lease.token != take_over:
                raise LeaseHeld(
                    f"lease {name!r} is held by {lease.owner!r} (token {lease.token}) until "
                    f"{lease.expires_at.isoformat()}; wait for its release or expiry, then retry"
                )
            lease.owner, lease.token = owner, lease.token + 1
            lease.acquired_at, lease.expires_at, lease.released_at = now, now + ttl, None
            return lease.token

    def renew_lease(self, name: str, token: int, ttl: float | timedelta) -> datetime:
        """Extend a live lease by ``ttl`` from now; returns the new expiry."""
        delta = as_seconds(ttl)
        now = self.now()
        with self._write() as s:
            lease = self._current(s, name, token, now)
            lease.expires_at = now + delta
            return lease.expires_at

    def release_lease(self, name: str, token: int) -> None:
        """Give the lease up (harmless if already released or expired with this token)."""
        now = self.now()
        with self._write() as s:
            lease = self._lease_row(s, name)
            if lease is None:
                raise _no_lease(name)
            _check_token(lease, token)
            if lease.released_at is None:
                lease.released_at = now
                lease.expires_at = min(lease.expires_at, now)

    def check_lease(self, name: str, token: int) -> LeaseRecord:
        """Raise unless ``token`` is the lease's current token and the lease is live."""
        with self._read() as s:
            return _record(self._current(s, name, token, self.now()))

    def get_lease(self, name: str) -> LeaseRecord | None:
        with self._read() as s:
            lease = s.get(Lease, name)
            return None if lease is None else _record(lease)

    def _check_lease_in(self, s: Session, name: str, token: int) -> None:
        """The lease check of a guarded write, inside that write's transaction."""
        self._current(s, name, token, self.now())

    def _lease_row(self, s: Session, name: str) -> Lease | None:
        return s.scalars(
            select(Lease)
            .where(Lease.name == name)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).one_or_none()

    def _current(self, s: Session, name: str, token: int, now: datetime) -> Lease:
        lease = self._lease_row(s, name)
        if lease is None:
            raise _no_lease(name)
        _check_token(lease, token)
        if lease.released_at is not None or lease.expires_at <= now:
            ended = "was released" if lease.released_at is not None else "expired"
            raise LeaseExpired(
                f"lease {name!r} (token {token}) {ended} at "
                f"{(lease.released_at or lease.expires_at).isoformat()}; acquire it again "
                "before writing"
            )
        return lease


def _check_token(lease: Lease, token: int) -> None:
    if token != lease.token:
        raise StaleFencingToken(
            f"fencing token {token} for lease {lease.name!r} is stale: the current token is "
            f"{lease.token}, held by {lease.owner!r}; stop writing and acquire the lease again"
        )


def _no_lease(name: str) -> NoSuchLease:
    return NoSuchLease(f"no lease {name!r} was ever acquired; acquire it before using its token")


def _record(lease: Lease) -> LeaseRecord:
    return LeaseRecord(
        lease.name,
        lease.owner,
        lease.token,
        lease.acquired_at,
        lease.expires_at,
        lease.released_at,
    )
