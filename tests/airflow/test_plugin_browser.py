"""The plugin's pages in a real browser, served by a real Airflow that runs what it is asked to.

A small Airflow of our own on free loopback ports: its metadata on a fresh PostgreSQL database, the
scheduler (LocalExecutor), the DAG processor and the API server with our ``dags/`` and ``plugins/``
folders, SimpleAuthManager, and a seeded SQLite catalog (``tests/cluster/sk_cluster.py`` starts
it, as it does the cluster tests' Airflow; here Spark runs in the task, ``local[1]``). Headless
Chromium first proves an anonymous visitor lands on Airflow's login, then logs in the way the UI
does (a JWT from ``POST /auth/token`` in the ``_token`` cookie), opens a job's page, and the test
reads the rendered DOM and decodes the screenshot's pixels. The last test takes a savepoint from
the job page through Airflow's own trigger form and sees the savepoint appear on that page.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import numpy as np
import pytest

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from state_engine.snapshot.storage import CheckpointStorage
from tests.airflow import sk_png
from tests.airflow.sk_airflow_support import MovableClock
from tests.airflow.sk_browser import INSTALL_HINT, chromium, find_chromium
from tests.cluster.sk_cluster import (
    AirflowDeployment,
    StackError,
    airflow_env,
    free_port,
    start_airflow,
    wait_until,
)
from tests.jobs.jobdata import make_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.spark]

CHART_BLUE = (9, 103, 210)  # charts.COLORS[0], the "total" line and its points
SNAPSHOTS = 8
DELETED = ["file:///ckpt/orders/chk-99/lost.parquet", "file:///ckpt/orders/shared/old-base.sst"]


@dataclass(frozen=True)
class Server:
    airflow: AirflowDeployment

    @property
    def url(self) -> str:
        return self.airflow.url

    @property
    def log(self) -> Path:
        """The API server's log (the plugin's pages run in it)."""
        [api] = [s for s in self.airflow.services if s.name == "airflow-api-server"]
        return api.log


@pytest.fixture(scope="module")
def chromium_binary() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(
                f"chromium is not installed, and CI must run the browser test: {INSTALL_HINT}"
            )
        pytest.skip(f"chromium is not installed: {INSTALL_HINT}")
    return binary


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return (tmp_path_factory.mktemp("browser-checkpoints") / "checkpoints").as_uri()


@pytest.fixture(scope="module")
def browser_catalog(
    sqlite_catalog_template: Path, tmp_path_factory: pytest.TempPathFactory, checkpoint_root: str
) -> str:
    """Job ``orders``: eight completed checkpoints an hour apart, its state growing, two
    operators, and a hot key group (7) in every snapshot (catalog rows only: no files).
    Job ``clicks``: one real canonical checkpoint under ``checkpoint_root``, which a savepoint
    run can read."""
    import shutil

    path = tmp_path_factory.mktemp("browser-catalog") / "catalog.db"
    shutil.copyfile(sqlite_catalog_template, path)
    url = f"sqlite:///{path}"
    now = datetime.now(UTC)
    clock = MovableClock(now)
    with Catalog.open(url, clock=clock) as cat:
        cat.register_job("orders", max_parallelism=128, location="file:///ckpt/orders")
        for n in range(1, SNAPSHOTS + 1):
            clock.now = now - timedelta(hours=SNAPSHOTS - n)
            snap = cat.begin_snapshot(
                "orders", location=f"file:///ckpt/orders/chk-{n}", parallelism=2
            )
            cat.attach_files(
                snap.id,
                [
                    FileRef(
                        path=f"file:///ckpt/orders/chk-{n}/{op}-{sub}.parquet",
                        size=(40_000 if op == "counter" else 15_000) * n + 1_000 * sub,
                        operator=op,
                        subtask=sub,
                        key_group_start=sub * 64,
                        key_group_end=sub * 64 + 63,
                    )
                    for op in ("counter", "window")
                    for sub in range(2)
                ],
            )
            cat.record_key_group_stats(
                snap.id,
                [
                    KeyGroupStatRow(op, kg, rows=(900 if kg == 7 else 50 + kg % 13) * n)
                    for op in ("counter", "window")
                    for kg in range(128)
                ],
            )
            cat.complete_snapshot(snap.id, snap.version)
        # runs with the long ids, Airflow run ids and errors real runs have (the 1024 px check)
        for n, kind in enumerate(("savepoint", "rescale", "compaction")):
            run_id = f"airflow-{kind}-orders-{'0123456789abcdef01234567'[n:] + 'x' * n}"
            cat.start_run(
                run_id,
                kind,
                job="orders",
                input_snapshot_id=SNAPSHOTS,
                dag_id="statekeeper_maintenance" if kind == "compaction" else f"statekeeper_{kind}",
                airflow_run_id=f"manual__2026-11-24T03:1{n}:29.123456+00:00",
            )
            cat.fail_run(
                run_id,
                "snapshot 8 of job 'orders' is in NATIVE format; this job reads canonical "
                "snapshots: file:///var/lib/statekeeper/checkpoints/orders/chk-8/"
                + "very-long-file-name-without-breaks-"
                * 4,
            )
        # an orphan cleanup that deleted files (its report lists them), and a Flink job imported
        # read-only (catalog rows only)
        cat.start_run(
            "airflow-orphan_cleanup-orders-5",
            "orphan_cleanup",
            job="orders",
            dag_id="statekeeper_maintenance",
            airflow_run_id="scheduled__2026-11-24T04:00:00+00:00",
        )
        cat.finish_run(
            "airflow-orphan_cleanup-orders-5",
            stats={"stats": {"files_deleted": 2, "bytes_deleted": 4096, "deleted": {
                "count": 2, "items": DELETED, "truncated": False}}},
            bytes_in=4096,
            bytes_out=0,
        )  # fmt: skip
        cat.register_job("audit", max_parallelism=128, origin="flink")
    with Catalog.open(url) as cat:
        make_snapshot(cat, CheckpointStorage(checkpoint_root), job="clicks", keys=40)
    return url


@pytest.fixture(scope="module")
def api_server(
    browser_catalog: str,
    checkpoint_root: str,
    make_pg_database: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """Airflow's scheduler, DAG processor and API server on a fresh PostgreSQL database; the
    maintenance tasks run Spark in-process on ``local[1]``."""
    home = tmp_path_factory.mktemp("airflow")
    env = airflow_env(
        home,
        db_url=make_pg_database(),
        port=free_port(),
        spark_master_url="spark://127.0.0.1:7077",  # replaced below: no cluster here
        extra={
            "STATEKEEPER_CATALOG_URL": browser_catalog,
            "STATEKEEPER_CHECKPOINT_ROOT": checkpoint_root,
            "STATEKEEPER_HOME": str(home / "statekeeper-home"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
    )
    env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[1]"})
    airflow = start_airflow(home, env)
    try:
        yield Server(airflow)
    finally:
        # SIGTERM to all three first, so they shut down side by side; stop() then waits for each
        for service in airflow.services:
            if service.alive():
                with suppress(ProcessLookupError):
                    os.killpg(service.pid, signal.SIGTERM)
        airflow.stop()


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def login_token(server: Server) -> str:
    return server.airflow.login()


def log_in(page: Any, server: Server) -> None:
    """The browser carries the admin's login cookie, as after Airflow's login page."""
    page.call(
        "Network.setCookie",
        name="_token",
        value=login_token(server),
        url=f"{server.url}/",
        path="/",
    )


def test_the_job_page_renders_its_size_chart_in_chromium(
    chromium_binary: str, api_server: Server, tmp_path: Path
) -> None:
    job_url = f"{api_server.url}/statekeeper/jobs/orders"
    with chromium(chromium_binary, tmp_path / "profile") as page:
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )
        # Anonymous: the plugin sends the browser to Airflow's login, asking to come back.
        page.navigate(job_url)
        landed = page.evaluate("location.pathname + location.search")
        assert landed.startswith("/auth/login"), landed
        assert "statekeeper%2Fjobs%2Forders" in landed or "statekeeper/jobs/orders" in landed

        # Logged in as the UI is: Airflow's JWT in the _token cookie.
        log_in(page, api_server)
        page.navigate(job_url)
        dom = page.evaluate(
            """JSON.stringify({
                title: document.title,
                path: location.pathname,
                chart: (() => {
                    const svg = document.getElementById("size-chart");
                    if (!svg) return null;
                    const r = svg.getBoundingClientRect();
                    return {x: r.x, y: r.y, width: r.width, height: r.height,
                            points: svg.querySelectorAll("circle").length,
                            lines: svg.querySelectorAll("polyline").length};
                })(),
                snapshotLinks: document.querySelectorAll('a[href^="../snapshots/"]').length,
                heading: document.querySelector("h1").textContent,
            })"""
        )
        screenshot = page.call("Page.captureScreenshot", format="png")["data"]

        # Follow the newest snapshot's link, as a person would: its skew histogram renders.
        page.events.clear()
        page.evaluate("document.querySelector('a[href^=\"../snapshots/\"]').click()")
        page.wait_for("Page.loadEventFired")
        snapshot_dom = json.loads(
            page.evaluate(
                """JSON.stringify({
                    title: document.title,
                    bars: document.querySelectorAll("#skew-chart-0 rect.bar").length,
                    skew: document.querySelector(".figure.skew").textContent,
                })"""
            )
        )
        snapshot_png = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])

    state = json.loads(dom)
    assert state["title"] == "Statekeeper: job orders", tail(api_server.log)
    assert state["path"] == "/statekeeper/jobs/orders"
    assert state["heading"] == "Job orders"
    chart = state["chart"]
    assert chart is not None, "no #size-chart element in the rendered page"
    # A total line and one per operator, a point per completed snapshot on each.
    assert (chart["lines"], chart["points"]) == (3, 3 * SNAPSHOTS)
    assert chart["width"] > 400 and chart["height"] > 100  # laid out, not collapsed
    assert state["snapshotLinks"] == SNAPSHOTS

    png = base64.b64decode(screenshot)
    path = tmp_path / "job-page.png"
    path.write_bytes(png)
    image = sk_png.decode(png)
    assert (image.width, image.height) == (1280, 1000)
    rgb = image.rgb()
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(colours) > 20, f"a near-blank screenshot ({len(colours)} colours): {path}"
    # The chart's line and points are drawn where the DOM says the chart is.
    top, left = int(chart["y"]), int(chart["x"])
    area = rgb[top : top + int(chart["height"]), left : left + int(chart["width"])]
    blue = (area == np.array(CHART_BLUE, dtype=np.uint8)).all(axis=2).sum()
    assert blue > 100, f"the size chart is not painted in the screenshot: {path}"

    # The newest snapshot (checkpoint 8): 127 key groups around 56 rows x 8, key group 7 hot.
    (tmp_path / "snapshot-page.png").write_bytes(snapshot_png)
    assert snapshot_dom["title"].startswith("Statekeeper: snapshot ")
    assert snapshot_dom["bars"] == 128
    assert float(snapshot_dom["skew"]) > 10
    shot = sk_png.decode(snapshot_png).rgb()
    assert (shot == np.array(CHART_BLUE, dtype=np.uint8)).all(axis=2).sum() > 500


def test_the_job_page_states_its_policy_and_a_run_lists_the_files_it_deleted(
    chromium_binary: str, api_server: Server, tmp_path: Path
) -> None:
    """A read-only Flink job's page says so and how to grant deletion; the runs page shows what
    an orphan cleanup deleted, and its link opens the run's page listing every path."""
    policy = "JSON.stringify(document.querySelector('dd.policy').textContent)"
    with chromium(chromium_binary, tmp_path / "profile") as page:
        log_in(page, api_server)
        page.navigate(f"{api_server.url}/statekeeper/jobs/audit")
        audit = json.loads(page.evaluate(policy))
        page.navigate(f"{api_server.url}/statekeeper/jobs/orders")
        orders = json.loads(page.evaluate(policy))
        page.navigate(f"{api_server.url}/statekeeper/runs?kind=orphan_cleanup")
        cell = json.loads(
            page.evaluate("JSON.stringify(document.querySelector('td.deleted').innerText)")
        )
        page.events.clear()
        page.evaluate("document.querySelector('td.deleted a').click()")
        page.wait_for("Page.loadEventFired")
        run = json.loads(
            page.evaluate(
                """JSON.stringify({
                    path: location.pathname,
                    summary: document.getElementById("deleted-summary").textContent,
                    paths: [...document.querySelectorAll("td.path")].map(td => td.textContent),
                })"""
            )
        )
        (tmp_path / "run-page.png").write_bytes(
            base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
        )
    assert audit.startswith("read-only: Statekeeper deletes nothing"), tail(api_server.log)
    assert "statectl jobs set-policy audit --manage orphans" in audit
    assert orders.startswith("manages retention, orphans")
    assert cell.split() == ["2", "deleted", "4.0", "KiB"]
    assert run["path"] == "/statekeeper/runs/airflow-orphan_cleanup-orders-5"
    assert run["summary"] == "2 files deleted, 4.0 KiB."
    assert run["paths"] == DELETED


