"""Raw DBAPI statements for the bulk paths of snapshot registration, one dialect rule each.

SQLAlchemy's per-row parameter processing and its expanding ``IN (...)`` lists cost more than the
database's own work when a snapshot brings 10,000 files, so these paths speak plain driver SQL over
already-validated values. Nothing here builds SQL from caller-supplied text: table and column
names are the models' own, every value is a bound parameter.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from itertools import chain
from typing import Any

from sqlalchemy import ColumnElement, Connection

#: rows per SQLite INSERT of :meth:`Bulk.insert_many`: measured on 10,000 file rows, 200 to 1,000
#: rows a statement insert alike, a quarter faster than a statement per row
SQLITE_ROWS_PER_INSERT = 500


class Bulk:
    """Driver-level helpers on one connection (inside the caller's transaction)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.postgres = conn.dialect.name == "postgresql"
        self.mark = "%s" if self.postgres else "?"

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, Any]:
        """``column`` is one of ``values``, as SQL plus its ONE bound parameter.

        One parameter whatever the count: PostgreSQL takes an array (psycopg would otherwise parse
        a statement of thousands of placeholders in Python on every call), SQLite a JSON array
        that ``json_each`` unpacks in C, so no chunking under its bound-parameter limit either.
        """
        if self.postgres:
            return f"{column} = ANY(%s)", list(values)
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))

    def select(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.conn.exec_driver_sql(sql, tuple(params)).all())

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.exec_driver_sql(sql, tuple(params)).rowcount

    def insert_many(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (values of ``columns``, in order). PostgreSQL: one DBAPI
        ``executemany`` (psycopg 3 pipelines it: one round trip, not one per row). SQLite:
        INSERTs of many rows each (a VALUES list of up to :data:`SQLITE_ROWS_PER_INSERT` rows,
        within its bound-parameter limit): a statement per row costs the driver a reset and a
        bind call per row, a third more than SQLite's own work on a snapshot's 10,000 file rows.
        """
        if not rows:
            return
        head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        row = "(" + ", ".join([self.mark] * len(columns)) + ")"
        if self.postgres:
            self.conn.exec_driver_sql(head + row, rows)
            return
        per = self._sqlite_rows_per_insert(len(columns))
        full = head + ", ".join([row] * per)  # the same text for every full chunk: prepared once
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            sql = full if len(chunk) == per else head + ", ".join([row] * len(chunk))
            self.conn.exec_driver_sql(sql, tuple(chain.from_iterable(chunk)))

    def _sqlite_rows_per_insert(self, width: int) -> int:
        """Rows of ``width`` values one SQLite INSERT takes: at most SQLITE_ROWS_PER_INSERT, and
        within the connection's limit on bound parameters."""
        raw = self.conn.connection.driver_connection
        limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if raw is not None else 999
        return max(1, min(SQLITE_ROWS_PER_INSERT, limit // max(width, 1)))

    def allocate_ids(self, table: str, count: int) -> list[int]:
        """``count`` fresh primary keys for ``table`` (its ``id`` column), before inserting.

        With the ids known up front, new rows go in through plain bulk inserts and no RETURNING
        or read-back is needed. PostgreSQL draws them from the column's own sequence, exactly as
        a default insert would. SQLite hands out max(id) + 1 onwards, again as its default insert
        would; that is safe because every catalog writer holds SQLite's write lock from its first
        statement (BEGIN IMMEDIATE), so nobody else can insert until this transaction ends.
        """
        if count <= 0:
            return []
        if self.postgres:
            rows = self.select(
                f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) "
                "FROM generate_series(1, %s)",
                (count,),
            )
            return [r[0] for r in rows]
        top = self.conn.exec_driver_sql(f"SELECT COALESCE(MAX(id), 0) FROM {table}").scalar_one()
        return list(range(top + 1, top + 1 + count))

    def bind(self, column: ColumnElement[Any], value: Any) -> Any:
        """``value`` as SQLAlchemy would bind it to ``column`` (e.g. SQLite's timestamp text)."""
        # The dialect's own implementation: the generic type would leave SQLite a datetime, which
        # the driver formats differently (no microseconds when they are zero), breaking text order.
        dialect = self.conn.dialect
        process = column.type.dialect_impl(dialect).bind_processor(dialect)
        return value if process is None else process(value)
