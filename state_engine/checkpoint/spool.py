"""A local stand-in for an object-store snapshot directory, for the forked snapshot writer.

A heap snapshot's files are written by a child forked at the barrier (see ``forked``), but a
child must not use an object store: its client runs an event-loop thread of the parent's, which
does not exist in the child. So the child writes the snapshot into a :class:`Spool` instead, a
local directory with the same snapshot-relative layout (``../shared/`` files included), and the
parent's checkpoint thread uploads each file afterwards. Uploading is network I/O that leaves the
GIL to the task thread; producing the rows, which holds it, stays in the child.

Each upload goes through :meth:`SnapshotDir.write_file`, so it is as exclusive as any snapshot
file (never overwrites) and its size and CRC32 are checked against what the child wrote. The
spool lives under the system's temporary directory (``TMPDIR``) until the upload ends.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from state_engine.errors import CheckpointError
from state_engine.snapshot.metadata import SnapshotFile
from state_engine.snapshot.storage import SnapshotDir, SnapshotFileWriter

_CHUNK = 4 << 20


def spool_for(target: SnapshotDir) -> Spool | None:
    """Where a forked child writes ``target``'s files: a spool for an object store, None for
    local storage (the child writes the snapshot directory itself)."""
    return None if target.store.is_local else Spool(target)


class Spool:
    """A local directory laid out as ``target``'s job directory (``<root>/job/<snapshot>``)."""

    def __init__(self, target: SnapshotDir) -> None:
        self.target = target
        self.root = tempfile.mkdtemp(prefix="statekeeper-spool-")
        name = posixpath.basename(target.path.rstrip("/")) or "snapshot"
        # a scratch copy: the upload is what must last, so nothing here is flushed to the disk
        self.snapshot = SnapshotDir.from_url(
            (Path(self.root) / "job" / name).as_uri(),
            allow_shared=target.allow_shared,
            durable=False,
        )

    def upload(self, files: Iterable[SnapshotFile], check: Callable[[], None]) -> None:
        """Copy ``files`` (written into the spool) to the target snapshot directory; ``check``
        runs before each one (it raises once the snapshot is cancelled)."""
        for f in files:
            check()
            with self.snapshot.open_input(f.path) as src:

                def copy(out: SnapshotFileWriter) -> None:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)

                info = self.target.write_file(f.path, copy)
            if (info.size, info.checksum) != (f.size, f.checksum):
                raise CheckpointError(
                    f"snapshot file {f.path!r} arrived in {self.target.url} as {info.size} bytes "
                    f"(checksum {info.checksum}), but {f.size} bytes ({f.checksum}) were written; "
                    "nothing of the snapshot is kept: trigger a new one"
                )

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
