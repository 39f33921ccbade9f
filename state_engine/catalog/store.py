"""The catalog's connection handling: engine, clock, transactions, and database errors mapped."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, TypeVarTuple

from sqlalchemy import Engine, Select, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from state_engine.catalog.engine import BEGIN_MODE, display_url, one_line
from state_engine.errors import CatalogUnreachable, InvalidCatalogInput

T = TypeVar("T")

# Paths per IN (...) list: well under SQLite's 32,766 bound parameters, few round trips.
IN_CHUNK = 5_000


def utcnow() -> datetime:
    return datetime.now(UTC)


def chunks(items: Sequence[T], size: int = IN_CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def as_json(value: Any, what: str) -> Any:
    """Check that ``value`` survives a JSON round trip (it is stored as JSON)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidCatalogInput(
            f"{what} must be JSON (dicts, lists, strings, finite numbers, booleans, null): {exc}"
        ) from exc
    return value


def as_seconds(ttl: float | timedelta) -> timedelta:
    delta = ttl if isinstance(ttl, timedelta) else timedelta(seconds=ttl)
    if delta <= timedelta(0):
        raise InvalidCatalogInput(
            f"a lease TTL must be positive, got {delta}; pass e.g. 60 seconds"
        )
    return delta


#: The longest name the catalog takes (jobs, leases, owners...) unless a column says otherwise.
NAME_MAX_LENGTH = 200


def check_name(value: object, what: str, max_length: int = NAME_MAX_LENGTH) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > max_length:
        raise InvalidCatalogInput(
            f"{what} must be a non-empty string of at most {max_length} characters, got {value!r}"
        )
    return value


def check_int(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidCatalogInput(f"{what} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidCatalogInput(f"{what} must be {bound}, got {value}")
    return value


def check_choice(value: object, what: str, choices: Iterable[str]) -> str:
    allowed = tuple(choices)
    if not isinstance(value, str) or value.upper() not in allowed:
        raise InvalidCatalogInput(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return value.upper()


#: the column types of a statement's rows
Columns = TypeVarTuple("Columns")


def window(stmt: Select[*Columns], limit: int | None, offset: int) -> Select[*Columns]:
    """``stmt`` cut to ``limit`` rows from position ``offset`` (its ORDER BY must be total)."""
    if limit is not None:
        check_int(limit, "limit", 0)
    check_int(offset, "offset", 0)
    return stmt.limit(limit).offset(offset or None)


def count_rows(session: Session, stmt: Select[*Columns]) -> int:
    """How many rows ``stmt`` selects (without its order, limit and offset)."""
    inner = stmt.order_by(None).limit(None).offset(None).subquery()
    return int(session.scalar(select(func.count()).select_from(inner)) or 0)


class Store:
    """An Engine plus a clock; every public catalog call is one transaction."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] | None = None) -> None:
        self.engine = engine
        # Writers start with BEGIN IMMEDIATE on SQLite (see engine.py); no effect on PostgreSQL.
        self._writer = engine.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
        self._clock = clock or utcnow
        self._batch = threading.local()  # this thread's open batch() session, if any

    def now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise InvalidCatalogInput("the catalog clock returned a naive datetime; return UTC")
        return now.astimezone(UTC)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The catalog calls this thread makes inside the block form one write transaction:
        all of them commit at its end, or none (an exception rolls every one back).

        For a caller that makes several calls in a row (a checkpoint's file attach and key-group
        stats): one BEGIN/COMMIT instead of one per call. Keep the block free of slow work (no
        file I/O): it holds the writer lock. A nested batch joins the outer one.
        """
        if getattr(self._batch, "session", None) is not None:
            yield
            return
        with self._transaction(self._writer) as session:
            self._batch.session = session
            try:
                yield
            finally:
                self._batch.session = None

    def _write(self) -> AbstractContextManager[Session]:
        return self._transaction(self._writer)

    def _read(self) -> AbstractContextManager[Session]:
        return self._transaction(self.engine)

    @contextmanager
    def _transaction(self, engine: Engine) -> Iterator[Session]:
        """A session in a transaction of its own on ``engine``, or this thread's open batch
        session (inside a batch a read sees the batch's own writes)."""
        outer = getattr(self._batch, "session", None)
        if outer is not None:
            yield outer
            return
        with (
            self._translate(),
            Session(engine, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise InvalidCatalogInput(
                f"the catalog refused the change: {one_line(exc.orig)}; nothing was written"
            ) from exc
        except DBAPIError as exc:
            raise CatalogUnreachable(
                f"the catalog at {display_url(self.engine.url)} failed: {one_line(exc.orig)}; "
                "check that the database is up and reachable, then retry"
            ) from exc
