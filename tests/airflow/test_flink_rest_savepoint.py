"""FlinkSavepointOperator against a real Flink 2.3 cluster (the apache-flink package's scripts).

A standalone JobManager and TaskManager start on free ports, a SQL job (datagen -> GROUP BY ->
blackhole, keyed state) is submitted with ``flink run -d -py``; the operator triggers savepoints
through the REST API over the Airflow HTTP connection ``flink_default``, waits for them and
imports them into a real catalog, where verify passes. The job's own checkpoint directory is
imported too: metadata Flink wrote for a job unlike the fixtures' (RowData keys, SQL operators).

Needs a Flink distribution: ``STATEKEEPER_FLINK_HOME`` (the ``pyflink`` directory of an
``apache-flink==2.3.*`` install) or ``pyflink`` importable; skipped otherwise. Slow (~1 min).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog

pytestmark = pytest.mark.slow

STARTUP_S = 240  # a loaded 2-core CI machine starts two JVMs slowly
JOB_SQL = [
    "CREATE TABLE src (k STRING, v BIGINT) WITH ('connector'='datagen', "
    "'rows-per-second'='200', 'fields.k.length'='2', 'fields.v.min'='1', 'fields.v.max'='100')",
    "CREATE TABLE snk (k STRING, c BIGINT, s BIGINT) WITH ('connector'='blackhole')",
    "INSERT INTO snk SELECT k, COUNT(*), SUM(v) FROM src GROUP BY k",
]


def _flink_home() -> Path | None:
    given = os.environ.get("STATEKEEPER_FLINK_HOME", "").strip()
    if given:
        return Path(given)
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310
        return json.loads(response.read())


def _until(what: str, check: Any, log_dir: Path) -> Any:
    """Poll ``check`` (the REST API has no push) until it returns a value; fail past STARTUP_S."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(log_dir.glob("*.log")))
    pytest.fail(f"Flink: {what} did not happen within {STARTUP_S} s\n{logs}")


@dataclass
class Cluster:
    rest: str
    job_id: str
    checkpoints: Path
    savepoints: Path


