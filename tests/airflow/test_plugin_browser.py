"""The plugin's pages in a real browser, served by a real ``airflow api-server``.

The server runs on a free loopback port with the session's migrated Airflow home, our
``plugins/`` folder, SimpleAuthManager with a known password, and a seeded SQLite catalog.
Headless Chromium first proves an anonymous visitor lands on Airflow's login, then logs in the
way the UI does (a JWT from ``POST /auth/token`` in the ``_token`` cookie), opens a job's page,
and the test reads the rendered DOM and decodes the screenshot's pixels.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from tests.airflow import sk_png
from tests.airflow.sk_airflow_support import MovableClock
from tests.airflow.sk_browser import INSTALL_HINT, Deadline, chromium, find_chromium, stop

pytestmark = pytest.mark.slow

PASSWORD = "browser-test-password"
CHART_BLUE = (9, 103, 210)  # charts.COLORS[0], the "total" line and its points
SNAPSHOTS = 8


@dataclass(frozen=True)
class Server:
    url: str
    log: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
def browser_catalog(sqlite_catalog_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Job ``orders``: eight completed checkpoints an hour apart, its state growing, two
    operators, and a hot key group (7) in every snapshot."""
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
    return url


@pytest.fixture(scope="module")
def api_server(
    airflow_home: Path, browser_catalog: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("api-server")
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__BASE_URL": url,
        "STATEKEEPER_CATALOG_URL": browser_catalog,
    }
    log = work / "api-server.log"
    # the DAGs in Airflow's database, as the DAG processor would put them: their pages and
    # trigger forms render (the job suggestions read this catalog at parse time)
    parsed = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "dags", "reserialize"],
        env=env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert parsed.returncode == 0, parsed.stdout[-2000:] + parsed.stderr[-2000:]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("airflow")),
                "api-server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"{url}/api/v2/monitor/health", process, log)
        yield Server(url, log)
    finally:
        stop(process)


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = Deadline(180)
    while True:
        if process.poll() is not None:
            pytest.fail(f"airflow api-server exited with {process.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            deadline.left()
        except TimeoutError:
            pytest.fail(f"airflow api-server not healthy at {url} in time:\n{tail(log)}")
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)  # the pause between polls; returns early if it dies


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def login_token(server: Server) -> str:
    request = urllib.request.Request(
        f"{server.url}/auth/token",
        data=json.dumps({"username": "admin", "password": PASSWORD}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 201
        return json.load(answer)["access_token"]


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


def test_the_take_savepoint_action_opens_airflows_page_of_the_savepoint_dag(
    chromium_binary: str, api_server: Server, tmp_path: Path
) -> None:
    with chromium(chromium_binary, tmp_path / "profile") as page:
        log_in(page, api_server)
        page.navigate(f"{api_server.url}/statekeeper/jobs/orders")
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
                    return {suggested: list ? [...list.options].map(o => o.value) : []};
                })())"""
            )
        )
        # fill the job in as a person would (React sees an input event) and trigger the run
        page.evaluate(
            """(() => {
                const input = document.querySelector('input[name="element_job"]');
                const proto = HTMLInputElement.prototype;
                Object.getOwnPropertyDescriptor(proto, "value").set.call(input, "orders");
                input.dispatchEvent(new Event("input", {bubbles: true}));
            })()"""
        )
        # the session's Airflow database may hold runs of this DAG from other tests
        before = {r["dag_run_id"] for r in dag_runs(api_server, "statekeeper_savepoint")}
        appear(page, '[data-testid="trigger-dag-submit"]:not([disabled])')
        page.evaluate("document.querySelector('[data-testid=\"trigger-dag-submit\"]').click()")
        # on success Airflow's UI closes the form (and shows the new run)
        until(page, "!document.querySelector('[data-testid=\"trigger-dag-submit\"]')")
        runs = [
            r
            for r in dag_runs(api_server, "statekeeper_savepoint")
            if r["dag_run_id"] not in before
        ]
    assert landed["path"] == "/dags/statekeeper_savepoint", landed
    from urllib.parse import parse_qs

    assert json.loads(parse_qs(landed["search"].lstrip("?"))["conf"][0]) == {"job": "orders"}
    assert form["suggested"] == ["orders"]
    assert [r["conf"]["job"] for r in runs] == ["orders"]


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


def dag_runs(server: Server, dag_id: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.url}/api/v2/dags/{dag_id}/dagRuns",
        headers={"Authorization": f"Bearer {login_token(server)}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return list(json.load(answer)["dag_runs"])
