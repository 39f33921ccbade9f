"""Where snapshot files live and how they are written, committed and discarded."""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from state_engine.errors import (
    ConfigurationError,
    InvalidJobName,
    InvalidSnapshotPath,
    SnapshotFileExists,
    UnknownStorageScheme,
)
from state_engine.snapshot.storage import (
    CheckpointStorage,
    FileStore,
    ReadStats,
    SnapshotDir,
    canonical_url,
    delete_each,
    list_url,
    remove_empty_dirs,
    validate_job_name,
)


def test_unknown_scheme_names_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownStorageScheme) as err:
        CheckpointStorage("nosuchfs://bucket/checkpoints")
    message = str(err.value)
    assert "'nosuchfs'" in message
    for known in ("file", "memory", "s3", "gs", "hdfs"):
        assert known in message
    assert isinstance(err.value, ConfigurationError)


@pytest.mark.parametrize("job", ["../x", "a/b", "", "..", ".hidden", "x\x00y", "a" * 201, "a\\b"])
def test_bad_job_names_are_refused_with_the_allowed_characters(
    storage: CheckpointStorage, job: str
) -> None:
    with pytest.raises(InvalidJobName, match="letters, digits"):
        storage.checkpoint(job, 1)
    with pytest.raises(InvalidJobName):
        validate_job_name(job)


def test_good_job_names_map_to_the_layout(storage: CheckpointStorage) -> None:
    assert storage.checkpoint_dir("orders-v2_eu.1", 7) == "orders-v2_eu.1/chk-7"
    assert storage.shared_dir("orders-v2_eu.1") == "orders-v2_eu.1/shared"
    sp = storage.default_savepoint_dir("orders", 7)
    assert sp.startswith("orders/savepoints/savepoint-7-") and len(sp.rsplit("-", 1)[1]) == 8
    assert storage.checkpoint("orders", 7).url.endswith("/orders/chk-7")


def test_write_file_reports_size_and_checksum_of_what_landed(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    data = bytes(range(256)) * 9000  # several internal chunks
    info = snap.write_file("blob.bin", data)
    assert info.path == "blob.bin"
    assert info.size == len(data)
    assert info.checksum == f"crc32:{zlib.crc32(data):08x}"
    assert snap.checksum_of("blob.bin") == info.checksum

    table = pa.table({"x": list(range(500))})
    via_callback = snap.write_file("t.parquet", lambda sink: pq.write_table(table, sink))
    assert via_callback.size == snap.size_of("t.parquet")
    assert via_callback.checksum == snap.checksum_of("t.parquet")
    with snap.open_input("t.parquet") as f:
        assert pq.read_table(f).equals(table)


def test_files_are_never_overwritten(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    snap.write_file("a.bin", b"first")
    with pytest.raises(SnapshotFileExists, match="never overwritten"):
        snap.write_file("a.bin", b"second")
    with snap.open_input("a.bin") as f:
        assert f.read() == b"first"
    storage.write_file("job/other.bin", b"1")
    with pytest.raises(SnapshotFileExists):
        storage.write_file("job/other.bin", b"2")


def test_new_file_names_are_unique() -> None:
    snap = CheckpointStorage("memory://names").checkpoint("job", 1)
    names = {snap.new_file_name("keyed-0", ".parquet") for _ in range(1000)}
    assert len(names) == 1000


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "a/../../b", "../shared/../chk-2/x", "", "a//b", "s3://b/x"]
)
def test_paths_cannot_escape_the_snapshot(storage: CheckpointStorage, path: str) -> None:
    with pytest.raises(InvalidSnapshotPath):
        storage.checkpoint("job", 1).write_file(path, b"x")


def test_reserved_metadata_name_is_refused_for_data(storage: CheckpointStorage) -> None:
    with pytest.raises(InvalidSnapshotPath, match="reserved"):
        storage.checkpoint("job", 1).write_file("_metadata", b"{}")


def test_shared_files_only_for_checkpoints(storage: CheckpointStorage) -> None:
    chk = storage.checkpoint("job", 1)
    info = chk.write_file("../shared/sst-1.sst", b"sst")
    assert info.path == "../shared/sst-1.sst"
    assert [f.path for f in storage.list_files("job")] == ["shared/sst-1.sst"]
    with pytest.raises(InvalidSnapshotPath, match="savepoints hold no shared files"):
        storage.savepoint("job", 1).write_file("../shared/sst-2.sst", b"sst")


def test_metadata_commits_once_and_leaves_no_temp_file(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 3)
    assert not snap.has_metadata()
    snap.commit_metadata(b'{"a":1}')
    assert snap.read_metadata_bytes() == b'{"a":1}'
    with pytest.raises(SnapshotFileExists, match="commits once"):
        snap.commit_metadata(b'{"a":2}')
    assert snap.read_metadata_bytes() == b'{"a":1}'
    assert [f.path for f in storage.list_files("job")] == ["chk-3/_metadata"]


