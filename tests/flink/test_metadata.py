"""The ``_metadata`` reader on the real Flink 2.3 fixtures, and on broken input."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.errors import (
    FlinkMetadataError,
    FlinkPathEscapes,
    UnsupportedFlinkMetadataVersion,
)
from state_engine.flink import metadata as md
from state_engine.flink.javaser import decode_modified_utf8
from state_engine.flink.metadata import metadata_from_bytes, parser, read_metadata

from .conftest import FlinkFixtures

KIND = {
    "checkpoint": ("checkpoint", "native"),
    "savepoint-canonical": ("savepoint", "canonical"),
    "savepoint-native": ("savepoint", "native"),
}


def _java_snapshots(fx: FlinkFixtures) -> list[tuple[str, dict]]:
    manifest = json.loads((fx.java / "manifest.json").read_text())
    return [
        (backend, snap) for backend, b in manifest["backends"].items() for snap in b["snapshots"]
    ]


def test_java_fixture_every_snapshot_matches_the_manifest(flink_fixtures: FlinkFixtures) -> None:
    snaps = _java_snapshots(flink_fixtures)
    assert len(snaps) == 10
    for backend, snap in snaps:
        m = read_metadata(str(flink_fixtures.java / snap["path"]))
        where = f"{backend} {snap['path']}"
        assert m.version == 6, where
        assert m.checkpoint_id == snap["checkpoint_id"], where
        assert (m.kind, m.format) == KIND[snap["kind"]], where
        assert m.metadata_size == snap["metadata_bytes"], where
        files = m.files()
        assert len(files) == snap["referenced_files"], where
        assert m.referenced_bytes == snap["referenced_bytes"], where
        assert all(h.exists for h in files.values()), where
        inline = m.inline_handles
        assert (len(inline), sum(h.size for h in inline)) == (
            snap["inline_handles"],
            snap["inline_bytes"],
        ), where
        assert (m.parallelism, m.max_parallelism) == (2, 128)
        agg = m.operator("agg")
        assert agg.operator_id == "96eed58e350a66c179f06330f5425345"
        assert agg.name == "aggregate"
        assert [s.key_groups for s in agg.subtasks] == [
            md.KeyGroupRange(0, 63),
            md.KeyGroupRange(64, 127),
        ]
        handle_type = {
            "KeyGroupsSavepointStateHandle": md.SAVEPOINT_KEY_GROUPS,
            "KeyGroupsStateHandle": md.KEY_GROUPS,
            "IncrementalRemoteKeyedStateHandle": md.INCREMENTAL,
        }[snap["keyed_handle_type"]]
        assert {h.type for s in agg.subtasks for h in s.keyed_handles} == {handle_type}
        assert {op.uid for op in m.operators} == {"txn-source", "agg", "sink"}


# The PyFlink archive (docs/flink-format.md §4 table):
# (dir, id, kind, format, files, bytes, inline handles).
PY_SNAPSHOTS = [
    (
        "rocks/checkpoints/92444c5a6956ad1f4e7301b84f30217c/chk-2",
        2,
        "checkpoint",
        "native",
        8,
        443_918,
        19,
    ),
    (
        "rocks/checkpoints/92444c5a6956ad1f4e7301b84f30217c/chk-3",
        3,
        "checkpoint",
        "native",
        14,
        1_009_677,
        19,
    ),
    (
        "rocks/checkpoints/92444c5a6956ad1f4e7301b84f30217c/chk-5",
        5,
        "checkpoint",
        "native",
        16,
        1_413_188,
        17,
    ),
    (
        "rocks/savepoints-canonical/savepoint-92444c-91ea7d0af903",
        4,
        "savepoint",
        "canonical",
        2,
        2_016_616,
        7,
    ),
    (
        "rocks/savepoints-native/savepoint-92444c-e1bf658f2800",
        6,
        "savepoint",
        "native",
        12,
        940_042,
        15,
    ),
    (
        "hashmap/checkpoints/5914b5bc33e17d723e41702377437184/chk-2",
        2,
        "checkpoint",
        "native",
        2,
        417_410,
        7,
    ),
    (
        "hashmap/checkpoints/5914b5bc33e17d723e41702377437184/chk-3",
        3,
        "checkpoint",
        "native",
        2,
        1_179_752,
        7,
    ),
    (
        "hashmap/checkpoints/5914b5bc33e17d723e41702377437184/chk-5",
        5,
        "checkpoint",
        "native",
        2,
        1_840_212,
        7,
    ),
    (
        "hashmap/savepoints-canonical/savepoint-5914b5-61153e3fe0a8",
        4,
        "savepoint",
        "canonical",
        2,
        2_117_961,
        7,
    ),
    (
        "hashmap/savepoints-native/savepoint-5914b5-08e3ded7d15f",
        6,
        "savepoint",
        "native",
        2,
        1_840_212,
        7,
    ),
]


@pytest.mark.parametrize(("rel", "cid", "kind", "fmt", "nfiles", "nbytes", "ninline"), PY_SNAPSHOTS)
def test_pyflink_fixture_snapshots(
    flink_fixtures: FlinkFixtures,
    rel: str,
    cid: int,
    kind: str,
    fmt: str,
    nfiles: int,
    nbytes: int,
    ninline: int,
) -> None:
    m = read_metadata(str(flink_fixtures.pyflink / rel))
    assert (m.checkpoint_id, m.kind, m.format) == (cid, kind, fmt)
    assert (len(m.files()), m.referenced_bytes, len(m.inline_handles)) == (nfiles, nbytes, ninline)
    assert all(h.exists for h in m.files().values())
    assert m.operator("mapper").name == "Map, _stream_key_by_map_operator"
    assert m.operator("agg").name == "KEYED PROCESS"


def test_rocksdb_checkpoint_shared_files_are_relocated_and_roles_classified(
    flink_fixtures: FlinkFixtures,
) -> None:
    job = flink_fixtures.java_job("rocksdb")
    m = read_metadata(str(job / "chk-11"))
    refs = m.file_references()
    assert refs and all(r.handle.relocated and r.handle.kind == md.KIND_SHARED for r in refs)
    assert all((r.handle.location or "").startswith(str(job / "shared") + "/") for r in refs)
    assert all(
        r.handle.name.startswith("file:/tmp/javaflink/runs/dev-rocks/data/checkpoints/")
        for r in refs
    )
    roles = {r.role for r in refs}
    assert roles <= {md.ROLE_SHARED, md.ROLE_PRIVATE}
    private = [r for r in refs if r.role == md.ROLE_PRIVATE]
    assert private and all(r.local_path.startswith("OPTIONS-") for r in private)
    # Inline handles carry a would-be file name that does not exist and bytes that do.
    inline = [r for r in m.references() if r.handle.inline]
    assert inline and all(
        r.handle.location is None and len(r.handle.data or b"") == r.handle.size for r in inline
    )
    metas = [r for r in m.references() if r.role == md.ROLE_META]
    assert len(metas) == 2 and all(r.handle.read_bytes()[:4] == b"\x00\x00\x00\x06" for r in metas)


def test_keyed_handles_give_key_group_offsets(flink_fixtures: FlinkFixtures) -> None:
    m = read_metadata(str(flink_fixtures.java_job("hashmap") / "chk-8" / "_metadata"))
    for st_ in m.operator("agg").subtasks:
        h = st_.managed_keyed_state
        assert h is not None and h.type == md.KEY_GROUPS and len(h.offsets) == 64
        assert (
            h.delegate is not None
            and h.delegate.type == md.RELATIVE
            and h.delegate.kind == md.KIND_EXCLUSIVE
        )
        # Heap snapshots write every key group in order, each starting with its own id.
        data = h.delegate.read_bytes()
        assert len(data) == h.delegate.size
        for kg in h.key_groups:
            off = h.offset_of(kg)
            assert struct.unpack(">i", data[off : off + 4])[0] == kg


def test_modified_utf8() -> None:
    assert decode_modified_utf8(b"abc") == "abc"
    assert decode_modified_utf8(b"a\xc0\x80b") == "a\x00b"
    # U+1F355 (pizza) as two 3-byte encoded surrogates, as Java's writeUTF writes it.
    assert decode_modified_utf8("\ud83c\udf55".encode("utf-8", "surrogatepass")) == "\U0001f355"


@pytest.fixture(scope="module")
def small_metadata(flink_fixtures: FlinkFixtures) -> tuple[bytes, str]:
    p = flink_fixtures.java_job("hashmap") / "chk-8" / "_metadata"
    return p.read_bytes(), str(p)


def test_every_truncation_is_a_specific_error(small_metadata: tuple[bytes, str]) -> None:
    data, path = small_metadata
    metadata_from_bytes(data, path)
    for n in range(len(data)):
        with pytest.raises(FlinkMetadataError) as exc:
            metadata_from_bytes(data[:n], path)
        msg = str(exc.value)
        assert path in msg and "byte offset" in msg and "expected" in msg, (n, msg)


def test_trailing_bytes_foreign_file_and_unknown_versions(
    small_metadata: tuple[bytes, str],
) -> None:
    data, path = small_metadata
    with pytest.raises(FlinkMetadataError, match="the end of the file, found 1 more bytes"):
        metadata_from_bytes(data + b"\x00", path)
    with pytest.raises(FlinkMetadataError, match="byte offset 0 expected the magic number"):
        metadata_from_bytes(b"PK\x03\x04" + data[4:], path)
    for version in (0, 1, 2, 7, 99):
        with pytest.raises(UnsupportedFlinkMetadataVersion, match=f"metadata version {version}"):
            metadata_from_bytes(data[:4] + struct.pack(">i", version) + data[8:], path)


@settings(max_examples=150, deadline=None)
@given(
    position=st.integers(min_value=0, max_value=10_000), bit=st.integers(min_value=0, max_value=7)
)
def test_bit_flips_parse_or_fail_cleanly(
    small_metadata: tuple[bytes, str], position: int, bit: int
) -> None:
    """A flipped bit lands in data the format cannot check or is a FlinkMetadataError, no crash."""
    data, path = small_metadata
    position %= len(data)
    flipped = bytearray(data)
    flipped[position] ^= 1 << bit
    with contextlib.suppress(FlinkMetadataError, FlinkPathEscapes):
        metadata_from_bytes(bytes(flipped), path)


def test_relative_handle_escaping_the_snapshot_dir_is_refused(
    small_metadata: tuple[bytes, str], tmp_path: Path
) -> None:
    data, path = small_metadata
    m = metadata_from_bytes(data, path)
    name = next(r.handle.name for r in m.file_references() if r.handle.type == md.RELATIVE)
    evil_name = ("../" + name)[: len(name)]  # same length keeps every offset valid
    forged = data.replace(name.encode(), evil_name.encode())
    with pytest.raises(FlinkPathEscapes, match="not a bare file name"):
        metadata_from_bytes(forged, path)


def test_missing_metadata_file(tmp_path: Path) -> None:
    with pytest.raises(FlinkMetadataError, match="no such _metadata file"):
        read_metadata(str(tmp_path / "chk-1"))


def _resolved(
    name: str,
    *,
    existing: set[str],
    handle_type: str = md.FILE,
    directory: str = "/r/job/chk-3",
    job_dir: str | None = "/r/job",
) -> md.StreamHandle:
    h = md.StreamHandle(handle_type, name, 1)
    md.PathResolver(directory, job_dir, existing.__contains__, "SRC").resolve(h)
    return h


def test_every_spelling_of_a_handle_path_resolves_to_one_location() -> None:
    """The fast path for already-normal paths and the normalising one agree on every spelling."""
    existing = {"/r/job/shared/x.sst"}
    for name in (
        "/r/job/shared/x.sst",
        "file:/r/job/shared/x.sst",
        "file:///r/job/shared/x.sst",
        "file://host/r/job/shared/x.sst",
        "//r/job/shared/x.sst",
        "/r//job/./shared/x.sst",
        "/r/job/shared/x.sst/",
        "/r/job/shared/./x.sst",
    ):
        h = _resolved(name, existing=existing)
        assert (h.location, h.exists, h.relocated, h.kind) == (
            "/r/job/shared/x.sst",
            True,
            False,
            md.KIND_SHARED,
        ), name
    # Hidden files and names with dots are not path components to fold.
    for name in ("/r/job/taskowned/.x", "/r/job/chk-3/a..b", "/q/.../x"):
        h = _resolved(name, existing=set())
        assert (h.location, h.exists) == (md.normalize_location(name), False), name
    assert _resolved("/r/job/chk-3/.x", existing=set()).kind == md.KIND_EXCLUSIVE
    assert _resolved("/r/job/taskowned/.x", existing=set()).kind == md.KIND_TASKOWNED
    assert _resolved("/q/.../x", existing=set()).kind == md.KIND_FOREIGN


def test_handle_paths_with_dot_dot_are_refused_whatever_the_spelling() -> None:
    for name in ("/r/job/shared/../../etc/x", "file:/r/job/..", "../x", "file://h/a/../b"):
        with pytest.raises(FlinkPathEscapes, match=r"SRC: state handle path .* contains '\.\.'"):
            _resolved(name, existing=set())
    for name in ("", ".", "..", "a/b", "a\\b"):
        with pytest.raises(FlinkPathEscapes, match="SRC: relative state handle"):
            _resolved(name, existing=set(), handle_type=md.RELATIVE)


def test_absolute_handles_are_relocated_into_the_job_even_when_they_exist_as_written() -> None:
    moved = "/r/job/shared/x.sst"
    for name in ("/old/place/job/shared/x.sst", "file:/old//place/./job/shared/x.sst"):
        h = _resolved(name, existing={moved, "/old/place/job/shared/x.sst"})
        assert (h.location, h.exists, h.relocated, h.kind) == (moved, True, True, md.KIND_SHARED)
    # another job id, or no such file in the job: left where it is
    h = _resolved("/old/place/other/shared/x.sst", existing={moved})
    assert (h.location, h.exists, h.relocated, h.kind) == (
        "/old/place/other/shared/x.sst",
        False,
        False,
        md.KIND_FOREIGN,
    )
    # a savepoint's own file written under another root (entropy injection)
    h = _resolved(
        "/e1/savepoint-1/f", existing={"/s/savepoint-1/f"}, directory="/s/savepoint-1", job_dir=None
    )
    assert (h.location, h.relocated, h.kind) == ("/s/savepoint-1/f", True, md.KIND_EXCLUSIVE)
    # relative names live in the snapshot's directory, inline handles nowhere
    h = _resolved("f", existing={"/r/job/chk-3/f"}, handle_type=md.RELATIVE)
    assert (h.location, h.exists, h.kind) == ("/r/job/chk-3/f", True, md.KIND_EXCLUSIVE)
    h = _resolved("f", existing=set(), handle_type=md.INLINE)
    assert (h.location, h.exists, h.kind) == (None, None, md.KIND_INLINE)


def test_file_merging_physical_files_one_directory_deeper_are_relocated_too() -> None:
    """FLIP-306 keeps physical files in ``shared/job_<id>_op_<op>_<i>_<p>/`` and
    ``taskowned/job_<id>_tm_<tm>/``: a moved job directory re-roots them like any shared file."""
    for part, kind in (("shared", md.KIND_SHARED), ("taskowned", md.KIND_TASKOWNED)):
        moved = f"/r/job/{part}/job_j_sub/uuid"
        h = _resolved(f"file:/old/place/job/{part}/job_j_sub/uuid", existing={moved})
        assert (h.location, h.exists, h.relocated, h.kind) == (moved, True, True, kind)
    # two levels deeper than that is no layout Flink writes: left where it is
    h = _resolved("/old/job/shared/a/b/uuid", existing={"/r/job/shared/a/b/uuid"})
    assert (h.relocated, h.kind) == (False, md.KIND_FOREIGN)


def test_references_and_local_files_are_frozen_value_records(
    small_metadata: tuple[bytes, str],
) -> None:
    data, path = small_metadata
    refs = metadata_from_bytes(data, path).references()
    assert refs == metadata_from_bytes(data, path).references()
    ref = refs[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.role = md.ROLE_SHARED  # type: ignore[misc]
    copy = dataclasses.replace(ref, local_path="000001.sst")
    assert copy.local_path == "000001.sst" and copy.handle is ref.handle and copy != ref
    assert repr(ref).startswith(f"FileReference(role={ref.role!r}, handle=StreamHandle(")
    h = md.StreamHandle(md.FILE, "/x", 1)
    lf = md.LocalFile("000001.sst", h)
    assert lf == md.LocalFile("000001.sst", h) != md.LocalFile("000002.sst", h)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lf.local_path = "b"  # type: ignore[misc]
    assert repr(lf) == f"LocalFile(local_path='000001.sst', handle={h!r})"


def test_a_rocksdb_handles_files_read_as_records_and_compare_as_a_tuple_of_them() -> None:
    """A RocksDB handle keeps its files as columns (names, handles); reading them gives the
    LocalFile records, in order, and they compare equal to a tuple of the same records."""
    a, b = md.StreamHandle(md.FILE, "/s/a", 1), md.StreamHandle(md.FILE, "/s/b", 2)
    files = md.LocalFiles(["000001.sst", "000002.sst"], [a, b])
    records = (md.LocalFile("000001.sst", a), md.LocalFile("000002.sst", b))
    assert list(files) == list(records) and files[1] == records[1] and len(files) == 2
    assert files == records and files == md.LocalFiles.of(records) and files != records[:1]
    assert files[:1] == records[:1] and isinstance(files[:1], md.LocalFiles)
    assert md.LocalFiles() == () and not md.LocalFiles()
    assert repr(files[:1]) == f"LocalFiles([{records[0]!r}])"
    with pytest.raises(ValueError, match="1 local names for 2 handles"):
        md.LocalFiles(["000001.sst"], [a, b])
    columns = md.LocalFiles.of_files(["000001.sst", "000002.sst"], ["/s/a", "/s/b"], [1, 2])
    assert columns.in_columns and columns == files and not columns.in_columns
    inline = md.StreamHandle(md.INLINE, "i", 1, data=b"x")
    with pytest.raises(ValueError, match="2 local names for 1 paths, 1 sizes and 0 inline"):
        md.LocalFiles.of_files(["000001.sst", "000002.sst"], ["/s/a"], [1])
    with pytest.raises(ValueError, match="each at a position among the names"):
        md.LocalFiles.of_files(["000001.sst", "CURRENT"], ["/s/a"], [1], {2: inline})
    with pytest.raises(ValueError, match="inline handles are inline"):
        md.LocalFiles.of_files(["000001.sst", "CURRENT"], ["/s/a"], [1], {1: a})


_RUN_DIRS = (
    "/r/job/shared/",
    "file:/r/job/shared/",
    "/r//job/./shared/",
    "/r/job/chk-3/",
    "/r/job/taskowned/",
    "/q/other/shared/",
    "/old/place/job/shared/",
    "/r/job/shared/../",
    "",
)
_RUN_NAMES = ("a.sst", "b.sst", ".x", "c", "", ".", "..")


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.one_of(
            st.none(),  # an inline handle
            st.tuples(st.sampled_from(_RUN_DIRS), st.sampled_from(_RUN_NAMES)),
        ),
        min_size=1,
        max_size=6,
    ),
    found=st.sets(
        st.sampled_from(
            [
                f"{d}{n}"
                for d in ("/r/job/shared/", "/r/job/chk-3/", "/q/other/shared/")
                for n in ("a.sst", "b.sst", ".x", "c")
            ]
        )
    ),
    listed_too=st.booleans(),
)
def test_a_rocksdb_run_resolved_as_columns_reads_as_its_handles_resolved_one_by_one(
    entries: list[tuple[str, str] | None], found: set[str], listed_too: bool
) -> None:
    """A RocksDB handle's files are resolved as columns when they can be: the handles made
    from the columns equal those that resolving each handle gives (location, found or not,
    relocated, kind), whatever the directories, spellings, names, files and inline ones."""
    plain = [e for e in entries if e is not None]
    paths = [d + n for d, n in plain]
    sizes = list(range(1, len(paths) + 1))
    names = [f"{i:06d}.sst" for i in range(len(entries))]

    def inline(i: int) -> md.StreamHandle:
        return md.StreamHandle(md.INLINE, f"inline-{i}", 2, data=b"xy")

    def columns() -> md.LocalFiles:
        positions = {i: inline(i) for i, e in enumerate(entries) if e is None}
        return md.LocalFiles.of_files(names, paths, sizes, positions)

    def resolver() -> md.PathResolver:
        return md.PathResolver(
            "/r/job/chk-3", "/r/job", found.__contains__, "SRC", found if listed_too else ()
        )

    expected = []
    plain_handles = iter(md.StreamHandle(md.FILE, p, n) for p, n in zip(paths, sizes, strict=True))
    for i, e in enumerate(entries):
        expected.append(inline(i) if e is None else next(plain_handles))
    try:
        resolver().resolve_all(expected)
    except FlinkPathEscapes as exc:
        with pytest.raises(FlinkPathEscapes) as refused:
            resolver().resolve_files(columns())
        assert str(refused.value) == str(exc)
        return
    files = columns()
    assert files.in_columns and len(files) == len(entries)
    resolver().resolve_files(files)
    kept_as_columns = files.locations is not None
    assert list(files.handles) == expected and list(files.names) == names
    assert not files.in_columns and files.locations is None  # the objects hold it from now on
    if plain and len({d for d, _ in plain}) == 1 and paths[0].startswith("/r/job/shared/"):
        names_ok = all(n not in ("", ".", "..") for _, n in plain)
        files_found = all(h.exists for h in expected if h.type == md.FILE)
        assert kept_as_columns == (names_ok and files_found)


def _local_files_bytes(entries: list[tuple[str, bytes]]) -> bytes:
    """A RocksDB handle's file list: count, then per file its local name and a stream handle."""
    out = bytearray(struct.pack(">i", len(entries)))
    for local, handle in entries:
        out += struct.pack(">H", len(local)) + local.encode() + handle
    return bytes(out)


