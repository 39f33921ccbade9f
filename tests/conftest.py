"""Session-wide fixtures: one SparkSession per test session."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator

import pytest

PG_HOST = os.environ.get("STATEKEEPER_TEST_PG", "postgres@127.0.0.1:5432")
PG_ADMIN_DSN = f"postgresql://{PG_HOST}/postgres"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("statekeeper-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _pg_error() -> str | None:
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN_DSN, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc).strip()


@pytest.fixture(scope="session")
def make_pg_database() -> Iterator[Callable[[], str]]:
    """A factory of fresh, empty PostgreSQL databases (dropped when the session ends)."""
    error = _pg_error()
    if error is not None:
        message = f"PostgreSQL at {PG_HOST} is unreachable ({error}); start it to run these tests"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    import psycopg

    created: list[str] = []

    def make() -> str:
        name = f"sk_test_{secrets.token_hex(6)}"
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return f"postgresql+psycopg://{PG_HOST}/{name}"

    yield make
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
