"""Catalog fixtures: every catalog test runs on a SQLite file and on the real PostgreSQL.

PostgreSQL is the server on 127.0.0.1:5432 (trust auth, user ``postgres``); each test session
creates its own ``sk_test_<random>`` databases and drops them at the end. Unreachable, those tests
are skipped, except under ``CI=true`` where that fails the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from state_engine.catalog import Catalog, upgrade

PG_HOST = os.environ.get("STATEKEEPER_TEST_PG", "postgres@127.0.0.1:5432")
PG_ADMIN_DSN = f"postgresql://{PG_HOST}/postgres"


class FakeClock:
    """A clock the test moves by hand: lease expiry without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="session")
def pg_catalog_url(make_pg_database: Callable[[], str]) -> str:
    url = make_pg_database()
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "catalog.db"
    upgrade(f"sqlite:///{path}")
    return path


def _empty_pg(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            tables = [t for t in inspect(conn).get_table_names() if t.startswith("sk_")]
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty catalog at head."""
    if request.param == "sqlite":
        path = tmp_path / "catalog.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("pg_catalog_url")
    _empty_pg(url)
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def catalog(catalog_url: str, clock: FakeClock) -> Iterator[Catalog]:
    with Catalog.open(catalog_url, clock=clock) as cat:
        yield cat


@pytest.fixture
def pg_catalog(pg_catalog_url: str, clock: FakeClock) -> Iterator[Catalog]:
    """An empty catalog on PostgreSQL only (for row-lock races SQLite cannot have)."""
    _empty_pg(pg_catalog_url)
    with Catalog.open(pg_catalog_url, clock=clock) as cat:
        yield cat
