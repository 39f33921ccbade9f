"""On a local disk a completed snapshot survives a power loss: every data file and every new
directory's entry are flushed to the disk before ``_metadata`` is linked in, and the link itself
is flushed after. (A process crash never needed this: the page cache outlives the process.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint.manager import CheckpointManager
from state_engine.checkpoint.spool import Spool
from state_engine.snapshot.canonical import CanonicalWriter
from state_engine.snapshot.metadata import read_metadata
from state_engine.snapshot.storage import CheckpointStorage, SnapshotDir
from state_engine.state.meta import StateEntry
from tests.checkpoint.jobstate import MAX_P, add_operator_state, apply, close, make_job

Events = list[tuple[str, str]]


@pytest.fixture
def disk_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Events]:
    """Every ``fsync`` (by the path its descriptor names) and ``link`` of this process, in
    order, as ``("fsync", path)`` and ``("link", target)``."""
    events: Events = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def link(src: str, dst: str, *args: object, **kwargs: object) -> None:
        real_link(src, dst, *args, **kwargs)  # type: ignore[arg-type]
        events.append(("link", os.path.realpath(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    yield events


def _rows() -> list[StateEntry]:
    return [
        StateEntry(kg, kg * 7, f"k{kg}".encode(), b"", "count", None, b"\x01", None)
        for kg in range(8)
    ]


def _flushed_before_link(events: Events, metadata: str) -> set[str]:
    link = events.index(("link", metadata))
    return {path for kind, path in events[:link] if kind == "fsync"}


def _require_linux_proc() -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name what a descriptor flushed")


def test_a_local_snapshot_is_on_the_disk_before_its_metadata_names_it(
    tmp_path: Path, disk_events: Events
) -> None:
    _require_linux_proc()
    root = tmp_path / "ckpt"
    storage = CheckpointStorage(root.as_uri())
    snap = storage.checkpoint("orders", 1)
    with CanonicalWriter(snap, subtask=0, max_parallelism=8) as w:
        w.write(_rows())
    data = snap.write_file("../shared/sst-1", b"shared bytes")
    snap.commit_metadata(b"metadata")

    chk = root / "orders" / "chk-1"
    metadata = str(chk / "_metadata")
    flushed = _flushed_before_link(disk_events, metadata)
    files = [str(p) for p in chk.iterdir() if p.name != "_metadata"] + [
        str(root / "orders" / "shared" / "sst-1")
    ]
    assert data.size == len(b"shared bytes")
    assert len(files) == 2 and set(files) <= flushed, (files, flushed)
    # each new directory's entry (tmp_path existed: ckpt, orders, chk-1 and shared are new)
    for new_dir in (root, root / "orders", chk, root / "orders" / "shared"):
        assert str(new_dir.parent) in flushed, new_dir
    # and the new name itself, after the link
    link = disk_events.index(("link", metadata))
    assert ("fsync", str(chk)) in disk_events[link + 1 :]


@pytest.mark.parametrize("fmt", ["canonical", "delta"])
def test_every_file_a_checkpoints_metadata_names_was_flushed_first(
    catalog: Catalog, tmp_path: Path, disk_events: Events, fmt: str
) -> None:
    _require_linux_proc()
    storage = CheckpointStorage((tmp_path / "ckpt").as_uri())
    subtasks = make_job("heap", tmp_path / "heap", 2, track_changes=True)
    keys = [f"k{i}" for i in range(30)]
    try:
        # the thread writes the files, in this process, where each fsync is seen
        with CheckpointManager(
            catalog, storage, "durable", max_parallelism=MAX_P, parallelism=2, format=fmt,
            fork_writer=False,
        ) as manager:  # fmt: skip
            records = []
            for round_ in range(3):
                apply(subtasks, keys, round_)
                add_operator_state(subtasks, str(round_))
                records.append(manager.trigger(subtasks).result())
        for record in records:
            snap_dir = storage.snapshot(record.location)
            metadata = os.path.realpath(snap_dir.metadata_path)
            flushed = _flushed_before_link(disk_events, metadata)
            named = {
                os.path.realpath(snap_dir.resolve(f.path)) for f in read_metadata(snap_dir).files
            }
            assert named and named <= flushed, named - flushed
    finally:
        close(subtasks)


def test_a_spool_is_scratch_and_flushes_nothing(tmp_path: Path, disk_events: Events) -> None:
    _require_linux_proc()
    target = SnapshotDir.from_url((tmp_path / "target" / "chk-1").as_uri())
    spool = Spool(target)
    try:
        spool.snapshot.write_file("part-1", b"spooled")
        assert not [path for kind, path in disk_events if path.startswith(spool.root)]
    finally:
        spool.remove()


def test_a_snapshot_directory_made_by_someone_else_gets_its_name_flushed_at_commit(
    tmp_path: Path, disk_events: Events
) -> None:
    """A rescale's spill or a retry may have made the directory already: the commit flushes
    its entry in the parent too."""
    _require_linux_proc()
    root = tmp_path / "ckpt"
    (root / "orders" / "chk-2" / "_spill").mkdir(parents=True)
    snap = CheckpointStorage(root.as_uri()).checkpoint("orders", 2)
    snap.write_file("data", b"rows")
    snap.commit_metadata(b"metadata")
    link = disk_events.index(("link", str(root / "orders" / "chk-2" / "_metadata")))
    after = disk_events[link + 1 :]
    assert ("fsync", str(root / "orders" / "chk-2")) in after
    assert ("fsync", str(root / "orders")) in after
