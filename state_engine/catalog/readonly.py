"""Read-only SQL over the catalog (``statectl sql``): one SELECT, in a read-only transaction.

The statement is checked twice: its first keyword must be SELECT, WITH or EXPLAIN and there must
be one statement only; then it runs in a transaction the database itself keeps read-only
(``SET TRANSACTION READ ONLY`` on PostgreSQL, ``PRAGMA query_only`` on SQLite), which also stops
writes hidden in a CTE or behind EXPLAIN ANALYZE.
"""

from __future__ import annotations

from sqlalchemy import Engine
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


def run_readonly(engine: Engine, sql: str, *, max_rows: int | None = None) -> QueryResult:
    statement = check_read_only(sql)
    sqlite = engine.dialect.name == "sqlite"
    try:
        conn = engine.connect()
    except DBAPIError as exc:
        raise CatalogUnreachable(f"cannot connect to the catalog: {one_line(exc.orig)}") from exc
    with conn:
        try:
            if sqlite:
                conn.exec_driver_sql("PRAGMA query_only = ON")
            else:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            result = conn.exec_driver_sql(statement)
            if not result.returns_rows:
                raise ReadOnlyViolation("the statement returned no rows; pass one SELECT statement")
            columns = list(result.keys())
            rows = result.fetchmany(max_rows) if max_rows is not None else result.fetchall()
            return QueryResult(columns, [tuple(row) for row in rows])
        except DBAPIError as exc:
            if _is_write_refusal(exc):
                raise ReadOnlyViolation(
                    f"statectl sql is read-only and the database refused a write: "
                    f"{one_line(exc.orig)}; run only queries here"
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
