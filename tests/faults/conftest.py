"""Fault-injection fixtures, and the figure printed at the end of the session: crash points
tried and failures."""

from __future__ import annotations

import pytest

_TRIED: dict[str, str] = {}  # test id -> outcome, for the crash-point tests only


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "crash_point(name): a fault-injection test of one crash point (counted)"
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "crash_point" not in report.keywords:
        return
    # a failure in setup or teardown counts as that crash point failing, and stays counted
    counts = report.when == "call" or report.outcome != "passed"
    if counts and _TRIED.get(report.nodeid) != "failed":
        _TRIED[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TRIED:
        return
    failed = sorted(n for n, outcome in _TRIED.items() if outcome == "failed")
    skipped = sum(1 for outcome in _TRIED.values() if outcome == "skipped")
    tried = len(_TRIED) - skipped
    terminalreporter.section("fault injection")
    terminalreporter.write_line(
        f"crash points tried: {tried}, failures: {len(failed)}"
        + (f", skipped: {skipped}" if skipped else "")
    )
    for nodeid in failed:
        terminalreporter.write_line(f"  FAILED {nodeid}")