def test_discard_leaves_nothing_but_shared_files(storage: CheckpointStorage) -> None:
    chk = storage.checkpoint("job", 4)
    chk.write_file("keyed-0.parquet", b"k0")
    chk.write_file("sub/keyed-1.parquet", b"k1")
    chk.write_file("../shared/sst-9.sst", b"shared")
    storage.checkpoint("job", 5).write_file("keep-me.parquet", b"other checkpoint")

    removed = storage.discard("job/chk-4")
    assert sorted(removed) == ["keyed-0.parquet", "sub/keyed-1.parquet"]
    assert [f.path for f in storage.list_files("job")] == [
        "chk-5/keep-me.parquet",
        "shared/sst-9.sst",
    ]
    assert not storage.fs.exists(chk.path)
    assert storage.discard("job/chk-4") == []


def test_discard_keeps_listed_files(storage: CheckpointStorage) -> None:
    chk = storage.checkpoint("job", 4)
    chk.write_file("a.bin", b"a")
    chk.write_file("b.bin", b"b")
    assert storage.discard(chk, keep={"b.bin"}) == ["a.bin"]
    assert [f.path for f in storage.list_files("job")] == ["chk-4/b.bin"]


@pytest.mark.parametrize("target", ["job", "job/shared", "", "job/savepoints"])
def test_discard_refuses_anything_but_a_snapshot_directory(
    storage: CheckpointStorage, target: str
) -> None:
    storage.checkpoint("job", 1).write_file("a.bin", b"a")
    storage.checkpoint("job", 1).write_file("../shared/s.bin", b"s")
    storage.savepoint("job", 1, "job/savepoints/sp-1").write_file("x.bin", b"x")
    with pytest.raises(InvalidSnapshotPath):
        storage.discard(target)
    assert len(storage.list_files("job")) == 3


def test_list_files_reports_size_and_modification_time(storage: CheckpointStorage) -> None:
    assert storage.list_files("job") == []
    storage.checkpoint("job", 1).write_file("a.bin", b"12345")
    storage.savepoint("job", 2, "job/savepoints/sp").write_file("b.bin", b"1")
    files = storage.list_files("job")
    assert [(f.path, f.size) for f in files] == [("chk-1/a.bin", 5), ("savepoints/sp/b.bin", 1)]
    assert all(f.modified is not None and f.modified.tzinfo is not None for f in files)


def test_any_location_is_a_url_an_absolute_path_or_relative_to_the_root(
    storage: CheckpointStorage,
) -> None:
    snap = storage.checkpoint("job", 1)
    snap.write_file("a.bin", b"12345")
    url = snap.url_of("a.bin")
    assert url == storage.url_of("job/chk-1/a.bin")
    path = storage.path_of(url)
    assert storage.to_url(path) == storage.to_url("job/chk-1/a.bin") == url
    assert storage.exists(url) and storage.exists(path) and storage.exists("job/chk-1/a.bin")
    assert [(f.path, f.size) for f in storage.list_under(snap.url)] == [("a.bin", 5)]
    assert [f.path for f in storage.list_under("job")] == ["chk-1/a.bin"]
    assert storage.list_under("job/chk-9") == []


