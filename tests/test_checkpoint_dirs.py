"""One rule for "is this a checkpoint's directory", the same for every caller.

Flink writes ``chk-`` and the checkpoint id in decimal, so a checkpoint directory's name has one
spelling; every place that asks (Statekeeper's snapshot paths, the rescale's reuse of earlier
checkpoints' files, the Flink reader, import and retention) must answer as the table says.
"""

from __future__ import annotations

import os
import posixpath
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fsspec
import pytest

from state_engine.checkpoint_dirs import checkpoint_dir_name, checkpoint_id_of, is_checkpoint_dir
from state_engine.errors import InvalidSnapshotPath, SnapshotNotUsable
from state_engine.flink import layout
from state_engine.flink.metadata import FILE, PathResolver, StreamHandle, metadata_from_bytes
from state_engine.snapshot.metadata import FileKind, SnapshotFile
from state_engine.snapshot.storage import SnapshotDir, normalize_relative

#: name -> the checkpoint id it stands for (None: not a checkpoint's directory)
NAMES: dict[str, int | None] = {
    "chk-0": 0,
    "chk-1": 1,
    "chk-42": 42,
    "chk-9223372036854775807": 2**63 - 1,  # Flink's largest (a Java long)
    "chk-01": None,  # a leading zero: Flink never writes one
    "chk-00": None,
    "chk-": None,
    "chk-1a": None,
    "chk-1.bak": None,
    "chk-1-copy": None,
    "chk--1": None,
    "chk-+1": None,
    "chk- 1": None,
    "chk-1 ": None,
    " chk-1": None,
    "chk-1\n": None,  # `^chk-(\d+)$` took this one: `$` matches before a final newline
    "chk-\u0661": None,  # ARABIC-INDIC DIGIT ONE: a digit to `\d` and str.isdigit
    "chk-\u00b2": None,  # SUPERSCRIPT TWO: str.isdigit, but int() refuses it
    "CHK-1": None,
    "Chk-1": None,
    "chk_1": None,
    "chk1": None,
    "xchk-1": None,
    "chk-1/": None,  # a path, not one name
    "": None,
}
#: the names a directory can have on Linux (no slash, not empty)
DIRECTORY_NAMES = [n for n in NAMES if n and "/" not in n]


@pytest.mark.parametrize("name", list(NAMES))
def test_the_rule(name: str) -> None:
    checkpoint_id = NAMES[name]
    assert checkpoint_id_of(name) == checkpoint_id
    assert is_checkpoint_dir(name) is (checkpoint_id is not None)
    assert layout.is_checkpoint_dir is is_checkpoint_dir
    if checkpoint_id is not None:
        assert checkpoint_dir_name(checkpoint_id) == name


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_a_snapshot_reaches_an_earlier_checkpoints_file_only_through_a_checkpoint_dir(
    name: str,
) -> None:
    path = f"../{name}/keyed-0.parquet"
    if NAMES[name] is None:
        with pytest.raises(InvalidSnapshotPath):
            normalize_relative(path, allow_shared=True, where="job/chk-9")
    else:
        assert normalize_relative(path, allow_shared=True, where="job/chk-9") == path


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_a_rescale_reuses_files_of_checkpoint_dirs_only(name: str, tmp_path: Path) -> None:
    from state_engine.jobs.rescale import reuse_path

    fs = fsspec.filesystem("file")
    job = f"{tmp_path}/job"
    src = SnapshotDir(fs, f"{job}/{name}")
    out = SnapshotDir(fs, f"{job}/chk-99")
    f = SnapshotFile("keyed-0.parquet", 1, "crc32:00000000", FileKind.KEYED)
    if NAMES[name] is None:
        with pytest.raises(SnapshotNotUsable):
            reuse_path(src, out, f)
    else:
        assert reuse_path(src, out, f) == f"../{name}/keyed-0.parquet"


# A version 3 _metadata (no CheckpointProperties): magic, version, checkpoint id 7, no master
# states, no operators.
EMPTY_V3 = struct.pack(">IiqII", 0x4960672D, 3, 7, 0, 0)


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_a_flink_snapshots_job_directory_is_the_parent_of_a_checkpoint_dir(name: str) -> None:
    meta = metadata_from_bytes(EMPTY_V3, f"/r/job/{name}/_metadata", exists=lambda _: False)
    assert meta.job_dir == ("/r/job" if NAMES[name] is not None else None)


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_a_moved_handle_is_re_rooted_from_a_checkpoint_dir_only(name: str) -> None:
    moved = f"/new/job/{name}/f.sst"
    resolver = PathResolver("/new/job/chk-100", "/new/job", lambda loc: loc == moved, "test")
    h = StreamHandle(FILE, f"/old/job/{name}/f.sst", 1)
    resolver.resolve(h)
    assert h.relocated is (NAMES[name] is not None)
    assert h.location == (moved if NAMES[name] is not None else f"/old/job/{name}/f.sst")


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_import_reads_the_metadata_of_checkpoint_dirs_only(name: str, tmp_path: Path) -> None:
    from state_engine.flink.import_job import list_directory

    for directory in (
        tmp_path / "alone" / name,
        tmp_path / "job" / "chk-5",
        tmp_path / "job" / name,
    ):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "_metadata").write_bytes(EMPTY_V3)
    # alone, anything else with a _metadata one level down is a directory of savepoints
    alone = list_directory(str(tmp_path / "alone"))
    assert alone is not None
    want = layout.ROLE_CHECKPOINTS if NAMES[name] is not None else layout.ROLE_SAVEPOINTS
    assert alone.role == want
    # beside a chk-5, in a job directory: a snapshot only if it is a checkpoint's directory
    job = list_directory(str(tmp_path / "job"))
    assert job is not None and job.role == layout.ROLE_CHECKPOINTS
    found = {posixpath.basename(posixpath.dirname(p)) for p in job.metadata_files()}
    assert found == ({"chk-5", name} if NAMES[name] is not None else {"chk-5"})


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_orphan_cleanup_removes_empty_checkpoint_dirs_only(name: str, tmp_path: Path) -> None:
    from state_engine.flink.retention import _empty_chk_dirs

    empty = tmp_path / name
    empty.mkdir()
    old = (datetime.now(UTC) - timedelta(days=30)).timestamp()
    os.utime(empty, (old, old))
    found = _empty_chk_dirs([str(tmp_path)], datetime.now(UTC) - timedelta(days=1))
    assert [posixpath.basename(u) for u in found] == ([name] if NAMES[name] is not None else [])


@pytest.mark.parametrize("name", DIRECTORY_NAMES)
def test_expire_reads_the_metadata_on_disk_of_checkpoint_dirs_only(
    name: str, tmp_path: Path, sqlite_catalog_url: str
) -> None:
    from state_engine.catalog import Catalog
    from state_engine.flink.retention import disk_checkpoints

    job_dir = tmp_path / "job"
    for directory in (job_dir / "chk-5", job_dir / name):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "_metadata").write_bytes(EMPTY_V3)
    with Catalog.open(sqlite_catalog_url) as catalog:
        catalog.register_job("j", max_parallelism=128, origin="flink")
        catalog.claim_directory("j", str(job_dir), layout.ROLE_CHECKPOINTS)
        on_disk = disk_checkpoints(catalog, "j", {})
    found = {posixpath.basename(location) for location in on_disk}
    assert found == ({"chk-5", name} if NAMES[name] is not None else {"chk-5"})
