"""Headless Chromium driven over the DevTools protocol, for the browser test.

A few dozen lines over ``websockets`` (installed with Airflow) instead of a browser-automation
library: Chromium comes from Debian's package, and the test needs only cookies, navigation,
``Runtime.evaluate`` and a screenshot. Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

INSTALL_HINT = (
    "apt-get install -y chromium (as root; `make test` does it when chromium is missing), "
    "or point $CHROMIUM at a Chromium binary"
)
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox needs user namespaces we may not have
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often have a 64 MB /dev/shm
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    configured = os.environ.get("CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the browser did not answer before the deadline")
        return left


class Page:
    """One DevTools session on a page target."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        deadline = Deadline(timeout)
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=deadline.left()))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = Deadline(timeout)
        while True:
            for n, message in enumerate(self.events):
                if message["method"] == event:
                    del self.events[: n + 1]
                    return message.get("params", {})
            self.events.append(json.loads(self.ws.recv(timeout=deadline.left())))

    def navigate(self, url: str, timeout: float = 30) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", timeout)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")


@contextmanager
def chromium(binary: str, profile: Path, *, timeout: float = 60) -> Iterator[Page]:
    """A headless Chromium with a fresh profile, and a DevTools session on its page."""
    profile.mkdir(parents=True, exist_ok=True)
    log = (profile.parent / "chromium.log").open("wb")
    process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its renderer and GPU processes go with it at the end
    )
    try:
        port = _devtools_port(profile, process, Deadline(timeout))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        [target] = [t for t in targets if t["type"] == "page"]
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            page = Page(ws)
            page.call("Page.enable")
            page.call("Network.enable")
            yield page
    finally:
        stop(process)
        log.close()


def _devtools_port(profile: Path, process: subprocess.Popen[bytes], deadline: Deadline) -> int:
    # Chromium writes the port it picked (we asked for 0: any free one) into its profile.
    active = profile / "DevToolsActivePort"
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"chromium exited with {process.returncode}; see {profile.parent / 'chromium.log'}"
            )
        if active.exists():
            lines = active.read_text().splitlines()
            if lines and lines[0].strip().isdigit():
                return int(lines[0])
        deadline.left()
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a process started in its own session, and everything it started."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
    else:
        # The leader is gone; its children may not be.
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
