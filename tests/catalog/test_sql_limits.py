"""``statectl sql`` is bounded on both databases: a timeout stops a query that would run forever,
and the output is cut at a row and a byte cap (the result says so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.errors import QueryFailed

# never finishes: UNION ALL keeps only the last row in its work table, so it costs no memory
FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
NUMBERS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "


def test_a_query_that_never_ends_is_stopped_at_its_timeout(catalog: Catalog) -> None:
    with pytest.raises(QueryFailed, match=r"longer than its timeout of 0.3 s .* --timeout"):
        catalog.query(FOREVER, timeout_s=0.3)
    # the connection is usable (and writable) again afterwards
    assert catalog.query("SELECT 1 AS one").rows == [(1,)]
    catalog.register_job("after-timeout", max_parallelism=8)


def test_rows_are_cut_at_the_row_cap(catalog: Catalog) -> None:
    result = catalog.query(NUMBERS.format(n=1000) + "SELECT x FROM c", max_rows=10)
    assert [r[0] for r in result.rows] == list(range(1, 11))
    assert result.truncated == "10 rows"
    whole = catalog.query(NUMBERS.format(n=10) + "SELECT x FROM c", max_rows=10)
    assert len(whole.rows) == 10 and whole.truncated is None


def test_output_is_cut_at_the_byte_cap(catalog: Catalog) -> None:
    big = (
        "repeat('x', 1000)"
        if catalog.engine.dialect.name == "postgresql"
        else ("printf('%1000s', 'x')")
    )
    result = catalog.query(NUMBERS.format(n=5000) + f"SELECT {big} FROM c", max_bytes=10_000)
    assert 1 <= len(result.rows) <= 10
    assert result.truncated == "10,000 bytes"


def test_one_huge_value_is_refused_on_sqlite(tmp_path: Path, sqlite_catalog_template: Path) -> None:
    import shutil

    path = tmp_path / "c.db"
    shutil.copyfile(sqlite_catalog_template, path)
    with Catalog.open(f"sqlite:///{path}") as cat:
        # SQLite would build the whole blob in memory before any row is read
        with pytest.raises(QueryFailed, match=r"longer than the output cap .* --max-bytes"):
            cat.query("SELECT randomblob(100000000)", max_bytes=1 << 20)
        assert cat.query("SELECT length(randomblob(1000))").rows == [(1000,)]


def test_explain_still_runs_under_the_caps(catalog: Catalog) -> None:
    # PostgreSQL streams rows through a cursor, which takes no EXPLAIN: it runs as a plain query
    result = catalog.query("EXPLAIN SELECT * FROM sk_jobs", max_rows=50)
    assert result.rows and result.truncated is None
