"""``crash_point``: off unless armed; ``name:N`` kills on the N-th hit; bad specs are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from state_engine import faults
from state_engine.errors import InvalidCrashPoint

PROGRAM = """
import sys
from state_engine.faults import crash_point
for i in range(1, 4):
    crash_point("other")
    crash_point("here")
    print("passed", i, flush=True)
"""


def _run(spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV_VAR}
    if spec is not None:
        env[faults.ENV_VAR] = spec
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60
    )


def test_off_by_default() -> None:
    done = _run(None)
    assert done.returncode == 0 and done.stdout.split("\n")[:3] == [
        "passed 1",
        "passed 2",
        "passed 3",
    ]


def test_the_nth_hit_sigkills_the_process() -> None:
    done = _run("unrelated, here:2")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["passed 1"]
    assert "crash point here (hit 2): SIGKILL" in done.stderr


def test_parse() -> None:
    assert faults.parse("a, b:3,,") == {"a": 1, "b": 3}
    assert faults.parse("") == {}
    for bad in ("a:0", "a:x", ":2", "a:"):
        with pytest.raises(InvalidCrashPoint, match="name:N"):
            faults.parse(bad)


def test_a_pause_point_waits_for_its_release_file(tmp_path) -> None:
    program = (
        "from state_engine.faults import pause_point\n"
        "pause_point('other')\n"
        "pause_point('here')\n"
        "print('released', flush=True)\n"
    )
    env = {**os.environ, faults.PAUSE_ENV_VAR: "here", faults.PAUSE_DIR_ENV_VAR: str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True
    )
    reached = tmp_path / f"here.{proc.pid}.reached"
    while not reached.exists():  # the event: the child is at the point
        assert proc.poll() is None, "the child ended before reaching its pause point"
        time.sleep(0.02)
    assert proc.poll() is None  # it waits ...
    (tmp_path / "here.release").touch()
    out, _ = proc.communicate(timeout=120)  # ... until released
    assert proc.returncode == 0 and out == "released\n"


def test_every_pause_point_is_registered_where_it_is() -> None:
    import importlib
    import inspect

    for name, module in faults.PAUSE_POINTS.items():
        assert f'pause_point("{name}")' in inspect.getsource(importlib.import_module(module))
