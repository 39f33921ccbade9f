"""The Airflow test harness: one Airflow home per test session, migrated once.

Airflow reads its configuration when it is first imported, so the environment is set here, at
import time, before any test module imports airflow: a temporary AIRFLOW_HOME, the repository's
``dags/`` and ``plugins/`` as Airflow's folders, no example DAGs, a fixed JWT secret.
``statekeeper_airflow`` imports from the install (setup.py maps ``plugins/``), as the DAGs import
it; Airflow itself may still put its plugins folder on ``sys.path`` when it loads plugins.

This folder is the package ``tests.airflow``, which does not shadow the real ``airflow``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.airflow.sk_airflow_support import DAGS, JWT_SECRET, PLUGINS, MovableClock, Seeded

if TYPE_CHECKING:  # for annotations only: airflow is imported by the tests, after the set-up below
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

if "airflow" in sys.modules:
    raise RuntimeError(
        "airflow was imported before tests/airflow/conftest.py could configure it; "
        "import airflow only inside tests under tests/airflow"
    )

_HOME = Path(tempfile.mkdtemp(prefix="sk-airflow-home-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
        "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.airflow)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home, its metadata DB migrated (once)."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}"
    return _HOME


@pytest.fixture(scope="session")
def auth_manager(airflow_home: Path) -> BaseAuthManager[Any]:
    """The configured auth manager (SimpleAuthManager), initialized as the API server does."""
    from airflow.api_fastapi.app import init_auth_manager

    return init_auth_manager()


@pytest.fixture(scope="session")
def make_token(auth_manager: BaseAuthManager[Any]) -> Callable[..., str]:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    def make(username: str = "admin", role: str = "ADMIN", expires_in: int = 600) -> str:
        user = SimpleAuthManagerUser(username=username, role=role)
        return auth_manager.generate_jwt(user, expiration_time_in_seconds=expires_in)

    return make


# --- catalogs (an empty one is ``catalog_url``, from tests/fixtures/catalog.py) ---


@pytest.fixture
def seeded_catalog(catalog_url: str) -> Seeded:
    """Job ``orders``: two completed checkpoints, a PENDING one from two hours ago (stale) and a
    PENDING one from a minute ago. Job ``payments``: registered, never completed a snapshot.
    Two maintenance runs."""
    from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow

    now = datetime.now(UTC)
    clock = MovableClock(now - timedelta(hours=3))
    with Catalog.open(catalog_url, clock=clock) as cat:
        cat.register_job("orders", max_parallelism=128, location="file:///ckpt/orders")
        cat.register_job("payments", max_parallelism=256)
        ids = []
        for n, hours_ago in ((1, 3), (2, 1)):
            clock.now = now - timedelta(hours=hours_ago)
            snap = cat.begin_snapshot(
                "orders", location=f"file:///ckpt/orders/chk-{n}", parallelism=2
            )
            files = [
                FileRef(
                    path=f"file:///ckpt/orders/chk-{n}/op-{sub}.parquet",
                    size=1000 * (sub + 1) * n,
                    operator="counter",
                    subtask=sub,
                    key_group_start=sub * 64,
                    key_group_end=sub * 64 + 63,
                )
                for sub in range(2)
            ]
            files.append(FileRef(path="file:///ckpt/orders/shared/base.sst", size=500, shared=True))
            cat.attach_files(snap.id, files)
            cat.record_key_group_stats(
                snap.id,
                [KeyGroupStatRow("counter", kg, rows=100 if kg == 7 else 10) for kg in range(128)],
            )
            ids.append(cat.complete_snapshot(snap.id, snap.version).id)
        clock.now = now - timedelta(hours=2)
        stale = cat.begin_snapshot("orders", location="file:///ckpt/orders/chk-3", parallelism=2)
        clock.now = now - timedelta(minutes=1)
        fresh = cat.begin_snapshot("orders", location="file:///ckpt/orders/chk-4", parallelism=2)
        cat.start_run("compaction-1", "compaction", job="orders", input_snapshot_id=ids[0])
        cat.finish_run("compaction-1", output_snapshot_id=ids[1], rows_in=1280, rows_out=1280)
        cat.start_run("orphans-1", "orphan_cleanup", job="payments")
    return Seeded(catalog_url, ids[1], ids[0], stale.id, fresh.id)


@pytest.fixture
def catalog_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Point STATEKEEPER_CATALOG_URL at a catalog for this test (tasks read Settings.from_env)."""

    def point(url: str) -> None:
        monkeypatch.setenv("STATEKEEPER_CATALOG_URL", url)

    yield point
