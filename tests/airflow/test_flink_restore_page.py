"""A Flink job's page says how to restore the newest savepoint a rewrite run wrote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from state_engine.catalog import Catalog
from tests.airflow.sk_airflow_support import Seeded
from tests.airflow.test_plugin_pages import logged_in  # noqa: F401  (fixture)


@pytest.fixture
def client(auth_manager: object, seeded_catalog: Seeded) -> Iterator[TestClient]:
    from statekeeper_airflow.app import create_app
    from statekeeper_airflow.catalog_access import CatalogHolder

    url = seeded_catalog.url
    with Catalog.open(url) as cat:
        cat.register_job("flinky", max_parallelism=128, location="file:///f/x", origin="flink")
        snap = cat.begin_snapshot(
            "flinky", location="file:///sp/new", parallelism=2, kind="SAVEPOINT",
            format="CANONICAL", max_parallelism=256, trigger="run-x",
        )  # fmt: skip
        cat.complete_snapshot(snap.id, snap.version, bytes=1, entries=1)
        cat.start_run("rescale-7", "rescale", job="flinky")
        restore = {
            "command": "flink run -s /sp/new -p 2 <your job>",
            "config": "execution.state-recovery.path: /sp/new",
            "warnings": ["the job's max parallelism must change to 256 (from 128)"],
        }
        cat.finish_run(
            "rescale-7",
            stats={"stats": {"restore": restore, "output_location": "file:///sp/new"}},
            output_snapshot_id=snap.id,
        )
    with TestClient(create_app(CatalogHolder(lambda: Catalog.open(url)))) as client:
        yield client


def test_the_flink_job_page_shows_how_to_restore_the_rewritten_savepoint(
    logged_in: Any,  # noqa: F811
) -> None:
    html = logged_in.get("/jobs/flinky").text
    assert "Restore the rewritten savepoint" in html
    assert "flink run -s /sp/new -p 2 &lt;your job&gt;" in html
    assert "execution.state-recovery.path: /sp/new" in html
    assert "must change to 256" in html
    assert "Restore the rewritten savepoint" not in logged_in.get("/jobs/orders").text
