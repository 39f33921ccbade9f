"""The asynchronous phase of a heap snapshot in a forked child process.

A heap snapshot's files are written by Python code (rows encoded, columns built) that holds the
GIL: on the checkpoint thread it competes with the task thread, and the job slows down by about
what the snapshot costs. Instead the task thread forks at the checkpoint barrier: the child holds
the state exactly as it was (copy-on-write pages, as Redis' BGSAVE does), writes the files on
another core and sends back what it wrote, while the parent's checkpoint thread waits on a pipe
without the GIL and then commits. The copy-on-write view is released at once, so the task thread
copies no state slot on its next writes either.

Only for views that are plain Python objects (the heap backend's; a RocksDB handle and its
background threads do not survive a fork) and for storage the child writes to the same place as
the parent: local files, or an object store through a local spool the parent uploads afterwards
(``checkpoint.spool``: the child never uses the store's client, whose event-loop thread stays in
the parent). ``memory://`` would stay in the child. Linux only: elsewhere fork is unsafe in a
process with threads.

The child reports every file it opens before it creates it, so a child that fails, dies or is
cancelled (SIGKILL) leaves nothing the parent does not know about and remove.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import struct
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from state_engine.collector import hold_frozen, release_frozen
from state_engine.errors import CheckpointError
from state_engine.snapshot.storage import SnapshotDir

T = TypeVar("T")

_HEADER = struct.Struct("!cI")
_OPENED, _RESULT, _ERROR = b"O", b"R", b"E"
#: How often the waiting parent looks at the cancellation flag (seconds).
_POLL_S = 0.05


class SnapshotWriterDied(CheckpointError):
    """The child process writing a snapshot's files ended without a result (killed, crashed)."""


