"""The plugin's pages over a real catalog, through TestClient, with real Airflow tokens."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from tests.airflow.sk_airflow_support import Seeded


@pytest.fixture
def seeded(seeded_catalog: Seeded) -> Seeded:
    """The shared seed plus what only the pages show: an Airflow-triggered run that failed."""
    with Catalog.open(seeded_catalog.url) as cat:
        cat.start_run(
            "ttl-9",
            "ttl_cleanup",
            job="orders",
            input_snapshot_id=seeded_catalog.completed_id,
            dag_id="statekeeper_ttl_cleanup",
            airflow_run_id="scheduled__2025-01-01T00:00:00+00:00",
        )
        cat.fail_run("ttl-9", "executor lost <heartbeat>")
    return seeded_catalog


@pytest.fixture
def client(auth_manager: object, seeded: Seeded) -> Iterator[TestClient]:
    from statekeeper_airflow.app import create_app
    from statekeeper_airflow.catalog_access import CatalogHolder

    with TestClient(create_app(CatalogHolder(lambda: Catalog.open(seeded.url)))) as client:
        yield client


@pytest.fixture
def logged_in(client: TestClient, make_token: Callable[..., str]) -> TestClient:
    client.cookies.set("_token", make_token(username="viewer", role="VIEWER"))
    return client


class Links(HTMLParser):
    """Every href and every element id of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "href" and value is not None:
                self.hrefs.append(value)
            if name == "id" and value is not None:
                self.ids.append(value)


