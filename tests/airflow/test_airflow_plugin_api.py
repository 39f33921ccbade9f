"""The plugin app over a real catalog, through FastAPI's TestClient, with real Airflow tokens."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from state_engine.catalog import Catalog, downgrade, upgrade
from tests.airflow.sk_airflow_support import Seeded


@pytest.fixture
def make_client(auth_manager: object) -> Iterator[Callable[[str], TestClient]]:
    from statekeeper_airflow.app import create_app
    from statekeeper_airflow.catalog_access import CatalogHolder

    clients: list[TestClient] = []

    def make(url: str) -> TestClient:
        client = TestClient(create_app(CatalogHolder(lambda: Catalog.open(url))))
        client.__enter__()  # runs the lifespan, whose exit closes the catalog
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[[str], TestClient], seeded_catalog: Seeded) -> TestClient:
    return make_client(seeded_catalog.url)


@pytest.fixture
def auth(make_token: Callable[..., str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_token()}"}


def forged_token() -> str:
    claims = {
        "sub": "admin",
        "role": "ADMIN",
        "aud": "apache-airflow",
        "iat": datetime.now(UTC),
        "nbf": datetime.now(UTC),
        "exp": datetime.now(UTC) + timedelta(hours=1),
    }
    return jwt.encode(claims, "not-the-configured-secret-" + "x" * 64, algorithm="HS512")


# --- authentication ---


def test_anonymous_api_request_is_401_json(client: TestClient) -> None:
    response = client.get("/api/jobs")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "Not authenticated" in response.json()["detail"]


def test_anonymous_page_request_redirects_to_airflow_login(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 303
    location = response.headers["location"]
    assert location.startswith("/auth/login?next=")
    assert "testserver" in location  # next= brings the user back here


def test_a_token_issued_by_the_auth_manager_is_accepted_as_bearer_or_cookie(
    client: TestClient, make_token: Callable[..., str]
) -> None:
    token = make_token(username="viewer", role="VIEWER")
    assert client.get("/api/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    client.cookies.set("_token", token)
    try:
        assert client.get("/", follow_redirects=False).status_code == 200
        assert client.get("/api/jobs").status_code == 200
    finally:
        client.cookies.clear()


@pytest.mark.parametrize("kind", ["forged", "expired", "garbage"])
def test_forged_expired_or_garbage_tokens_are_refused(
    client: TestClient, make_token: Callable[..., str], kind: str
) -> None:
    token = {
        "forged": forged_token,
        "expired": lambda: make_token(expires_in=-3600),
        "garbage": lambda: "not.a.jwt",
    }[kind]()
    api = client.get("/api/jobs", headers={"Authorization": f"Bearer {token}"})
    assert api.status_code == 401, api.text
    client.cookies.set("_token", token)
    try:
        page = client.get("/", follow_redirects=False)
    finally:
        client.cookies.clear()
    assert page.status_code == 303


def test_every_route_of_the_app_refuses_anonymous_requests(client: TestClient) -> None:
    routes = [r for r in client.app.routes if isinstance(r, APIRoute)]  # type: ignore[attr-defined]  # the client's app is a FastAPI app
    assert len(routes) >= 9
    for route in routes:
        path = route.path.replace("{job}", "orders").replace("{snapshot_id}", "1")
        response = client.get(path, follow_redirects=False)
        assert response.status_code in (401, 303), f"{route.path} answered {response.status_code}"


# --- the API ---


def test_jobs_with_their_latest_completed_snapshot(
    client: TestClient, auth: dict[str, str], seeded_catalog: Seeded
) -> None:
    body = client.get("/api/jobs", headers=auth).json()
    assert (body["total"], body["limit"], body["offset"]) == (2, 50, 0)
    orders, payments = body["items"]
    assert (orders["name"], orders["max_parallelism"]) == ("orders", 128)
    assert orders["latest_snapshot"]["id"] == seeded_catalog.completed_id
    assert orders["latest_snapshot"]["status"] == "COMPLETED"
    assert (payments["name"], payments["latest_snapshot"]) == ("payments", None)

    one = client.get("/api/jobs/orders", headers=auth).json()
    assert one["latest_snapshot"]["checkpoint_id"] == 2


def test_snapshots_are_paginated_newest_first(client: TestClient, auth: dict[str, str]) -> None:
    page = client.get("/api/jobs/orders/snapshots?limit=2&offset=1", headers=auth).json()
    assert (page["total"], page["limit"], page["offset"]) == (4, 2, 1)
    assert [s["checkpoint_id"] for s in page["items"]] == [3, 2]

    past_the_end = client.get("/api/jobs/orders/snapshots?offset=10", headers=auth).json()
    assert (past_the_end["total"], past_the_end["items"]) == (4, [])

    pending = client.get("/api/jobs/orders/snapshots?status=PENDING", headers=auth).json()
    assert [s["checkpoint_id"] for s in pending["items"]] == [4, 3]


@pytest.mark.parametrize(
    "path",
    [
        "/api/jobs?limit=501",
        "/api/jobs?limit=0",
        "/api/jobs?offset=-1",
        "/api/jobs?limit=ten",
        f"/api/jobs?offset={2**63}",
        f"/api/jobs?limit={2**64}",
        f"/api/snapshots/{2**63}",
        f"/api/snapshots/{10**30}/files",
        "/api/snapshots/0",
        f"/api/runs?offset={2**70}",
        "/api/jobs/orders/snapshots?status=BOGUS",
        "/api/jobs/orders/snapshots?kind=BOGUS",
        "/api/runs?status=BOGUS",
    ],
)
def test_bad_parameters_are_400_with_a_reason(
    client: TestClient, auth: dict[str, str], path: str
) -> None:
    answer = client.get(path, headers=auth)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and ("must be" in detail or "bad request" in detail)


def test_every_answer_carries_the_security_headers(
    client: TestClient, auth: dict[str, str]
) -> None:
    for path, headers in (
        ("/api/jobs", auth),
        ("/api/jobs/nope", auth),
        ("/api/jobs", {}),
        ("/api/snapshots/x", auth),
    ):
        answer = client.get(path, headers=headers)
        csp = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'sha256-" in csp, path
        assert "frame-ancestors 'self'" in csp
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Referrer-Policy"] == "same-origin"


def test_an_unknown_snapshot_kind_filter_is_400(client: TestClient, auth: dict[str, str]) -> None:
    response = client.get("/api/jobs/orders/snapshots?kind=BACKUP", headers=auth)
    assert response.status_code == 400
    assert "CHECKPOINT" in response.json()["detail"]


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/api/jobs/nope", "'nope'"),
        ("/api/jobs/nope/snapshots", "'nope'"),
        ("/api/jobs/nope/size-history", "'nope'"),
        ("/api/runs?job=nope", "'nope'"),
        ("/api/snapshots/9999", "9999"),
        ("/api/snapshots/9999/files", "9999"),
    ],
)
def test_unknown_job_or_snapshot_is_404_naming_it(
    client: TestClient, auth: dict[str, str], path: str, named: str
) -> None:
    response = client.get(path, headers=auth)
    assert response.status_code == 404
    assert named in response.json()["detail"]


def test_a_snapshot_with_its_files_summary_and_skew(
    client: TestClient, auth: dict[str, str], seeded_catalog: Seeded
) -> None:
    body = client.get(f"/api/snapshots/{seeded_catalog.completed_id}", headers=auth).json()
    assert body["snapshot"]["checkpoint_id"] == 2
    # chk-2 holds two exclusive files of 2000 and 4000 bytes and the shared 500-byte SST.
    assert body["files"] == {
        "references": 3,
        "files": 3,
        "bytes": 6500,
        "shared_files": 1,
        "shared_bytes": 500,
    }
    [skew] = body["skew"]
    assert (skew["operator"], skew["key_groups"], skew["max_rows"]) == ("counter", 128, 100)
    assert skew["total_rows"] == 127 * 10 + 100
    assert skew["skew"] == pytest.approx(100 / ((127 * 10 + 100) / 128))

    files = client.get(
        f"/api/snapshots/{seeded_catalog.completed_id}/files?limit=2", headers=auth
    ).json()
    assert (files["total"], len(files["items"])) == (3, 2)


def test_size_history_of_a_job(client: TestClient, auth: dict[str, str]) -> None:
    body = client.get("/api/jobs/orders/size-history", headers=auth).json()
    by_checkpoint: dict[int, int] = {}
    for point in body["items"]:
        by_checkpoint[point["checkpoint_id"]] = (
            by_checkpoint.get(point["checkpoint_id"], 0) + (point["bytes"])
        )
    assert sorted(by_checkpoint) == [1, 2]  # completed only, oldest first
    assert by_checkpoint[2] > by_checkpoint[1]


def test_maintenance_runs_all_and_by_job(client: TestClient, auth: dict[str, str]) -> None:
    everything = client.get("/api/runs", headers=auth).json()
    assert everything["total"] == 2
    assert {r["run_id"] for r in everything["items"]} == {"compaction-1", "orphans-1"}
    orders = client.get("/api/runs?job=orders", headers=auth).json()
    [run] = orders["items"]
    assert (run["kind"], run["status"], run["rows_out"]) == ("compaction", "SUCCEEDED", 1280)


def test_the_openapi_document_is_served_behind_auth(
    client: TestClient, auth: dict[str, str]
) -> None:
    assert client.get("/api/openapi.json").status_code == 401
    spec = client.get("/api/openapi.json", headers=auth).json()
    assert "/api/jobs/{job}/snapshots" in spec["paths"]
    assert client.get("/docs").status_code == 404


# --- the catalog not at head ---


def test_a_catalog_not_at_head_is_503_until_it_is_upgraded(
    make_client: Callable[[str], TestClient],
    sqlite_catalog_template: Path,
    tmp_path: Path,
    auth: dict[str, str],
    make_token: Callable[..., str],
) -> None:
    path = tmp_path / "behind.db"
    shutil.copyfile(sqlite_catalog_template, path)
    url = f"sqlite:///{path}"
    downgrade(url, "base")
    client = make_client(url)

    api = client.get("/api/jobs", headers=auth)
    assert api.status_code == 503
    assert "run `statectl catalog upgrade`" in api.json()["detail"]
    client.cookies.set("_token", make_token())
    page = client.get("/")
    assert page.status_code == 503
    assert "statectl catalog upgrade" in page.text
    assert page.headers["content-type"].startswith("text/html")

    upgrade(url)  # what the message asks for; the app recovers without a restart
    assert client.get("/api/jobs", headers=auth).json()["total"] == 0
    client.cookies.clear()


# --- the page ---


def test_jobs_overview_page(client: TestClient, make_token: Callable[..., str]) -> None:
    client.cookies.set("_token", make_token())
    try:
        page = client.get("/")
    finally:
        client.cookies.clear()
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert ">orders</a></td>" in html and ">payments</a></td>" in html
    assert "no completed snapshot" in html
    assert "2 jobs in the catalog" in html
    # Self-contained: the machine serving it may have no network; links stay inside the app.
    # The one script is the theme script (allowed by its hash in the Content-Security-Policy).
    from statekeeper_airflow.markup import THEME_SCRIPT

    html = html.replace(f"<script>{THEME_SCRIPT}</script>", "", 1)
    for needle in ("<script", "<link", "http://", "https://", 'href="/'):
        assert needle not in html, needle


def test_page_escapes_job_names(
    make_client: Callable[[str], TestClient],
    catalog_url: str,
    make_token: Callable[..., str],
) -> None:
    with Catalog.open(catalog_url) as cat:
        cat.register_job("<b>evil</b>", max_parallelism=128)
    client = make_client(catalog_url)
    client.cookies.set("_token", make_token())
    html = client.get("/").text
    assert "&lt;b&gt;evil&lt;/b&gt;" in html and "<b>evil</b>" not in html
