"""`make airflow` on the embedded defaults: loopback only unless asked, task slots sized to the
machine, DAGs unpaused, and a banner that says so (read from `make -n`, nothing is started)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dry_run(*variables: str) -> str:
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "airflow", *variables],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def setting(out: str, name: str) -> str:
    found = re.findall(rf"\b{name}=(\S+)", out.splitlines()[-1])
    assert len(found) == 1, (name, out.splitlines()[-1])
    return found[0]


@pytest.mark.skipif(not (REPO / "Makefile").is_file(), reason="no Makefile")
def test_airflow_binds_loopback_with_sane_workers_and_unpaused_dags() -> None:
    out = dry_run()
    assert out.splitlines()[-1].rstrip().endswith("airflow standalone")
    assert setting(out, "AIRFLOW__API__HOST") == "127.0.0.1"
    assert setting(out, "AIRFLOW__API__WORKERS") == "1"
    slots = int(setting(out, "AIRFLOW__CORE__PARALLELISM"))
    assert 1 <= slots <= min(8, os.cpu_count() or 1)
    assert setting(out, "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION") == "False"
    assert "airflow dags unpause statekeeper_maintenance" in out  # the banner says how

    wide = dry_run("AIRFLOW_HOST=0.0.0.0", "AIRFLOW_WORKERS=3", "AIRFLOW_PORT=8090")
    assert setting(wide, "AIRFLOW__API__HOST") == "0.0.0.0"
    assert setting(wide, "AIRFLOW__CORE__PARALLELISM") == "3"
    assert setting(wide, "AIRFLOW__API__PORT") == "8090"
