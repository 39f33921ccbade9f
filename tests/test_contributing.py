"""What CONTRIBUTING.md promises about the tooling holds: pre-commit runs the ruff that
`make lint` runs, and `make test-fast` leaves out exactly the markers it names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pinned_ruff() -> str:
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [d for d in dev["dev"] if d.startswith("ruff==")]
    return pin.removeprefix("ruff==")


def test_pre_commit_runs_ruff_check_and_format_at_the_pinned_version() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    [ruff] = [r for r in config["repos"] if r["repo"].endswith("/ruff-pre-commit")]
    assert ruff["rev"] == "v" + _pinned_ruff()
    assert {h["id"] for h in ruff["hooks"]} == {"ruff-check", "ruff-format"}


def test_the_fast_loop_leaves_out_the_markers_contributing_names() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [expr] = re.findall(r"^FAST_MARKERS\s*:?=\s*(.+)$", makefile, re.MULTILINE)
    left_out = set(re.findall(r"not (\w+)", expr))
    registered = {
        m.split(":", 1)[0]
        for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
            "ini_options"
        ]["markers"]
    }
    assert left_out <= registered
    assert {"slow", "spark", "flink", "cluster", "browser", "dag_run"} <= left_out
    guide = (ROOT / "CONTRIBUTING.md").read_text()
    assert all(f"not {m}" in guide for m in left_out)
