"""Read-only SQL over the catalog (``statectl sql``): one SELECT, in a read-only transaction.

The statement is checked twice: its first keyword must be SELECT, WITH or EXPLAIN and there must
be one statement only; then it runs in a transaction the database itself keeps read-only
(``SET TRANSACTION READ ONLY`` on PostgreSQL, ``PRAGMA query_only`` on SQLite), which also stops
writes hidden in a CTE or behind EXPLAIN ANALYZE.

It is also bounded: a timeout (PostgreSQL's ``statement_timeout``; on SQLite a progress handler
that interrupts the statement) and a cap on the rows and bytes read back (rows are streamed and
reading stops at the cap; on SQLite no single value may exceed the byte cap either).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from state_engine.catalog.engine import one_line
from state_engine.catalog.records import QueryResult
from state_engine.errors import CatalogUnreachable, QueryFailed, ReadOnlyViolation

READ_KEYWORDS = ("SELECT", "WITH", "EXPLAIN")


def _code_only(sql: str) -> str:
    """``sql`` with comments blanked and string/identifier literals emptied."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        elif ch in ("'", '"'):
            end = i + 1
            while end < n:
                if sql[end] == ch and sql[end + 1 : end + 2] == ch:
                    end += 2  # a doubled quote is an escaped quote
                elif sql[end] == ch:
                    break
                else:
                    end += 1
            out.append(ch + ch)
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def check_read_only(sql: str) -> str:
    """Return the statement (without a trailing semicolon) or raise ReadOnlyViolation."""
    code = _code_only(sql).strip()
    body = code.rstrip("; \t\r\n")
    if not body:
        raise ReadOnlyViolation("the query is empty; pass one SELECT statement")
    if ";" in body:
        raise ReadOnlyViolation(
            "statectl sql runs exactly one statement; remove everything after the first ';'"
        )
    first = body.split(None, 1)[0].upper().lstrip("(")
    if first not in READ_KEYWORDS:
        raise ReadOnlyViolation(
            f"statectl sql is read-only and {first} is not a query; only SELECT, WITH and "
            "EXPLAIN statements run here (change the catalog through statectl or the repository)"
        )
    return sql.strip().rstrip(";").rstrip()


def _is_write_refusal(exc: DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) == "25006":  # read_only_sql_transaction
        return True
    message = str(exc.orig).lower()
    return "readonly database" in message or "read-only transaction" in message


#: Defaults of ``statectl sql``: a query may run this long and return this much.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 16 << 20
# SQLite calls the progress handler every this many virtual-machine instructions
_PROGRESS_STEPS = 10_000
_SQLITE_LIMIT_LENGTH = 0  # sqlite3.SQLITE_LIMIT_LENGTH: the longest string or blob


def _row_bytes(row: Any) -> int:
    """About what a row costs to hold and print: its values' text or byte lengths."""
    total = 0
    for value in row:
        if isinstance(value, bytes | bytearray | memoryview | str):
            total += len(value)
        else:
            total += 8
    return total


