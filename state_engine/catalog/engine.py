"""Catalog URLs and engines: psycopg for PostgreSQL, WAL and foreign keys for SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from state_engine.errors import CatalogUnreachable

# A writer waits this long for SQLite's write lock before giving up with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000

# Execution option read by the SQLite "begin" hook: writers take the write lock up front, so two
# writers queue on busy_timeout instead of failing to upgrade a read lock mid-transaction.
BEGIN_MODE = "statekeeper_begin"

_POSTGRES_ALIASES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg3"}


def parse_url(url: str | URL) -> URL:
    """Parse a catalog URL; ``postgresql://`` and ``postgres://`` mean psycopg 3."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError) as exc:
        raise CatalogUnreachable(
            f"catalog URL {str(url)!r} is malformed; use e.g. "
            "'postgresql://user@host:5432/db' or 'sqlite:////abs/path/catalog.db'"
        ) from exc
    if parsed.drivername in _POSTGRES_ALIASES:
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise CatalogUnreachable(
            f"catalog URL {display_url(parsed)!r} names database {parsed.get_backend_name()!r}; "
            "the catalog runs on PostgreSQL ('postgresql://...') or SQLite ('sqlite:///...')"
        )
    return parsed


def one_line(error: object) -> str:
    """A driver's (often multi-line) message as one line, for one-line CLI errors."""
    return " ".join(str(error).split())


def display_url(url: str | URL) -> str:
    """The URL as safe to print: the password hidden."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return "<malformed URL>"
    return url.render_as_string(hide_password=True)


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL, or None for an in-memory database."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An Engine for the catalog at ``url`` (no connection is made yet)."""
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(parsed, **kwargs)
            _configure_sqlite(engine, in_memory=sqlite_path(parsed) is None)
            return engine
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("connect_args", {"connect_timeout": 10})
        return create_engine(parsed, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise CatalogUnreachable(
            f"cannot build an engine for catalog URL {display_url(parsed)!r}: {exc}; "
            "check the URL's driver and options"
        ) from exc


@contextmanager
def foreign_keys_unenforced(conn: Connection) -> Iterator[None]:
    """SQLite's foreign keys off for what runs inside (its connection must not be in a
    transaction: SQLite ignores the pragma there); on again after. Other databases: nothing."""
    if conn.dialect.name != "sqlite":
        yield
        return
    if conn.in_transaction():
        raise RuntimeError("foreign keys can be switched off only outside a transaction")
    raw = conn.connection.driver_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys = ON")


def _configure_sqlite(engine: Engine, *, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own implicit BEGIN is switched off: the "begin" hook below issues it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if not in_memory:
                cursor.execute("PRAGMA journal_mode = WAL")
                # NORMAL is durable across application crashes in WAL mode and much faster.
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(BEGIN_MODE, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")