def test_delete_one_and_many_say_what_was_there(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    urls = [snap.url_of(snap.write_file(f"{n}.bin", b"x").path) for n in "abc"]
    assert storage.delete(urls[0]) is True
    assert storage.delete(urls[0]) is False
    calls: list[None] = []
    assert storage.delete_many(urls, after_each=lambda: calls.append(None)) == urls[1:]
    assert len(calls) == 2 and storage.list_files("job") == []
    snap.write_file("d.bin", b"x")
    assert delete_each([snap.url_of("d.bin"), snap.url_of("d.bin")]) == [snap.url_of("d.bin"), None]


def test_snapshot_dir_removes_its_files_and_itself(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    snap.write_file("a.bin", b"1")
    snap.write_file("b.bin", b"2")
    assert snap.has_file("a.bin") and snap.metadata_url == snap.url + "/_metadata"
    assert snap.remove_file("a.bin") is True and snap.remove_file("a.bin") is False
    assert not snap.has_file("a.bin")
    assert storage.remove_snapshot_dir(snap) is True
    assert not snap.exists() and storage.remove_snapshot_dir("job/chk-1") is False
    assert snap.self_contained().allow_shared is False and snap.allow_shared is True


def test_remove_empty_dirs_stops_at_the_root_and_keeps_pending_and_shared(
    storage: CheckpointStorage,
) -> None:
    storage.write_file("job/chk-1/sub/a.bin", b"1")
    storage.write_file("job/chk-2/b.bin", b"1")
    storage.write_file("job/shared/c.bin", b"1")
    for rel in ("job/chk-1/sub/a.bin", "job/chk-2/b.bin", "job/shared/c.bin"):
        assert storage.delete(rel)
    job = storage.url_of("job")
    dirs = [storage.url_of(d) for d in ("job/chk-1/sub", "job/chk-2", "job/shared")]
    assert storage.remove_empty_dirs(dirs, [job], keep=[storage.url_of("job/chk-2")]) == 2
    store, path = FileStore.at(job)
    assert sorted(e.path.rsplit("/", 1)[1] for e in store.ls(path)) == ["chk-2", "shared"]
    assert all(e.is_dir for e in store.ls(path))
    assert remove_empty_dirs([storage.url_of("job/chk-2")], [job]) == 1


def test_file_store_lists_reads_and_converts(storage: CheckpointStorage) -> None:
    storage.write_file("x/y/a.bin", b"hello")
    store, root = FileStore.at(storage.url_of("x"))
    assert store.isdir(root) and store.is_local == storage.root_url.startswith("file:")
    [f] = store.find(root)
    assert (f.path, f.size) == ("y/a.bin", 5) and f.mtime > 0
    assert store.read_bytes(f"{root}/y/a.bin") == b"hello"
    assert store.read_bytes(f"{root}/y/a.bin", start=1, size=3) == b"ell"
    assert store.glob(f"{root}/*/a.bin") == [f"{root}/y/a.bin"]
    assert store.url_of(f"{root}/y/a.bin") == storage.url_of("x/y/a.bin")
    assert store.path_of(storage.url_of("x/y/a.bin")) == f"{root}/y/a.bin"
    assert [g.path for g in list_url(storage.url_of("x"))] == ["y/a.bin"]
    assert canonical_url(storage.url_of("x") + "/") == storage.url_of("x")
    assert store.delete_tree(f"{root}/y") and store.find(root) == []


def test_savepoint_at_another_url(storage: CheckpointStorage, root_url: str) -> None:
    target = root_url + "/elsewhere/sp-1"
    sp = storage.savepoint("job", 1, target)
    sp.write_file("f.bin", b"x")
    assert SnapshotDir.from_url(target).size_of("f.bin") == 1


def test_counting_reader_counts_bytes_read(storage: CheckpointStorage) -> None:
    snap = storage.checkpoint("job", 1)
    snap.write_file("f.bin", b"x" * 1000)
    stats = ReadStats()
    with snap.open_input("f.bin", stats) as f:
        f.seek(100)
        assert len(f.read(300)) == 300
        assert f.size() == 1000
    assert stats.bytes_read == 300 and stats.files_opened == 1


@pytest.mark.parametrize("target", ["", "job", "job/chk-1", "elsewhere"])
def test_a_savepoint_never_takes_a_directory_that_holds_anything(
    storage: CheckpointStorage, target: str
) -> None:
    storage.checkpoint("job", 1).write_file("a.bin", b"a")
    storage.write_file("elsewhere/users-file.txt", b"mine")
    with pytest.raises(InvalidSnapshotPath, match="not empty"):
        storage.savepoint("job", 2, target)
    assert len(storage.list_files("job")) == 1


@given(
    paths=st.lists(st.text(alphabet="/ab.:%é ", max_size=12).map(lambda p: p or "x"), max_size=8)
)
def test_urls_of_many_paths_are_url_of_each(paths: list[str]) -> None:
    store, _ = FileStore.at("/tmp")
    assert store.urls_of(paths) == [store.url_of(p) for p in paths]


@given(
    directory=st.text(alphabet="/ab.:%é ", max_size=12).map(lambda d: d.rstrip("/") + "/"),
    names=st.lists(st.text(alphabet="ab.:%é ", min_size=1, max_size=6), max_size=8),
)
def test_urls_of_files_in_one_directory_are_url_of_each(directory: str, names: list[str]) -> None:
    store, _ = FileStore.at("/tmp")
    paths = [directory + name for name in names]
    assert store.urls_in(directory, paths) == [store.url_of(p) for p in paths]


def test_file_paths_lists_every_file_below_through_directories_and_links(tmp_path: Path) -> None:
    """Which files exist under a local directory, without a stat each: nested directories and
    a link to a directory are walked (as fsspec's find does), a dangling link is listed."""
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for rel in ("root/top", "root/a/mid", "root/a/b/deep", "elsewhere/linked"):
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "root" / "dangling").symlink_to(tmp_path / "nowhere")
    store, root = FileStore.at(str(tmp_path / "root"))
    base = str(tmp_path / "root")
    assert sorted(store.file_paths(root)) == sorted(
        f"{base}/{rel}" for rel in ("top", "a/mid", "a/b/deep", "link/linked", "dangling")
    )
    assert store.file_paths(f"{base}/top") == [f"{base}/top"]  # a file named as the root
    assert store.file_paths(f"{base}/missing") == []