PAGES = ("/statekeeper/", "/statekeeper/jobs/orders", f"/statekeeper/snapshots/{SNAPSHOTS}",
         "/statekeeper/runs")  # fmt: skip
LAYOUT = """JSON.stringify({
    scroll: document.documentElement.scrollWidth,
    width: window.innerWidth,
    theme: document.documentElement.className,
    background: getComputedStyle(document.body).backgroundColor,
    wrappedDates: [...document.querySelectorAll("time")]
        .filter(t => t.getClientRects().length > 1).length,
    dates: document.querySelectorAll("time").length,
})"""


def test_pages_fit_1024_and_1440_px_in_airflows_light_and_dark_theme(
    chromium_binary: str, api_server: Server, tmp_path: Path
) -> None:
    """Every page at 1024 and 1440 px, with Airflow's theme setting light and dark: no
    horizontal overflow (the page's scroll width), dates on one line, the theme followed."""
    shots = tmp_path / "screenshots"
    shots.mkdir()
    seen: dict[tuple[str, int, str], dict[str, Any]] = {}
    with chromium(chromium_binary, tmp_path / "profile") as page:
        log_in(page, api_server)
        page.navigate(f"{api_server.url}/statekeeper/")
        for theme in ("light", "dark"):
            # Airflow's UI keeps its light/dark choice here (next-themes' "theme" key)
            page.evaluate(f"localStorage.setItem('theme', '{theme}')")
            for width in (1024, 1440):
                page.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=900,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                for path in PAGES:
                    page.navigate(f"{api_server.url}{path}")
                    layout = json.loads(page.evaluate(LAYOUT))
                    png = base64.b64decode(
                        page.call("Page.captureScreenshot", format="png")["data"]
                    )
                    name = path.strip("/").replace("/", "-") or "statekeeper"
                    out = shots / f"{name}-{width}-{theme}.png"
                    out.write_bytes(png)
                    corner = sk_png.decode(png).rgb()[2, 2].astype(int)
                    seen[(path, width, theme)] = {**layout, "corner": corner.tolist(), "png": out}
    for (path, width, theme), got in seen.items():
        where = f"{path} at {width} px, {theme}: {got['png']}"
        assert got["scroll"] <= got["width"] == width, f"horizontal overflow on {where}"
        assert got["wrappedDates"] == 0, f"a date wraps on {where}"
        assert theme in str(got["theme"]), where
        brightness = sum(got["corner"]) / 3
        assert (brightness < 80) if theme == "dark" else (brightness > 230), where
    assert seen[("/statekeeper/runs", 1024, "light")]["dates"] >= 3


