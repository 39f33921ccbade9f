"""Flink fixtures: the two real Flink 2.3 snapshot archives, extracted once per test session, and
the small one of Flink 1.20 in ``data/flink-1.20``.

``flink_fixtures`` is a read-only tree (never modify it); tests that delete or plant files take a
private copy with ``flink_copy``. The 2.3 archives stay in ``/work/shared/flink`` (or
``STATEKEEPER_FLINK_FIXTURES``); they are never copied into the repository.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from state_engine.flink.metadata import KeyedStateHandle, StreamHandle
from tests.fixtures.catalog import FakeClock, on_both_databases

ARCHIVE_DIR = Path(os.environ.get("STATEKEEPER_FLINK_FIXTURES", "/work/shared/flink"))
JAVA_ARCHIVE = "flink-java-dev.tar.gz"
PYFLINK_ARCHIVE = "flink-2.3-pyflink-snapshots.tar.gz"

JAVA_ROCKS_JOB = "0cf791d2fa2585d18b369593e6ac454d"
JAVA_HASHMAP_JOB = "24b66efa530da662b5ea2fccfbe5c4b7"
PY_ROCKS_JOB = "92444c5a6956ad1f4e7301b84f30217c"
PY_HASHMAP_JOB = "5914b5bc33e17d723e41702377437184"


@dataclass(frozen=True)
class FlinkFixtures:
    """The extracted archives: ``java`` = ``flink-java-dev/``, ``pyflink`` = the PyFlink tree."""

    root: Path
    java: Path
    pyflink: Path

    def java_job(self, backend: str) -> Path:
        """``<checkpoint-dir>/<job-id>`` of the Java job for ``rocksdb`` or ``hashmap``."""
        job = JAVA_ROCKS_JOB if backend == "rocksdb" else JAVA_HASHMAP_JOB
        return self.java / backend / "checkpoints" / job

    def java_savepoints(self, backend: str) -> Path:
        return self.java / backend / "savepoints"

    def py_job(self, backend: str) -> Path:
        """``<checkpoint-dir>/<job-id>`` of the PyFlink job for ``rocks`` or ``hashmap``."""
        job = PY_ROCKS_JOB if backend == "rocks" else PY_HASHMAP_JOB
        return self.pyflink / backend / "checkpoints" / job


def delegate_of(handle: KeyedStateHandle) -> StreamHandle:
    """The stream of a keyed-state handle (every one in these fixtures has one)."""
    assert handle.delegate is not None, handle
    return handle.delegate


def local_path(handle: StreamHandle) -> Path:
    """Where a file handle of these fixtures is on this machine (it has a location)."""
    assert handle.location is not None, handle
    return Path(handle.location)


def assert_pyflink_state(
    rows: list[dict[str, Any]],
    positions: dict[str, int],
    key: Callable[[int], str],
    kept: Callable[[int], bool] = lambda amount: True,
) -> None:
    """``rows`` (of ``snapshot_rows``) hold exactly the keyed state of the PyFlink fixture jobs
    (data/*/job.py, the 2.3 archive's flink_job.py) after the records their source had read:
    the indexes ``i`` of NumberSequenceSource(0, 400000), split 1 from 0 and split 2 from 200001
    up to ``positions``, each the amount ``i % 997`` for card ``key(i)``. Per card: ``total``
    sums its amounts, ``merchants`` counts them per ``m{amount % 7}``, ``recent`` lists those
    ``kept`` (in any order: the two splits interleave)."""
    total: collections.Counter[str] = collections.Counter()
    merchants: collections.Counter[tuple[str, str]] = collections.Counter()
    recent: dict[str, list[int]] = collections.defaultdict(list)
    for split, start in (("1", 0), ("2", 200001)):
        for i in range(start, positions[split]):
            card, amount = key(i), i % 997
            total[card] += amount
            merchants[(card, f"m{amount % 7}")] += 1
            if kept(amount):
                recent[card].append(amount)
    assert {r["state"] for r in rows} == {"total", "merchants", "recent"}
    assert {r["key"]: json.loads(r["value"]) for r in rows if r["state"] == "total"} == total
    assert {
        (r["key"], r["user_key"]): json.loads(r["value"]) for r in rows if r["state"] == "merchants"
    } == merchants
    got = {r["key"]: sorted(json.loads(r["value"])) for r in rows if r["state"] == "recent"}
    assert got == {k: sorted(v) for k, v in recent.items()}


def _extract(archive: Path, into: Path) -> None:
    if not archive.exists():
        pytest.skip(f"Flink fixture archive {archive} is missing (set STATEKEEPER_FLINK_FIXTURES)")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")


@pytest.fixture(scope="session")
def flink_fixtures(tmp_path_factory: pytest.TempPathFactory) -> FlinkFixtures:
    root = tmp_path_factory.mktemp("flink-fixtures")
    _extract(ARCHIVE_DIR / JAVA_ARCHIVE, root / "java")
    _extract(ARCHIVE_DIR / PYFLINK_ARCHIVE, root / "pyflink")
    return FlinkFixtures(root, root / "java" / "flink-java-dev", root / "pyflink")


#: Snapshots written by Flink 1.20.5 (``_metadata`` version 4), 290 KB: a PyFlink job's (its
#: job.py says what the keyed state holds) and the Java fixture job's (StateFixtureJob.java;
#: ``java/manifest.json`` and ``java/expected/`` give every snapshot's exact state).
FLINK_120 = Path(__file__).parent / "data" / "flink-1.20"


@pytest.fixture(scope="session")
def flink_120(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Flink 1.20 tree (read-only): ``pyflink/`` and ``java/``, each with ``rocksdb/`` and
    ``hashmap/``, each with ``checkpoints/<job-id>`` and savepoint directories."""
    root = tmp_path_factory.mktemp("flink-1.20")
    _extract(FLINK_120 / "snapshots.tar.gz", root)
    return root


@pytest.fixture
def flink_copy(flink_fixtures: FlinkFixtures, tmp_path: Path) -> Callable[[Path], Path]:
    """Copy a subtree of the fixtures (mtimes kept) into this test's tmp dir; returns the copy."""

    def copy(src: Path) -> Path:
        rel = src.relative_to(flink_fixtures.root)
        dst = tmp_path / "copy" / rel
        shutil.copytree(src, dst, copy_function=shutil.copy2)
        return dst

    return copy


# The Flink import and retention tests run on both catalog databases, on a clock moved by hand
# (the catalog fixtures are in tests/fixtures/catalog.py).
pytest_generate_tests = on_both_databases


@pytest.fixture
def catalog_clock(clock: FakeClock) -> FakeClock:
    return clock
