"""Run a command as a process group that Ctrl-C stops whole: ``python tools/run_group.py CMD...``.

The command starts in a session of its own, so the terminal's SIGINT reaches only this wrapper.
On SIGINT, SIGTERM or SIGHUP the wrapper sends SIGTERM to the command's whole process group and
to every other descendant (one that started a session of its own too), waits up to
``RUN_GROUP_GRACE`` seconds (default 5) for them to exit, then sends SIGKILL to what is left. On
Linux the wrapper is a child subreaper: descendants whose parent died are reparented to it and
reaped here, so none stays behind as a zombie. It returns once none of them is left, with the
command's exit code (128 + signal when it was stopped).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    """Collect every child that has exited (orphans included, as a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants() -> set[int]:
    """The live (not zombie) processes below this one, from /proc (empty where there is none)."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    # pid (comm) state ppid ...: comm may hold spaces, the last ')' ends it
                    state, ppid = fh.read().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z":
                parents.setdefault(int(ppid), []).append(int(entry))
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for pid in parents.get(todo.pop(), []):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pgid: int, sig: int) -> None:
    for pid in _descendants():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM to group ``pgid`` and every descendant, SIGKILL after ``grace`` seconds; returns
    when none is left."""
    _signal_all(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = False
    while True:
        _reap()
        if not _group_alive(pgid) and not _descendants():
            return
        if not killed and time.monotonic() >= deadline:
            _signal_all(pgid, signal.SIGKILL)
            killed = True
        elif killed:
            _signal_all(pgid, signal.SIGKILL)  # one forked since
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: run_group.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    grace = float(os.environ.get("RUN_GROUP_GRACE", "5"))
    _become_subreaper()
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    try:
        child = subprocess.Popen(argv, start_new_session=True)
    except OSError as exc:
        print(f"run_group.py: cannot start {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    pgid = child.pid  # the leader of its new session and group
    while child.poll() is None and not stopping:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)
    stop_group(pgid, grace)  # also what the command left behind when it exited by itself
    child.wait()
    if stopping:
        return 128 + stopping[0]
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