SNAPSHOT_TABLE = """JSON.stringify([...document.querySelectorAll("table tbody tr")]
    .map(tr => [...tr.cells].map(td => td.textContent.trim())))"""
RUN_LINKS = """JSON.stringify([...document.querySelectorAll("table tbody a[target=_top]")]
    .map(a => a.getAttribute("href")))"""


def test_take_savepoint_from_the_job_page_runs_the_dag_and_the_savepoint_appears_there(
    chromium_binary: str, api_server: Server, tmp_path: Path
) -> None:
    """Job page -> "Take savepoint" -> Airflow's page of the savepoint DAG -> its trigger form
    (the job chosen among the catalog's jobs, as Airflow 3.3.2 cannot pre-fill it from the
    link) -> the scheduler runs the savepoint task (Spark in the task) -> the job page, loaded
    again, lists the new savepoint, and the runs page links to the DAG run that made it, whose
    "Trigger again with this config" (what 3.3.2 does pre-fill) opens the form with the job."""
    job_url = f"{api_server.url}/statekeeper/jobs/clicks"
    with chromium(chromium_binary, tmp_path / "profile") as page:
        log_in(page, api_server)
        page.navigate(job_url)
        before = json.loads(page.evaluate(SNAPSHOT_TABLE))
        action = json.loads(
            page.evaluate(
                """JSON.stringify((() => {
                    const a = [...document.querySelectorAll(".actions a")]
                        .find(a => a.textContent === "Take savepoint");
                    return a && {href: a.href, target: a.target};
                })())"""
            )
        )
        assert action is not None and action["target"] == "_top"
        dag_parsed(api_server, "statekeeper_savepoint")
        page.events.clear()
        page.evaluate(
            "[...document.querySelectorAll('.actions a')]"
            ".find(a => a.textContent === 'Take savepoint').click()"
        )
        page.wait_for("Page.loadEventFired")
        landed = json.loads(
            page.evaluate("JSON.stringify({path: location.pathname, search: location.search})")
        )
        # Airflow's own trigger form of that DAG, its job field suggesting the catalog's jobs
        appear(page, '[data-testid="trigger-dag-button"]')
        page.evaluate("document.querySelector('[data-testid=\"trigger-dag-button\"]').click()")
        appear(page, 'input[name="element_job"]')
        form = json.loads(
            page.evaluate(
                """JSON.stringify((() => {
                    const input = document.querySelector('input[name="element_job"]');
                    const list = input.list;
                    return {value: input.value,
                            suggested: list ? [...list.options].map(o => o.value) : []};
                })())"""
            )
        )
        # fill the job in as a person would (React sees an input event) and trigger the run
        page.evaluate(
            """(() => {
                const input = document.querySelector('input[name="element_job"]');
                const proto = HTMLInputElement.prototype;
                Object.getOwnPropertyDescriptor(proto, "value").set.call(input, "clicks");
                input.dispatchEvent(new Event("input", {bubbles: true}));
            })()"""
        )
        appear(page, '[data-testid="trigger-dag-submit"]:not([disabled])')
        page.evaluate("document.querySelector('[data-testid=\"trigger-dag-submit\"]').click()")
        # on success Airflow's UI closes the form (and shows the new run)
        until(page, "!document.querySelector('[data-testid=\"trigger-dag-submit\"]')")
    [run] = dag_runs(api_server, "statekeeper_savepoint")
    # (no browser open meanwhile: an idle DevTools connection would fill with the UI's events)
    finished = run_finished(api_server, "statekeeper_savepoint", run["dag_run_id"])

    # the job page, loaded again, lists the savepoint the run wrote
    with chromium(chromium_binary, tmp_path / "profile-after") as page:
        log_in(page, api_server)
        page.navigate(job_url)
        after = json.loads(page.evaluate(SNAPSHOT_TABLE))
        (tmp_path / "job-page-after-savepoint.png").write_bytes(
            base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
        )
        page.navigate(f"{api_server.url}/statekeeper/runs?job=clicks")
        run_links = json.loads(page.evaluate(RUN_LINKS))
        # what Airflow 3.3.2 does pre-fill: "Trigger again with this config" on a run's page
        run_page = f"/dags/statekeeper_savepoint/runs/{quote(run['dag_run_id'], safe='')}"
        page.navigate(f"{api_server.url}{run_page}")
        appear(page, '[data-testid="trigger-dag-button"]')
        mouse_click(page, '[data-testid="trigger-dag-button"]')
        again = (
            "[...document.querySelectorAll('[role=menuitem]')]"
            ".find(m => m.textContent === 'Trigger again with this config')"
        )
        until(page, again)
        mouse_click_js(page, again)
        appear(page, 'input[name="element_job"]')
        refilled = page.evaluate("document.querySelector('input[name=\"element_job\"]').value")

    assert landed["path"] == "/dags/statekeeper_savepoint", landed
    assert json.loads(parse_qs(landed["search"].lstrip("?"))["conf"][0]) == {"job": "clicks"}
    # Airflow 3.3.2 does not read the link's conf: the field starts empty, with suggestions
    assert form == {"value": "", "suggested": ["audit", "clicks", "orders"]}
    assert run["conf"]["job"] == "clicks"
    assert finished["state"] == "success"
    with Catalog.open(api_server.airflow.env["STATEKEEPER_CATALOG_URL"]) as cat:
        [catalog_run] = cat.list_runs(job="clicks", kind="savepoint")
        assert catalog_run.output_snapshot_id is not None
        savepoint = cat.get_snapshot(catalog_run.output_snapshot_id)
    assert (catalog_run.status, catalog_run.dag_id, catalog_run.airflow_run_id) == (
        "SUCCEEDED",
        "statekeeper_savepoint",
        run["dag_run_id"],
    )
    assert (savepoint.job, savepoint.kind, savepoint.status) == ("clicks", "SAVEPOINT", "COMPLETED")
    assert [row[0] for row in before] == [str(catalog_run.input_snapshot_id)]
    # newest first: the savepoint above the checkpoint it captured
    assert [(row[0], row[2], row[4]) for row in after] == [
        (str(savepoint.id), "savepoint", "completed"),
        (str(catalog_run.input_snapshot_id), "checkpoint", "completed"),
    ], after
    assert any(href.endswith(run_page) for href in run_links), run_links
    assert refilled == "clicks"


