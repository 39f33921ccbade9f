"""tools/run_group.py, the wrapper `make airflow` runs `airflow standalone` in: on SIGINT it stops
the whole process tree (a child ignoring SIGTERM, a grandchild in a session of its own, an orphan
whose parent died) and returns only when no process of it is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "tools" / "run_group.py"

#: A tree like airflow standalone's: a parent with children, one of which does not stop on
#: SIGTERM, one that left the group (its own session), one orphaned by its dead parent.
TREE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    sleeper = "import time; time.sleep(600)"
    pids = [os.getpid()]
    pids.append(subprocess.Popen([sys.executable, "-c", stubborn]).pid)
    pids.append(subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True).pid)
    # a middle process that starts a sleeper and exits: the sleeper is orphaned
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(600)'], stdout=subprocess.DEVNULL).pid)"],
        stdout=subprocess.PIPE, text=True)
    pids.append(int(middle.communicate()[0]))
    with open(out + ".tmp", "w") as fh:
        fh.write(" ".join(map(str, pids)))
    os.rename(out + ".tmp", out)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it holds no resources but its entry)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the tree wrote its pids (once every process started): a generous bound only."""
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, "the wrapper exited before the tree started"
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the process tree did not start")
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_leaves_no_process_of_the_tree(tmp_path: Path, stop: signal.Signals) -> None:
    pids_file = tmp_path / "pids"
    proc = subprocess.Popen(
        [sys.executable, str(WRAPPER), sys.executable, "-c", TREE, str(pids_file)],
        env={**os.environ, "RUN_GROUP_GRACE": "1"},
    )
    wait_for(pids_file, proc)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 4 and all(alive(p) for p in pids)

    proc.send_signal(stop)
    code = proc.wait(timeout=60)  # a generous bound: the grace is 1 s

    assert code == 128 + stop
    assert [p for p in pids if alive(p)] == []


def test_the_command_exit_code_comes_back_and_leftovers_are_stopped(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(600)'], stdout=subprocess.DEVNULL).pid, flush=True); "
        "sys.exit(3)"
    )
    done = subprocess.run(
        [sys.executable, str(WRAPPER), sys.executable, "-c", script],
        capture_output=True, text=True, env={**os.environ, "RUN_GROUP_GRACE": "1"}, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 3
    assert not alive(int(done.stdout.strip()))


def test_a_missing_command_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(WRAPPER), str(REPO / "no-such-command")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1 and "cannot start" in done.stderr