def can_fork(snapshot: SnapshotDir) -> bool:
    """Whether files of ``snapshot`` may be written by a forked child (see the module doc): on
    local storage directly, on an object store through ``checkpoint.spool.spool_for``."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    return snapshot.store.is_local or snapshot.store.is_object_store


class ForkedWrite(Generic[T]):
    """``work(report_opened)`` started in a forked child now; :meth:`wait` for its result.

    ``work`` calls ``report_opened(path)`` before it creates a file; each path reaches the
    ``opened`` callback of :meth:`wait` (or :meth:`kill`) in this process. The child's result must
    pickle; its exception is raised by :meth:`wait`.
    """

    def __init__(self, work: Callable[[Callable[[str], None]], T]) -> None:
        reap_exited()  # the writers of earlier snapshots that have exited by now
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork in a threaded process; the child only runs `work`
            # (pure Python and Arrow over the view) and then _exit()s.
            warnings.simplefilter("ignore", DeprecationWarning)
            # the collector must not touch (and so copy) every page while the child runs
            hold_frozen()
            try:
                pid = os.fork()
            except BaseException:
                release_frozen()
                os.close(read_fd)
                os.close(write_fd)
                raise
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            _child(work, read_fd, write_fd)
        os.close(write_fd)
        self.pid = pid
        self._fd: int | None = read_fd
        self._buffer = bytearray()
        self._outcome: tuple[bytes, bytes] | None = None
        self._status: int | None = None

    def wait(self, *, cancelled: Callable[[], bool], opened: Callable[[str], None]) -> T | None:
        """The child's result; None if ``cancelled()`` (polled) turned true and it was killed.

        Returns as soon as the result arrives: the child then only exits, and unmapping its copy
        of this process' memory takes milliseconds a checkpoint need not wait for. It is reaped
        by :func:`reap_exited` (at the next fork, or when the owner closes).
        """
        while self._fd is not None and self._outcome is None:
            if cancelled():
                self.kill(opened)
                return None
            ready, _, _ = select.select([self._fd], [], [], _POLL_S)
            if ready and not self._read(opened):
                self._reap()
        if self._fd is not None:
            with _exiting_lock:
                _exiting.append(self)
        return self._result()

    def kill(self, opened: Callable[[str], None] | None = None) -> None:
        """Stop the child (SIGKILL) and reap it; the paths it reported reach ``opened``."""
        if self._fd is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        # what the child wrote before it died is still in the pipe
        self._drain_and_reap(opened or (lambda path: None))

    def _drain_and_reap(self, opened: Callable[[str], None]) -> None:
        """Read the pipe to its end (blocking until the child has exited), then reap it."""
        while self._read(opened):
            pass
        self._reap()

    def _read(self, opened: Callable[[str], None]) -> bool:
        """Read what the pipe holds (blocking until something); False at its end."""
        assert self._fd is not None
        chunk = os.read(self._fd, 1 << 20)
        if not chunk:
            return False
        self._buffer += chunk
        while len(self._buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
            del self._buffer[: _HEADER.size + size]
            if kind == _OPENED:
                opened(payload.decode())
            else:
                self._outcome = (kind, payload)
        return True

    def _reap(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        try:
            _, self._status = os.waitpid(self.pid, 0)
        finally:
            release_frozen()

    def _result(self) -> T:
        if self._outcome is None:
            raise SnapshotWriterDied(
                f"the process writing the snapshot's files (pid {self.pid}) ended without a "
                f"result ({_describe(self._status)}); nothing of the snapshot is kept: trigger a "
                "new one"
            )
        kind, payload = self._outcome
        if kind == _RESULT:
            result: T = pickle.loads(payload)  # the child pickled the writer's T
            return result
        exc, text = pickle.loads(payload)
        if exc is None:
            raise SnapshotWriterDied(f"writing the snapshot's files failed:\n{text}")
        exc.add_note(f"raised in the snapshot writer process (pid {self.pid}):\n{text}")
        raise exc


def run_forked(
    work: Callable[[Callable[[str], None]], T],
    *,
    cancelled: Callable[[], bool],
    opened: Callable[[str], None],
) -> T | None:
    """:class:`ForkedWrite` started and waited for (None once cancelled)."""
    return ForkedWrite(work).wait(cancelled=cancelled, opened=opened)


#: children whose result arrived and that are still exiting (see ForkedWrite.wait)
_exiting: list[ForkedWrite[Any]] = []
_exiting_lock = threading.Lock()


def reap_exited(*, block: bool = False) -> None:
    """Reap the children whose result arrived once they have exited (all of them with
    ``block``: waiting for each to exit). Their pipes carry nothing after the result: readable
    means closed."""
    with _exiting_lock:
        pending = list(_exiting)
        _exiting.clear()
    left = []
    for child in pending:
        fd = child._fd
        if fd is None:
            continue
        if block or select.select([fd], [], [], 0)[0]:
            child._drain_and_reap(lambda path: None)
        else:
            left.append(child)
    if left:
        with _exiting_lock:
            _exiting.extend(left)


def _child(work: Callable[[Callable[[str], None]], object], read_fd: int, write_fd: int) -> None:
    try:
        os.close(read_fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
        # short-lived and exits without cleanup: a collection here would only copy the pages
        # it walks (the parent's objects it shares)
        gc.disable()

        def send(kind: bytes, payload: bytes) -> None:
            data = _HEADER.pack(kind, len(payload)) + payload
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]

        try:
            result = work(lambda path: send(_OPENED, path.encode()))
            send(_RESULT, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            send(_ERROR, _pickled_error(exc))
    finally:
        os._exit(0)  # no atexit handlers, no flushing of the parent's buffers


def _pickled_error(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        payload = pickle.dumps((exc, text), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # an exception type that pickles but cannot be rebuilt
        return payload
    except Exception:  # noqa: BLE001
        return pickle.dumps((None, text), protocol=pickle.HIGHEST_PROTOCOL)


def _describe(status: int | None) -> str:
    if status is None:
        return "status unknown"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