@pytest.fixture(scope="module")
def flink_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = _flink_home()
    if home is None or not (home / "bin" / "jobmanager.sh").exists():
        pytest.skip(
            "no Flink distribution: pip install apache-flink==2.3.* or set STATEKEEPER_FLINK_HOME"
        )
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    work = tmp_path_factory.mktemp("flink-cluster")
    conf, logs = work / "conf", work / "log"
    conf.mkdir()
    logs.mkdir()
    for f in (home / "conf").iterdir():
        if f.name.startswith(("log4j", "logback")):
            shutil.copy(f, conf / f.name)
    java_opts = next(
        line.split("all:", 1)[1].strip()
        for line in (home / "conf" / "config.yaml").read_text().splitlines()
        if line.strip().startswith("all:")
    )
    rest_port = _free_port()
    settings = {
        "env.java.opts.all": java_opts,
        "jobmanager.rpc.address": "localhost",
        "jobmanager.rpc.port": _free_port(),
        "jobmanager.bind-host": "localhost",
        "jobmanager.memory.process.size": "1024m",
        "taskmanager.bind-host": "localhost",
        "taskmanager.host": "localhost",
        "taskmanager.rpc.port": _free_port(),
        "taskmanager.memory.process.size": "1280m",
        "taskmanager.numberOfTaskSlots": 2,
        "parallelism.default": 2,
        "rest.port": rest_port,
        "rest.address": "localhost",
        "rest.bind-address": "localhost",
        "execution.checkpointing.dir": (work / "checkpoints").as_uri(),
        "execution.checkpointing.savepoint-dir": (work / "savepoints").as_uri(),
        "execution.checkpointing.interval": "1s",
        "execution.checkpointing.num-retained": 2,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "state.backend.type": "hashmap",
    }
    (conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    env = {
        **os.environ,
        "FLINK_CONF_DIR": str(conf),
        "FLINK_LOG_DIR": str(logs),
        "FLINK_PID_DIR": str(work),
    }
    python = Path(sys.executable)
    site_python = home.parents[3] / "bin" / "python"  # <venv>/lib/pythonX/site-packages/pyflink
    if os.environ.get("STATEKEEPER_FLINK_HOME") and site_python.exists():
        python = site_python
    env["PYFLINK_CLIENT_EXECUTABLE"] = str(python)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    rest = f"http://localhost:{rest_port}"
    bin_dir = home / "bin"
    started: list[str] = []
    try:
        for daemon in ("jobmanager.sh", "taskmanager.sh"):
            subprocess.run(["bash", str(bin_dir / daemon), "start"], env=env, check=True,
                           capture_output=True, timeout=120)  # fmt: skip
            started.append(daemon)
        _until("a TaskManager registering",
               lambda: _get(f"{rest}/overview")["taskmanagers"] >= 1, logs)  # fmt: skip
        script = work / "job.py"
        script.write_text(
            "from pyflink.table import EnvironmentSettings, TableEnvironment\n"
            "t = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())\n"
            + "".join(f"t.execute_sql({s!r})\n" for s in JOB_SQL)
        )
        submitted = subprocess.run(
            ["bash", str(bin_dir / "flink"), "run", "-d", "-py", str(script)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = _until("the job appearing", lambda: _get(f"{rest}/jobs")["jobs"], logs)[0]["id"]
        _until(
            "a completed checkpoint",
            lambda: _get(f"{rest}/jobs/{job_id}/checkpoints")["counts"]["completed"] >= 1,
            logs,
        )
        yield Cluster(rest, job_id, work / "checkpoints" / job_id, work / "savepoints")
    finally:
        for daemon in reversed(started):
            subprocess.run(["bash", str(bin_dir / daemon), "stop"], env=env,
                           capture_output=True, timeout=120)  # fmt: skip


def test_rest_savepoints_are_triggered_awaited_and_imported(
    flink_cluster: Cluster, catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeeper_airflow.flink import FlinkSavepointOperator

    from state_engine.flink.import_job import import_flink
    from state_engine.verify import verify

    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("AIRFLOW_CONN_FLINK_DEFAULT", flink_cluster.rest)
    reports = []
    for fmt in ("CANONICAL", "NATIVE"):
        op = FlinkSavepointOperator(
            task_id=f"savepoint_{fmt.lower()}",
            flink_job_id=flink_cluster.job_id,
            job="sql-agg",
            format_type=fmt,
            import_paths=[str(flink_cluster.savepoints)],
            poll_interval=0.5,
            max_polls=int(STARTUP_S / 0.5),
        )
        reports.append(op.execute({}))
    locations = [r["location"] for r in reports]
    assert all(loc.startswith("file:") and "savepoint-" in loc for loc in locations)
    with Catalog.open(catalog_url) as catalog:
        snaps = {s.location.rstrip("/"): s for s in catalog.list_snapshots("sql-agg")}
        for loc, fmt in zip(locations, ("CANONICAL", "NATIVE"), strict=True):
            snap = snaps["file://" + loc.removeprefix("file:").rstrip("/")]
            assert (snap.kind, snap.format, snap.status) == ("SAVEPOINT", fmt, "COMPLETED")
            assert snap.parallelism == 2 and snap.max_parallelism == 128
        # the job's retained checkpoints import and verify too, once it is cancelled (a running
        # job subsumes checkpoints at any moment)
        cancel = urllib.request.Request(
            f"{flink_cluster.rest}/jobs/{flink_cluster.job_id}?mode=cancel", method="PATCH"
        )
        urllib.request.urlopen(cancel, timeout=10).close()  # noqa: S310
        _until(
            "the job cancelled",
            lambda: (
                _get(f"{flink_cluster.rest}/jobs/{flink_cluster.job_id}")["state"] == "CANCELED"
            ),
            flink_cluster.checkpoints,
        )
        report = import_flink(catalog, [str(flink_cluster.checkpoints)], "sql-agg-checkpoints")
        assert report.added and all(a["kind"] == "CHECKPOINT" for a in report.added)
        for job in ("sql-agg", "sql-agg-checkpoints"):
            result = verify(catalog, job)
            errors = [f for f in result.findings if f.level == "ERROR"]
            assert errors == [], result.render()
