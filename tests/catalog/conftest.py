"""Every catalog test runs on a SQLite file and on the real PostgreSQL (the fixtures are in
``tests/fixtures/catalog.py``), its catalog on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from tests.fixtures.catalog import FakeClock, on_both_databases

pytest_generate_tests = on_both_databases


@pytest.fixture
def catalog_clock(clock: FakeClock) -> FakeClock:
    return clock