def parse(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


def self_contained(html: str) -> None:
    # The API server may have no network: nothing is fetched, nothing links off the app. The one
    # script is the theme script the Content-Security-Policy allows by its hash.
    from statekeeper_airflow.markup import THEME_SCRIPT

    assert html.count("<script") == 1 and f"<script>{THEME_SCRIPT}</script>" in html
    html = html.replace(f"<script>{THEME_SCRIPT}</script>", "")
    for needle in ("<script", "<link", "<img", "@import", "url("):
        assert needle not in html, needle
    for href in parse(html).hrefs:
        assert not re.match(r"^[a-z]+:|^/", href), f"absolute link {href!r}"


# --- every page refuses anonymous users ---


@pytest.mark.parametrize(
    "path", ["/", "/jobs/orders", "/snapshots/1", "/runs", "/runs?job=orders", "/jobs/nope"]
)
def test_pages_redirect_anonymous_users_to_the_airflow_login(client: TestClient, path: str) -> None:
    response = client.get(path, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/auth/login?next=")
    assert "orders" not in response.text


# --- the jobs overview ---


def test_overview_links_every_job_to_its_page(logged_in: TestClient, seeded: Seeded) -> None:
    html = logged_in.get("/").text
    self_contained(html)
    hrefs = parse(html).hrefs
    assert "jobs/orders" in hrefs and "jobs/payments" in hrefs
    assert f"snapshots/{seeded.completed_id}" in hrefs  # the latest checkpoint
    assert "runs" in hrefs
    assert "2 jobs in the catalog" in html


def test_overview_is_paged_in_the_database(logged_in: TestClient) -> None:
    html = logged_in.get("/?limit=1&offset=1").text
    assert ">payments</a>" in html and ">orders</a>" not in html
    assert "2-2 of 2 jobs" in html
    assert "?offset=0&amp;limit=1" in html  # previous page
    assert logged_in.get("/?limit=0").status_code == 400


# --- a job ---


def test_job_page_lists_snapshots_and_charts_the_state_size(
    logged_in: TestClient, seeded: Seeded
) -> None:
    response = logged_in.get("/jobs/orders")
    assert response.status_code == 200
    html = response.text
    self_contained(html)
    assert "<title>Statekeeper: job orders</title>" in html
    assert '<svg id="size-chart"' in html
    # One point per completed snapshot on the total line: chk-1 is 3500 bytes, chk-2 6500.
    chart = html[html.index('<svg id="size-chart"') : html.index("</svg>")]
    assert chart.count("<circle") == 2
    assert "total: 3.4 KiB" in chart and "total: 6.3 KiB" in chart
    # Four snapshots, newest checkpoint first, each linked to its page.
    rows = re.findall(r'<td class="num"><a href="../snapshots/(\d+)">', html)
    assert [int(r) for r in rows] == [
        seeded.fresh_pending_id,
        seeded.stale_pending_id,
        seeded.completed_id,
        seeded.older_completed_id,
    ]
    for column in ("Checkpoint", "Kind", "Format", "Status", "Parallelism", "Bytes", "Entries"):
        assert f">{column}</th>" in html
    assert "status-PENDING" in html and "status-COMPLETED" in html
    assert "../runs?job=orders" in parse(html).hrefs


def test_job_page_snapshots_are_paginated(logged_in: TestClient, seeded: Seeded) -> None:
    html = logged_in.get("/jobs/orders?limit=2&offset=2").text
    rows = re.findall(r'<a href="../snapshots/(\d+)">', html)
    assert [int(r) for r in rows] == [seeded.completed_id, seeded.older_completed_id]
    assert "3-4 of 4 snapshots" in html
    assert "?offset=0&amp;limit=2" in html and ">next<" not in html


def test_a_job_without_completed_snapshots_says_so_instead_of_a_chart(
    logged_in: TestClient,
) -> None:
    html = logged_in.get("/jobs/payments").text
    assert "No completed snapshot yet" in html and "<svg" not in html
    assert "No snapshots on this page." in html


def test_a_job_name_with_a_slash_has_a_working_page(logged_in: TestClient, seeded: Seeded) -> None:
    with Catalog.open(seeded.url) as cat:
        cat.register_job("team/a <b>", max_parallelism=128)
    overview = logged_in.get("/").text
    assert "jobs/team%2Fa%20%3Cb%3E" in parse(overview).hrefs
    html = logged_in.get("/jobs/team%2Fa%20%3Cb%3E").text
    assert "<h1>Job team/a &lt;b&gt;</h1>" in html


# --- a snapshot ---


def test_snapshot_page_has_files_and_a_skew_histogram(
    logged_in: TestClient, seeded: Seeded
) -> None:
    response = logged_in.get(f"/snapshots/{seeded.completed_id}")
    assert response.status_code == 200
    html = response.text
    self_contained(html)
    assert "orders checkpoint 2" in html
    assert "../jobs/orders" in parse(html).hrefs
    # 127 key groups of 10 rows and key group 7 of 100: max / mean = 100 / (1370 / 128).
    assert f'<span class="figure skew">{100 / (1370 / 128):.2f}</span>' in html
    assert "skew-chart-0" in parse(html).ids
    # 128 key groups fit: one bar each, and the hot one is the tall one.
    bars = re.findall(r'<rect class="bar"[^>]*height="([\d.]+)"[^>]*><title>key group (\d+):', html)
    assert len(bars) == 128
    tallest = max(bars, key=lambda bar: float(bar[0]))
    assert tallest[1] == "7"
    assert 'class="mean"' in html
    # The three files, shared and exclusive, with their key-group ranges.
    assert "file:///ckpt/orders/chk-2/op-0.parquet" in html
    assert "file:///ckpt/orders/shared/base.sst" in html
    assert "<td>shared</td>" in html and '<td class="num">64-127</td>' in html
    assert "3 files of 6.3 KiB (1 shared, 500 B); 3 references" in html


def test_snapshot_files_are_paginated(logged_in: TestClient, seeded: Seeded) -> None:
    first = logged_in.get(f"/snapshots/{seeded.completed_id}?limit=2").text
    second = logged_in.get(f"/snapshots/{seeded.completed_id}?limit=2&offset=2").text
    paths = re.compile(r'<td class="path">([^<]+)</td>')
    assert len(paths.findall(first)) == 2 and len(paths.findall(second)) == 1
    assert set(paths.findall(first)).isdisjoint(paths.findall(second))
    assert "1-2 of 3 file references" in first and "?offset=2&amp;limit=2" in first


def test_a_wide_key_group_axis_is_binned_and_keeps_the_hot_key_group(
    logged_in: TestClient, seeded: Seeded
) -> None:
    with Catalog.open(seeded.url) as cat:
        cat.register_job("wide", max_parallelism=4096)
        snap = cat.begin_snapshot("wide", location="file:///ckpt/wide/chk-1", parallelism=4)
        cat.attach_files(snap.id, [FileRef(path="file:///ckpt/wide/chk-1/a", size=1, operator="w")])
        cat.record_key_group_stats(
            snap.id,
            [KeyGroupStatRow("w", kg, rows=5000 if kg == 4001 else 1) for kg in range(4096)],
        )
        done = cat.complete_snapshot(snap.id, snap.version)
    html = logged_in.get(f"/snapshots/{done.id}").text
    bars = re.findall(
        r'height="([\d.]+)"[^>]*><title>key groups (\d+)-(\d+) \(busiest\): ([\d,]+)', html
    )
    assert len(bars) == 256
    hot = max(bars, key=lambda bar: float(bar[0]))
    assert int(hot[1]) <= 4001 <= int(hot[2]) and hot[3] == "5,000"


# --- maintenance history ---


def test_runs_page_shows_the_maintenance_history(logged_in: TestClient, seeded: Seeded) -> None:
    html = logged_in.get("/runs").text
    self_contained(html)
    assert "3-3" not in html and "1-3 of 3 runs" in html
    for kind, run in (("compaction", "compaction-1"), ("orphan_cleanup", "orphans-1"),
                      ("ttl_cleanup", "ttl-9")):  # fmt: skip
        assert f'<td class="wrap"><b>{kind}</b><br><small>{run}</small></td>' in html
    assert "statekeeper_ttl_cleanup" in html and "scheduled__2025-01-01T00:00:00+00:00" in html
    # the run links to its Airflow DAG run and its task's log, in Airflow's own UI
    dag_run = "../dags/statekeeper_ttl_cleanup/runs/scheduled__2025-01-01T00%3A00%3A00%2B00%3A00"
    assert dag_run in parse(html).hrefs
    assert f"{dag_run}/tasks/ttl_cleanup/mapped" in parse(html).hrefs
    assert "executor lost &lt;heartbeat&gt;" in html  # the error, escaped
    assert "status-FAILED" in html and "status-SUCCEEDED" in html and "status-RUNNING" in html
    # rows in and out of the compaction, in one cell
    assert '<td class="num flow" title="in 1280, out 1280"><span>1,280</span> &rarr; ' in html
    assert "running" in html  # orphans-1 has no duration yet
    assert f"snapshots/{seeded.completed_id}" in parse(html).hrefs  # compaction's output


def test_runs_page_filters_by_job_kind_and_status(logged_in: TestClient) -> None:
    orders = logged_in.get("/runs?job=orders").text
    assert "Maintenance runs of job orders" in orders
    assert "compaction-1" in orders and "ttl-9" in orders and "orphans-1" not in orders
    assert '<option value="orders" selected>' in orders

    failed = logged_in.get("/runs?job=orders&status=FAILED").text
    assert "ttl-9" in failed and "compaction-1" not in failed

    # The form sends empty strings for "all".
    everything = logged_in.get("/runs?job=&kind=&status=").text
    assert "1-3 of 3 runs" in everything

    kind = logged_in.get("/runs?kind=orphan_cleanup&limit=1").text
    assert "orphans-1" in kind and "compaction-1" not in kind

    # an unknown status is refused like an unknown kind, not an empty table
    bad = logged_in.get("/runs?status=DONE")
    assert bad.status_code == 400 and "status must be one of RUNNING, SUCCEEDED, FAILED" in bad.text
    assert bad.headers["X-Content-Type-Options"] == "nosniff"
    huge = logged_in.get(f"/snapshots/{2**63}")
    assert huge.status_code == 400 and "snapshot_id" in huge.text


def test_job_and_snapshot_pages_offer_airflows_trigger_forms(
    logged_in: TestClient, seeded: Seeded
) -> None:
    import json
    from urllib.parse import parse_qs, urlsplit

    job_links = parse(logged_in.get("/jobs/orders").text).hrefs
    snap_links = parse(logged_in.get(f"/snapshots/{seeded.completed_id}").text).hrefs
    for links, conf in (
        (job_links, {"job": "orders"}),
        (snap_links, {"job": "orders", "source_snapshot": seeded.completed_id}),
    ):
        triggers = {urlsplit(h).path: h for h in links if h.startswith("../../dags/")}
        assert set(triggers) == {
            "../../dags/statekeeper_savepoint",
            "../../dags/statekeeper_rescale",
            "../../dags/statekeeper_ttl_cleanup",
            "../../dags/statekeeper_maintenance",
        }
        for dag in ("statekeeper_savepoint", "statekeeper_rescale"):
            query = parse_qs(urlsplit(triggers[f"../../dags/{dag}"]).query)
            assert json.loads(query["conf"][0]) == conf


# --- unknown things ---


@pytest.mark.parametrize(
    ("path", "named", "root"),
    [
        ("/jobs/nope", "'nope'", "../"),
        ("/snapshots/9999", "9999", "../"),
        ("/runs?job=nope", "'nope'", ""),
    ],
)
def test_unknown_job_or_snapshot_is_a_readable_404_page(
    logged_in: TestClient, path: str, named: str, root: str
) -> None:
    response = logged_in.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<title>Statekeeper: not found</title>" in html
    assert named.replace("'", "&#x27;") in html
    # Its links lead back into the app from where the request was.
    hrefs = parse(html).hrefs
    assert urljoin(f"http://x/statekeeper{path}", hrefs[0]) == "http://x/statekeeper/"
    assert f"{root}runs" in hrefs
    self_contained(html)


def test_the_api_keeps_json_404s(logged_in: TestClient, make_token: Callable[..., str]) -> None:
    response = logged_in.get("/api/jobs/nope", headers={"Authorization": f"Bearer {make_token()}"})
    assert response.status_code == 404
    assert "'nope'" in response.json()["detail"]


def test_native_figures_are_estimates_and_the_chart_separates_formats(
    logged_in: TestClient, seeded: Seeded, make_token: Callable[..., str]
) -> None:
    """A native checkpoint's entries and skew are marked as estimates (page and API); a
    canonical savepoint among native checkpoints is its own line, drawn as a square."""
    with Catalog.open(seeded.url) as cat:
        cat.register_job("rocks", max_parallelism=8, location="file:///ckpt/rocks")
        ids = {}
        for n, (fmt, kind) in enumerate(
            [("NATIVE", "CHECKPOINT"), ("NATIVE", "CHECKPOINT"), ("CANONICAL", "SAVEPOINT")]
        ):
            snap = cat.begin_snapshot(
                "rocks", location=f"file:///ckpt/rocks/s{n}", parallelism=1, format=fmt, kind=kind
            )
            cat.attach_files(snap.id, [FileRef(f"file:///ckpt/rocks/s{n}/f", 1000 * (n + 1),
                                               operator="process", subtask=0)])  # fmt: skip
            cat.record_key_group_stats(
                snap.id, [KeyGroupStatRow("process", k, 100 + k) for k in range(8)]
            )
            ids[n] = cat.complete_snapshot(snap.id, snap.version).id

    page = logged_in.get("/jobs/rocks").text
    # the two native rows, not the savepoint
    assert len(re.findall(r'<td class="num" title="\d+ \(estimated', page)) == 2
    assert "estimated from RocksDB SST metadata" in page
    assert ">total, native</title>" in page and ">total, canonical</title>" in page
    assert page.count('class="savepoint"') == 1 and "■ savepoint" in page
    native_page = logged_in.get(f"/snapshots/{ids[0]}").text
    assert "~ estimated" in native_page and 'class="figure skew">~' in native_page
    canonical_page = logged_in.get(f"/snapshots/{ids[2]}").text
    assert "~ estimated" not in canonical_page

    auth = {"Authorization": f"Bearer {make_token()}"}
    native = logged_in.get(f"/api/snapshots/{ids[0]}", headers=auth).json()
    assert native["snapshot"]["entries_estimated"] is True and native["skew"][0]["estimated"]
    canonical = logged_in.get(f"/api/snapshots/{ids[2]}", headers=auth).json()
    assert canonical["snapshot"]["entries_estimated"] is False
    assert canonical["skew"][0]["estimated"] is False


def test_job_page_states_the_jobs_management_policy(logged_in: TestClient, seeded: Seeded) -> None:
    html = logged_in.get("/jobs/orders").text
    policy = re.search(r'<dd class="policy">(.*?)</dd>', html)
    assert policy is not None and policy.group(1).startswith("manages retention, orphans: ")
    with Catalog.open(seeded.url) as cat:
        cat.set_job_policy("orders", [])
    html = logged_in.get("/jobs/orders").text
    assert "read-only: Statekeeper deletes nothing in this job's directories" in html
    assert "<code>statectl jobs set-policy orders --manage orphans</code>" in html


def test_a_run_that_deleted_files_shows_what_it_deleted_and_lists_the_paths(
    logged_in: TestClient, seeded: Seeded
) -> None:
    paths = ["file:///ckpt/orders/chk-1/op-0.parquet", "file:///ckpt/orders/a <b>.sst"]
    report = {
        "files_deleted": 2,
        "bytes_deleted": 3000,
        "deleted": {"count": 2, "items": paths, "truncated": False},
    }
    with Catalog.open(seeded.url) as cat:
        cat.start_run("expire/7", "expire", job="orders")
        cat.finish_run("expire/7", stats={"stats": report}, bytes_in=3000, bytes_out=0)
    html = logged_in.get("/runs").text
    self_contained(html)
    assert "runs/expire%2F7" in parse(html).hrefs
    assert ">2 deleted</a><br><small>2.9 KiB</small>" in html
    assert "&rarr; <span>0 B</span>" not in html  # a deletion is not "0 B out"

    run = logged_in.get("/runs/expire%2F7")
    assert run.status_code == 200
    self_contained(run.text)
    assert "2 files deleted, 2.9 KiB." in run.text
    for path in paths:
        assert f'<td class="path">{path.replace("<", "&lt;").replace(">", "&gt;")}</td>' in run.text
    assert "../jobs/orders" in parse(run.text).hrefs and "../runs" in parse(run.text).hrefs
    # a run that deleted nothing says so; an unknown run is the readable 404
    assert "This run deleted no files." in logged_in.get("/runs/compaction-1").text
    missing = logged_in.get("/runs/nope")
    assert missing.status_code == 404 and "nope" in missing.text
