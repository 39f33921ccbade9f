"""The demo's Airflow: the ``airflow`` command line of this installation, run as subprocesses.

``state_engine`` never imports airflow; the demo drives the DAGs in ``dags/`` the way a user
would, with ``airflow dags test DAG -c CONF``, on the embedded defaults ``make airflow`` uses
(an Airflow home under ``$STATEKEEPER_HOME/airflow`` on SQLite, this checkout's ``dags/`` and
``plugins/``), so the runs show up in the UI afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state_engine.config import Settings
from state_engine.errors import StatekeeperError

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"

_DAGRUN_FINISHED = re.compile(r"DagRun Finished: dag_id=(?P<dag>[^,]+),.*?run_id=(?P<run>[^,]+),")
_DAGRUN_STATE = re.compile(r"DagRun Finished:.*?, state=(?P<state>\w+)")
_SKIPPED = re.compile(r"Skipping task\..*?reason='(?P<reason>[^']*)'")


class DemoAirflowError(StatekeeperError):
    """An Airflow step of the demo did not succeed."""


@dataclass
class DagTest:
    """One ``airflow dags test`` run as the demo saw it."""

    dag_id: str
    conf: dict[str, Any]
    returncode: int
    seconds: float
    log: Path
    run_id: str | None = None
    state: str | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and self.state == "success"


def airflow_bin() -> Path:
    """The ``airflow`` next to this interpreter (the venv's), else the one on PATH."""
    local = Path(sys.executable).with_name("airflow")
    if local.exists():
        return local
    found = shutil.which("airflow")
    if found is None:
        raise DemoAirflowError(
            "the demo needs the airflow command of this installation, found none next to "
            f"{sys.executable} nor on PATH: run `make install`"
        )
    return Path(found)


def airflow_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every ``airflow`` subprocess: the same settings as ``make airflow``.

    Inherited ``AIRFLOW_*`` variables are dropped: the demo runs on the embedded defaults, and an
    outer Airflow's database or log level (a test session's, say) must not leak into it.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for name in list(env):
        if name == "AIRFLOW_HOME" or name.startswith("AIRFLOW__"):
            del env[name]
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "AIRFLOW_HOME": str(settings.home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # the demo reads the run's final state from the INFO line "DagRun Finished"
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "STATEKEEPER_HOME": str(settings.home),
            "STATEKEEPER_CATALOG_URL": settings.catalog_url,
            "STATEKEEPER_CHECKPOINT_ROOT": settings.checkpoint_root,
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        }
    )
    return env


class AirflowCli:
    """``airflow db migrate`` and ``airflow dags test`` for the demo, logs kept in ``log_dir``."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        *,
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        if not (DAGS / "statekeeper_maintenance.py").exists():
            raise DemoAirflowError(
                f"the demo runs the DAGs of a source checkout and found none in {DAGS}: run it "
                "from the repository (`make demo`)"
            )
        self.settings = settings
        self.log_dir = log_dir
        self.env = airflow_env(settings)
        self.airflow = airflow_bin()
        self.on_tick = on_tick

    @property
    def home(self) -> Path:
        return Path(self.env["AIRFLOW_HOME"])

    def _run(self, args: list[str], log: Path) -> tuple[int, float]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with log.open("w", encoding="utf-8") as out:
            proc = subprocess.Popen(
                [str(self.airflow), *args],
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            while True:
                try:
                    # waiting with a timeout only paces the elapsed-time display on a terminal
                    code = proc.wait(timeout=0.5 if self.on_tick else None)
                    break
                except subprocess.TimeoutExpired:
                    if self.on_tick is not None:
                        self.on_tick(time.perf_counter() - started)
        return code, time.perf_counter() - started

    def migrate(self) -> float:
        log = self.log_dir / "airflow-db-migrate.log"
        code, seconds = self._run(["db", "migrate"], log)
        if code != 0:
            raise DemoAirflowError(
                f"`airflow db migrate` of {self.home} failed (exit {code}): see {log}" + _tail(log)
            )
        return seconds

    def dags_test(self, dag_id: str, conf: Mapping[str, Any]) -> DagTest:
        log = self.log_dir / f"{dag_id}.log"
        code, seconds = self._run(["dags", "test", dag_id, "-c", json.dumps(dict(conf))], log)
        result = DagTest(dag_id, dict(conf), code, seconds, log)
        text = log.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            finished = _DAGRUN_FINISHED.search(line)
            if finished and finished.group("dag") == dag_id:
                result.run_id = finished.group("run")
                state = _DAGRUN_STATE.search(line)
                result.state = state.group("state") if state else None
            skipped = _SKIPPED.search(line)
            if skipped:
                result.skipped.append(skipped.group("reason"))
        return result


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n  | " + "\n  | ".join(text[-lines:])


def failure_message(test: DagTest, detail: str = "") -> str:
    """Why a DAG's run is not a success, with the end of its log."""
    what = f"exit {test.returncode}, " + (
        f"dag run state {test.state}" if test.state else "no 'DagRun Finished' line in its log"
    )
    return (
        f"`airflow dags test {test.dag_id}` did not succeed ({what}){detail}; "
        f"full log: {test.log}" + _tail(test.log)
    )
