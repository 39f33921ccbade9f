"""Airflow finds the plugin in its plugins folder and serves its app inside the API server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.airflow.sk_airflow_support import Seeded


def statekeeper_info() -> dict[str, Any]:
    from airflow import plugins_manager

    infos = [p for p in plugins_manager.get_plugin_info() if p["name"] == "statekeeper"]
    assert len(infos) == 1, plugins_manager.get_import_errors()
    return infos[0]


def test_the_plugins_folder_yields_the_statekeeper_plugin_without_errors(
    airflow_home: Path,
) -> None:
    from airflow import plugins_manager

    assert plugins_manager.get_import_errors() == {}
    info = statekeeper_info()
    assert str(info["source"]) == "$PLUGINS_FOLDER/statekeeper_plugin.py"
    [app] = info["fastapi_apps"]
    assert (app["url_prefix"], app["name"]) == ("/statekeeper", "Statekeeper")
    [view] = info["external_views"]
    assert view["destination"] == "nav"
    assert view["href"] == "statekeeper/"  # relative to the UI's <base href>
    assert view["url_route"] == "statekeeper"


@pytest.fixture(scope="module")
def airflow_api(airflow_home: Path) -> Iterator[TestClient]:
    """Airflow's own API server app (core API, UI routes, auth manager, plugin mounts)."""
    from airflow.api_fastapi.app import create_app

    with TestClient(create_app(apps="core")) as client:
        yield client


def test_airflow_mounts_the_app_and_the_ui_cookie_authenticates_it(
    airflow_api: TestClient,
    seeded_catalog: Seeded,
    catalog_env: Callable[[str], None],
    make_token: Callable[..., str],
) -> None:
    # The plugin's module-level app reads the catalog from STATEKEEPER_* settings on first use.
    catalog_env(seeded_catalog.url)
    assert airflow_api.get("/statekeeper/api/jobs").status_code == 401
    anonymous_page = airflow_api.get("/statekeeper/", follow_redirects=False)
    assert anonymous_page.status_code == 303
    assert anonymous_page.headers["location"].startswith("/auth/login?next=")

    airflow_api.cookies.set("_token", make_token(username="viewer", role="VIEWER"))
    try:
        jobs = airflow_api.get("/statekeeper/api/jobs")
        page = airflow_api.get("/statekeeper/")
        missing = airflow_api.get("/statekeeper/api/jobs/nope")
    finally:
        airflow_api.cookies.clear()
        # The plugin app keeps its catalog open: forget this test's one.
        import statekeeper_plugin

        statekeeper_plugin.app.state.catalogs.close()
    assert jobs.status_code == 200, jobs.text
    assert [j["name"] for j in jobs.json()["items"]] == ["orders", "payments"]
    assert page.status_code == 200 and ">orders</a></td>" in page.text
    # Under the mount the app still tells its API (JSON errors) from its pages (HTML errors).
    assert missing.status_code == 404 and "'nope'" in missing.json()["detail"]


def test_airflow_ui_api_lists_the_nav_entry(
    airflow_api: TestClient, make_token: Callable[..., str]
) -> None:
    response = airflow_api.get(
        "/api/v2/plugins", headers={"Authorization": f"Bearer {make_token()}"}
    )
    assert response.status_code == 200, response.text
    [plugin] = [p for p in response.json()["plugins"] if p["name"] == "statekeeper"]
    [view] = plugin["external_views"]
    assert (view["name"], view["href"], view["destination"]) == (
        "Statekeeper",
        "statekeeper/",
        "nav",
    )