def _file(path: str, size: int) -> bytes:
    raw = path.encode()  # modified UTF-8 = UTF-8 for these (no NUL, no supplementary)
    return b"\x02" + struct.pack(">qH", size, len(raw)) + raw


def test_a_rocksdb_file_list_is_columns_until_an_entry_that_is_not_a_plain_ascii_file() -> None:
    """Plain ASCII file handles are read as columns, inline ones by position; from the first
    other entry (a path not in ASCII, a relative handle) the run is handle objects, and reads
    the same."""
    plain = [("000001.sst", _file("/j/shared/a", 3)), ("000002.sst", _file("/j/shared/b", 4))]
    others = [
        ("000003.sst", _file("/j/shared/ü", 5)),
        ("MANIFEST", b"\x06" + struct.pack(">H", 1) + b"m" + struct.pack(">q", 6)),
        ("OPTIONS", b"\x01" + struct.pack(">H", 1) + b"o" + struct.pack(">i", 2) + b"xy"),
        ("000004.sst", _file("/j/shared/c", 7)),
    ]
    columns = parser._read_local_files(parser._Reader(_local_files_bytes(plain), "SRC"), "shared")
    assert columns.in_columns and len(columns) == 2
    assert list(columns) == [
        md.LocalFile("000001.sst", md.StreamHandle(md.FILE, "/j/shared/a", 3)),
        md.LocalFile("000002.sst", md.StreamHandle(md.FILE, "/j/shared/b", 4)),
    ]
    with_inline = parser._read_local_files(
        parser._Reader(_local_files_bytes([*plain[:1], others[2], *plain[1:]]), "SRC"), "shared"
    )
    assert with_inline.in_columns and with_inline.file_names == ["000001.sst", "000002.sst"]
    assert [(f.local_path, f.handle.type, f.handle.name) for f in with_inline] == [
        ("000001.sst", md.FILE, "/j/shared/a"),
        ("OPTIONS", md.INLINE, "o"),
        ("000002.sst", md.FILE, "/j/shared/b"),
    ]
    mixed = parser._read_local_files(
        parser._Reader(_local_files_bytes(plain + others), "SRC"), "private"
    )
    assert not mixed.in_columns
    assert [(f.local_path, f.handle.type, f.handle.name, f.handle.size) for f in mixed] == [
        ("000001.sst", md.FILE, "/j/shared/a", 3),
        ("000002.sst", md.FILE, "/j/shared/b", 4),
        ("000003.sst", md.FILE, "/j/shared/ü", 5),
        ("MANIFEST", md.RELATIVE, "m", 6),
        ("OPTIONS", md.INLINE, "o", 2),
        ("000004.sst", md.FILE, "/j/shared/c", 7),
    ]