def mouse_click(page: Any, selector: str) -> None:
    """A real click (pointer and mouse events) in the middle of ``selector``'s element."""
    mouse_click_js(page, f"document.querySelector({json.dumps(selector)})")


def mouse_click_js(page: Any, element: str) -> None:
    box = json.loads(page.evaluate(f"JSON.stringify(({element}).getBoundingClientRect())"))
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


def appear(page: object, selector: str, timeout: float = 120) -> None:
    """Wait until ``selector`` matches (see :func:`until`)."""
    until(page, f"document.querySelector({json.dumps(selector)})", timeout)


def until(page: object, condition: str, timeout: float = 120) -> None:
    """Wait until the JS ``condition`` holds: a promise the page resolves when its own DOM
    changes make it true (no polling, no sleeping)."""
    script = (
        "new Promise(resolve => {"
        f"  const ok = () => Boolean({condition});"
        "  if (ok()) { resolve(true); return; }"
        "  new MutationObserver((_, o) => { if (ok()) { o.disconnect(); resolve(true); } })"
        "    .observe(document, {subtree: true, childList: true, attributes: true});"
        "})"
    )
    result = page.call(  # type: ignore[attr-defined]  # the fixture yields an untyped page
        "Runtime.evaluate", timeout=timeout, expression=script, awaitPromise=True,
        returnByValue=True,
    )  # fmt: skip
    assert result["result"].get("value") is True, (condition, result)


