"""Named crash points: where the fault-injection suite kills a process to prove recovery.

Pause points (:func:`pause_point`) are their companion for tests that must act *while* a
process is at a known place (kill a Spark worker while its tasks run): armed by
``STATEKEEPER_PAUSE_AT=name`` and ``STATEKEEPER_PAUSE_DIR=dir``, a process reaching the point
creates ``dir/name.<pid>.reached`` and waits until ``dir/name.release`` exists.

``crash_point(name)`` does nothing unless the environment variable ``STATEKEEPER_CRASH_AT``
names it when this module is imported. Then the process SIGKILLs itself on the spot, as a power
cut or an OOM kill would: no ``finally``, no ``atexit``, no flush. The value is a comma-separated
list of ``name`` (crash on the first hit) or ``name:N`` (crash on the N-th hit in this process).

The environment is read once at import, so a disabled crash point costs one set lookup.
"""

from __future__ import annotations

import os
import signal
import sys

from state_engine.errors import InvalidCrashPoint

ENV_VAR = "STATEKEEPER_CRASH_AT"
PAUSE_ENV_VAR = "STATEKEEPER_PAUSE_AT"
PAUSE_DIR_ENV_VAR = "STATEKEEPER_PAUSE_DIR"

#: Every crash point the engine has, by the module that holds it. Adding one to the code means
#: adding it here too; the fault suite checks both agree.
CRASH_POINTS: dict[str, str] = {
    "checkpoint.after_data_files": "state_engine.checkpoint.manager",
    "checkpoint.after_attach": "state_engine.checkpoint.manager",
    "checkpoint.after_complete": "state_engine.checkpoint.manager",
    "commit.after_metadata": "state_engine.checkpoint.commit",
    "checkpoint.during_release": "state_engine.checkpoint.manager",
    "checkpoint.native.after_shared_upload": "state_engine.backends.rocksdb.snapshot",
    "checkpoint.delta.after_write": "state_engine.backends.heap.snapshot",
    "compaction.after_tasks": "state_engine.jobs.compaction",
    "compaction.after_complete": "state_engine.jobs.compaction",
    "savepoint.after_tasks": "state_engine.jobs.savepoint",
    "rescale.after_spill": "state_engine.jobs.rescale",
    "rescale.after_write": "state_engine.jobs.rescale",
    "rescale.after_complete": "state_engine.jobs.rescale",
    "expire.after_discard": "state_engine.jobs.expire",
    "orphan_cleanup.after_delete": "state_engine.jobs.orphan_cleanup",
    "deletion.after_forget": "state_engine.maintenance.deletion",
    "deletion.after_delete_one": "state_engine.maintenance.deletion",
    "flink.import.after_attach": "state_engine.flink.import_job",
    "flink.import.after_commit": "state_engine.flink.import_job",
    "flink.expire.after_discard": "state_engine.flink.retention",
    "flink.orphan_cleanup.after_delete": "state_engine.flink.retention",
}

#: Every pause point, by the module that holds it (see the module docstring).
PAUSE_POINTS: dict[str, str] = {
    "spark.task.started": "state_engine.jobs.canonical_write",
}


def parse(spec: str) -> dict[str, int]:
    """``"a,b:3"`` -> ``{"a": 1, "b": 3}``; raises InvalidCrashPoint on a malformed entry."""
    armed: dict[str, int] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, nth = item.partition(":")
        name = name.strip()
        if not name or (sep and not nth.strip().isdigit()) or (sep and int(nth) < 1):
            raise InvalidCrashPoint(
                f"{ENV_VAR} entry {item!r} is not 'name' or 'name:N' with N >= 1; "
                f"e.g. {ENV_VAR}=commit.after_metadata:2"
            )
        armed[name] = int(nth) if sep else 1
    return armed


_ARMED: dict[str, int] = parse(os.environ.get(ENV_VAR, ""))
_HITS: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here if ``STATEKEEPER_CRASH_AT`` armed ``name`` (see module doc)."""
    if name not in _ARMED:
        return
    hits = _HITS.get(name, 0) + 1
    _HITS[name] = hits
    if hits < _ARMED[name]:
        return
    # One line on stderr so a test that sees the kill can tell which point fired; flushed now
    # because SIGKILL flushes nothing.
    sys.stderr.write(f"statekeeper: crash point {name} (hit {hits}): SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


_PAUSES = frozenset(p.strip() for p in os.environ.get(PAUSE_ENV_VAR, "").split(",") if p.strip())


def pause_point(name: str) -> None:
    """Wait here, if armed, until the test releases the point (see the module docstring)."""
    if name not in _PAUSES:
        return
    import time
    from pathlib import Path

    folder = Path(os.environ[PAUSE_DIR_ENV_VAR])
    (folder / f"{name}.{os.getpid()}.reached").touch()
    release = folder / f"{name}.release"
    while not release.exists():  # an event from the test: a file appears
        time.sleep(0.05)


def armed() -> dict[str, int]:
    """The crash points this process was started with (name -> hit that kills)."""
    return dict(_ARMED)