@contextmanager
def _sqlite_limits(conn: Connection, timeout_s: float, max_bytes: int) -> Iterator[None]:
    """Interrupt the statement after ``timeout_s``; refuse any value longer than ``max_bytes``."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, sqlite3.Connection):
        raise CatalogUnreachable("the SQLite catalog connection is closed; open the catalog again")
    deadline = time.monotonic() + timeout_s
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    # a single randomblob(1e9) never reaches a row boundary: cap the value itself
    previous = raw.setlimit(_SQLITE_LIMIT_LENGTH, max(1, min(max_bytes, 1_000_000_000)))
    try:
        yield
    finally:
        raw.set_progress_handler(None, 0)
        raw.setlimit(_SQLITE_LIMIT_LENGTH, previous)


def _is_timeout(exc: DBAPIError, sqlite: bool) -> bool:
    if sqlite:
        return "interrupted" in str(exc.orig).lower()
    return getattr(exc.orig, "sqlstate", None) == "57014"  # query_canceled


def _begin_postgres(conn: Connection, timeout_s: float) -> None:
    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
    # the server stops the statement itself; local to this (rolled back) transaction
    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")


def run_readonly(
    engine: Engine,
    sql: str,
    *,
    max_rows: int | None = None,
    timeout_s: float | None = None,
    max_bytes: int | None = None,
) -> QueryResult:
    """Run one read-only statement; stop it after ``timeout_s`` (QueryFailed) and stop reading
    rows at ``max_rows`` rows or ``max_bytes`` bytes (the result says it was cut)."""
    statement = check_read_only(sql)
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else int(max_bytes)
    if not timeout_s > 0:
        raise QueryFailed(f"timeout {timeout_s} s must be above 0; e.g. --timeout 30")
    if max_bytes < 1 or (max_rows is not None and max_rows < 0):
        raise QueryFailed("the output caps must be positive; e.g. --max-rows 100 --max-bytes 1M")
    sqlite = engine.dialect.name == "sqlite"
    try:
        conn = engine.connect()
    except DBAPIError as exc:
        raise CatalogUnreachable(f"cannot connect to the catalog: {one_line(exc.orig)}") from exc
    with conn:
        limits: AbstractContextManager[None]
        try:
            if sqlite:
                conn.exec_driver_sql("PRAGMA query_only = ON")
                limits = _sqlite_limits(conn, timeout_s, max_bytes)
            else:
                _begin_postgres(conn, timeout_s)
                limits = nullcontext()
            with limits:
                try:
                    # rows are streamed (a server-side cursor on PostgreSQL): reading stops at
                    # the caps without the rest ever reaching this process
                    # per statement: Connection.execution_options would stay on the connection
                    result = conn.exec_driver_sql(
                        statement, execution_options={"stream_results": not sqlite}
                    )
                except DBAPIError as exc:
                    # a cursor takes SELECT and VALUES only: EXPLAIN, or a write hidden in a WITH,
                    # runs as a plain statement (the read-only transaction still refuses writes)
                    # (42601: syntax error; 0A000: a data-modifying WITH in a cursor)
                    if sqlite or getattr(exc.orig, "sqlstate", None) not in ("42601", "0A000"):
                        raise
                    conn.rollback()
                    _begin_postgres(conn, timeout_s)
                    result = conn.exec_driver_sql(statement)
                if not result.returns_rows:
                    raise ReadOnlyViolation(
                        "the statement returned no rows; pass one SELECT statement"
                    )
                columns = list(result.keys())
                rows: list[tuple[Any, ...]] = []
                size, cut = 0, None
                while True:
                    if max_rows is not None and len(rows) >= max_rows:
                        if result.fetchone() is not None:
                            cut = f"{max_rows:,} rows"
                        break
                    row = result.fetchone()
                    if row is None:
                        break
                    size += _row_bytes(row)
                    if size > max_bytes:
                        cut = f"{max_bytes:,} bytes"
                        break
                    rows.append(tuple(row))
                result.close()
            return QueryResult(columns, rows, truncated=cut)
        except DBAPIError as exc:
            if _is_write_refusal(exc):
                raise ReadOnlyViolation(
                    f"statectl sql is read-only and the database refused a write: "
                    f"{one_line(exc.orig)}; run only queries here"
                ) from exc
            if _is_timeout(exc, sqlite):
                raise QueryFailed(
                    f"the query ran longer than its timeout of {timeout_s:g} s and was stopped; "
                    "narrow it (WHERE, LIMIT) or give it more time with --timeout SECONDS"
                ) from exc
            if "too big" in str(exc.orig).lower():
                raise QueryFailed(
                    f"the query made a value longer than the output cap of {max_bytes:,} bytes; "
                    "select less (substr, LIMIT) or raise --max-bytes"
                ) from exc
            raise QueryFailed(
                f"the query failed: {one_line(exc.orig)}; check it against the catalog tables "
                "(sk_*) and views (sk_v_*)"
            ) from exc
        finally:
            conn.rollback()
            if sqlite:
                # The pragma outlives the transaction; a pooled connection must not stay read-only.
                conn.exec_driver_sql("PRAGMA query_only = OFF")
                conn.rollback()