def dag_parsed(server: Server, dag_id: str) -> None:
    """Wait until the DAG processor has put ``dag_id`` in Airflow's database."""
    wait_until(
        lambda: server.airflow.api(f"/dags/{dag_id}")[0] == 200,
        f"the DAG processor to parse {dag_id}",
        server.airflow.services,
    )


def run_finished(server: Server, dag_id: str, run_id: str) -> dict[str, Any]:
    """Wait for the DAG run to end (a generous deadline: Spark starts in the task on a busy
    machine); a task that failed or waits for a retry fails the test with its log at once."""
    path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"

    def ended() -> dict[str, Any] | None:
        status, run = server.airflow.api(path)
        assert status == 200, run
        if run["state"] in ("success", "failed"):
            return run
        status, tis = server.airflow.api(f"{path}/taskInstances")
        assert status == 200, tis
        for ti in tis["task_instances"]:
            if ti["state"] in ("failed", "up_for_retry"):
                raise StackError(task_log(server, path, ti))
        return None

    run = wait_until(ended, f"{dag_id} run {run_id}", server.airflow.services, patience=600)
    if run["state"] != "success":
        _, tis = server.airflow.api(f"{path}/taskInstances")
        raise StackError("\n".join(task_log(server, path, ti) for ti in tis["task_instances"]))
    return run


def task_log(server: Server, run_path: str, ti: dict[str, Any]) -> str:
    status, body = server.airflow.api(
        f"{run_path}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
    )
    text = json.dumps(body)[-6000:] if status == 200 else f"(no log: {status})"
    return f"task {ti['task_id']} is {ti['state']}:\n{text}"


def dag_runs(server: Server, dag_id: str) -> list[dict[str, Any]]:
    status, body = server.airflow.api(f"/dags/{quote(dag_id, safe='')}/dagRuns")
    assert status == 200, body
    return list(body["dag_runs"])
