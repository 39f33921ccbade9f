"""Session-wide fixtures: one SparkSession per test session; the catalog fixtures every folder
shares come from the plugin ``tests/fixtures/catalog.py``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.fixtures.catalog"]


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
