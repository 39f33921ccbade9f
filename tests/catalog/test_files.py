"""Snapshot files with SharedStateRegistry semantics, and the bulk registration path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, select

from state_engine.catalog import Catalog, FileGroup, FileRef, KeyGroupStatRow
from state_engine.catalog.bulk import SQLITE_ROWS_PER_INSERT
from state_engine.catalog.models import RETAINED_STATUSES, File, Snapshot
from state_engine.catalog.views import references as ref
from state_engine.errors import FileAlreadyRegistered, InvalidCatalogInput, ReusedFileMissing


def _snapshot(catalog: Catalog, job: str = "orders", max_parallelism: int = 128) -> int:
    catalog.register_job(job, max_parallelism=max_parallelism)
    return catalog.begin_snapshot(job, location=f"file:///{job}", parallelism=4).id


def _paths(files: list) -> set[str]:
    return {f.path for f in files}


def test_a_shared_file_records_its_creator_and_last_user(catalog: Catalog) -> None:
    first = _snapshot(catalog)
    sst = FileRef("/orders/shared/1.sst", 500, checksum="c1", shared=True, operator="agg")
    catalog.attach_files(first, [sst, FileRef("/orders/chk-1/MANIFEST", 10, operator="agg")])
    catalog.complete_snapshot(first, 0)
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.attach_files(second, [sst])
    files = {f.path: f for f in catalog.snapshot_files(second)}
    assert files["/orders/shared/1.sst"].created_by_snapshot_id == first
    assert files["/orders/shared/1.sst"].last_used_snapshot_id == second
    assert _paths(catalog.snapshot_files(first)) == {
        "/orders/shared/1.sst",
        "/orders/chk-1/MANIFEST",
    }


def test_releasable_files_follow_retained_snapshots(catalog: Catalog) -> None:
    first = _snapshot(catalog)
    sst = FileRef("/o/shared/1.sst", 500, shared=True, operator="agg")
    catalog.attach_files(first, [sst, FileRef("/o/chk-1/own", 10, operator="agg")])
    catalog.complete_snapshot(first, 0)
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.attach_files(second, [sst, FileRef("/o/chk-2/own", 10, operator="agg")])
    assert catalog.releasable_files("orders") == []  # a PENDING snapshot pins its files too
    catalog.complete_snapshot(second, 0)
    catalog.subsume_snapshot(first)
    assert _paths(catalog.releasable_files("orders")) == {"/o/chk-1/own"}
    assert "/o/shared/1.sst" in catalog.live_paths("orders")
    catalog.subsume_snapshot(second)
    assert _paths(catalog.releasable_files("orders")) == {
        "/o/chk-1/own",
        "/o/chk-2/own",
        "/o/shared/1.sst",
    }
    assert _paths(catalog.orphan_candidates("orders")) == _paths(catalog.releasable_files("orders"))
    assert catalog.live_paths("orders") == set()


def test_an_exclusive_file_of_another_snapshot_is_refused_and_nothing_is_kept(
    catalog: Catalog,
) -> None:
    first = _snapshot(catalog)
    catalog.attach_files(first, [FileRef("/o/chk-1/data", 10, operator="agg")])
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    with pytest.raises(FileAlreadyRegistered, match=f"already registered by snapshot {first}"):
        catalog.attach_files(
            second,
            [FileRef("/o/chk-2/new", 5, operator="other"), FileRef("/o/chk-1/data", 10)],
        )
    assert catalog.snapshot_files(second) == []
    assert "/o/chk-2/new" not in catalog.known_paths("orders")
    assert [o.uid for o in catalog.list_operators("orders")] == ["agg"]


def test_a_reused_name_with_other_content_is_refused(catalog: Catalog) -> None:
    first = _snapshot(catalog)
    catalog.attach_files(first, [FileRef("/o/shared/x", 10, checksum="a", shared=True)])
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    with pytest.raises(FileAlreadyRegistered, match="never reused"):
        catalog.attach_files(second, [FileRef("/o/shared/x", 11, checksum="b", shared=True)])


def test_a_growing_file_keeps_the_most_any_snapshot_reads_of_it(catalog: Catalog) -> None:
    """Flink's file merging across checkpoints appends to a physical file after a snapshot
    that reads part of it was recorded: a later snapshot may read further, never shrink it."""
    merged = "/o/shared/job_x_op_y_0_2/physical"
    sizes: list[int] = []
    for n, reads in enumerate((100, 250, 180), start=1):
        sid = (
            catalog.begin_snapshot("orders", location=f"file:///{n}", parallelism=4).id
            if sizes
            else _snapshot(catalog)
        )
        catalog.attach_files(sid, [FileRef(merged, reads, shared=True, grows=True)])
        catalog.complete_snapshot(sid, 0)
        sizes.append(catalog.snapshot_files(sid)[0].size)
    assert sizes == [100, 250, 250]
    # a file that does not grow is one size, as ever
    sid = catalog.begin_snapshot("orders", location="file:///4", parallelism=4).id
    with pytest.raises(FileAlreadyRegistered, match="never reused"):
        catalog.attach_files(sid, [FileRef(merged, 300, shared=True)])
    assert catalog.snapshot_files(sid) == []


def test_bad_file_references_are_refused(catalog: Catalog) -> None:
    sid = _snapshot(catalog)
    with pytest.raises(InvalidCatalogInput, match="key_group_end"):
        catalog.attach_files(sid, [FileRef("/f", 1, key_group_start=10, key_group_end=128)])
    with pytest.raises(InvalidCatalogInput, match="size"):
        catalog.attach_files(sid, [FileRef("/f", -1)])
    with pytest.raises(InvalidCatalogInput, match="subtask"):
        catalog.attach_files(sid, [FileRef("/f", 1, subtask=4)])
    with pytest.raises(InvalidCatalogInput, match="listed twice"):
        catalog.attach_files(sid, [FileRef("/f", 1), FileRef("/f", 2)])
    assert catalog.snapshot_files(sid) == []


def test_a_file_read_by_several_subtasks_is_one_file_with_several_ranges(
    catalog: Catalog,
) -> None:
    sid = _snapshot(catalog)
    catalog.attach_files(
        sid,
        [
            FileRef(
                "/o/part-0.parquet",
                1000,
                operator="agg",
                subtask=0,
                key_group_start=0,
                key_group_end=31,
                details={"row_groups": [0, 1]},
            ),
            FileRef(
                "/o/part-0.parquet",
                1000,
                operator="agg",
                subtask=1,
                key_group_start=32,
                key_group_end=63,
                details={"row_groups": [2]},
            ),
        ],
    )
    done = catalog.complete_snapshot(sid, 0)
    assert done.bytes == 1000
    refs = catalog.snapshot_files(sid)
    assert [(r.subtask, r.key_group_start, r.key_group_end) for r in refs] == [
        (0, 0, 31),
        (1, 32, 63),
    ]
    [size] = catalog.state_size_history("orders")
    assert (size.operator, size.files, size.bytes) == ("agg", 1, 1000)


@contextmanager
def _count_statements(catalog: Catalog) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        seen.append(statement)

    event.listen(catalog.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(catalog.engine, "before_cursor_execute", record)


def test_ten_thousand_files_and_all_key_group_stats_take_a_handful_of_statements(
    catalog: Catalog,
) -> None:
    sid = _snapshot(catalog, max_parallelism=32768)
    files = [
        FileRef(
            f"/big/chk-1/{i:05d}.sst",
            1000 + i,
            shared=i % 2 == 0,
            operator=f"op{i % 3}",
            subtask=i % 4,
            key_group_start=(i % 4) * 8192,
            key_group_end=(i % 4) * 8192 + 8191,
        )
        for i in range(10_000)
    ]
    stats = [KeyGroupStatRow("op0", kg, rows=kg % 97, bytes=kg) for kg in range(32_768)]
    with _count_statements(catalog) as statements:
        assert catalog.attach_files(sid, files) == 10_000
        assert catalog.record_key_group_stats(sid, stats) == 32_768
    # Batched multi-row inserts and IN lists: tens of statements, where per-row would be 42,768
    # (SQLite takes the rows in INSERTs of up to SQLITE_ROWS_PER_INSERT each, PostgreSQL in one
    # pipelined executemany).
    inserts = 0
    if catalog.engine.dialect.name == "sqlite":
        inserts = -(-10_000 // SQLITE_ROWS_PER_INSERT) + -(-32_768 // SQLITE_ROWS_PER_INSERT)
    assert len(statements) < 30 + inserts, len(statements)
    done = catalog.complete_snapshot(sid, 0)
    assert done.bytes == sum(f.size for f in files)
    assert done.entries == sum(s.rows for s in stats)
    assert len(catalog.snapshot_files(sid)) == 10_000
    [skew] = catalog.key_group_skew(sid)
    assert (skew.key_groups, skew.max_rows) == (32_768, 96)


# --- the reference count behind orphan detection, against its definition ---

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.lists(st.integers(0, 7), max_size=4)),
        st.tuples(st.sampled_from(["complete", "fail", "subsume", "discard"]), st.integers(0, 9)),
    ),
    max_size=12,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_releasable_files_are_exactly_those_no_retained_snapshot_uses(
    catalog: Catalog, steps: list
) -> None:
    job = f"prop-{id(steps)}-{len(catalog.list_jobs())}"
    catalog.register_job(job, max_parallelism=128)
    snapshots: list[int] = []
    for action, arg in steps:
        try:
            if action == "begin":
                snap = catalog.begin_snapshot(job, location="file:///p", parallelism=1)
                shared = [FileRef(f"/{job}/shared/{n}", 1, shared=True) for n in sorted(set(arg))]
                catalog.attach_files(snap.id, [*shared, FileRef(f"/{job}/own/{snap.id}", 1)])
                snapshots.append(snap.id)
            elif snapshots:
                sid = snapshots[arg % len(snapshots)]
                {
                    "complete": lambda s: catalog.complete_snapshot(
                        s, catalog.get_snapshot(s).version
                    ),
                    "fail": catalog.fail_snapshot,
                    "subsume": catalog.subsume_snapshot,
                    "discard": catalog.discard_snapshot,
                }[action](sid)
        except Exception as exc:  # refused transitions are part of the exploration
            assert type(exc).__name__ in ("InvalidSnapshotTransition",), exc
    with catalog._read() as s:
        job_id = catalog.get_job(job).id
        live = select(ref.c.file_id).join(Snapshot, Snapshot.id == ref.c.snapshot_id)
        live = live.where(Snapshot.status.in_(RETAINED_STATUSES), Snapshot.job_id == job_id)
        expected = set(
            s.scalars(
                select(File.path).where(
                    File.job_id == job_id, File.id.not_in(live.scalar_subquery())
                )
            )
        )
        refs = dict(
            s.execute(
                select(File.path, func.count(func.distinct(ref.c.snapshot_id)))
                .join(ref, ref.c.file_id == File.id)
                .join(Snapshot, Snapshot.id == ref.c.snapshot_id)
                .where(File.job_id == job_id, Snapshot.status.in_(RETAINED_STATUSES))
                .group_by(File.path)
            ).all()
        )
        counters = dict(
            s.execute(select(File.path, File.live_refs).where(File.job_id == job_id)).all()
        )
    assert _paths(catalog.releasable_files(job)) == expected
    assert {p: n for p, n in counters.items() if n} == refs


def test_bulk_registered_files_store_timestamps_as_every_other_row_does(
    catalog: Catalog,
) -> None:
    # The bulk path binds raw values; on SQLite a timestamp is text and must keep the one format
    # (microseconds included even when zero) that makes text order chronological.
    sid = _snapshot(catalog)
    catalog.attach_files(sid, [FileRef("/o/chk-1/a", 1)])
    with catalog.engine.connect() as conn:
        file_stamp = conn.exec_driver_sql("SELECT created_at FROM sk_files").scalar_one()
        snap_stamp = conn.exec_driver_sql("SELECT created_at FROM sk_snapshots").scalar_one()
    assert file_stamp == snap_stamp
    assert catalog.live_paths("orders") == {"/o/chk-1/a"}


def test_new_files_get_fresh_ids_after_the_newest_was_forgotten(catalog: Catalog) -> None:
    first = _snapshot(catalog)
    catalog.attach_files(first, [FileRef(f"/o/chk-1/{i}", 1) for i in range(3)])
    catalog.fail_snapshot(first)
    token = catalog.acquire_lease("cleanup", "me", 60)
    assert catalog.forget_files("orders", ["/o/chk-1/2"], lease="cleanup", token=token) == 1
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.attach_files(second, [FileRef(f"/o/chk-2/{i}", 1) for i in range(3)])
    files = catalog.snapshot_files(second)
    assert len({f.file_id for f in files}) == 3
    assert {f.path for f in catalog.snapshot_files(first)} == {"/o/chk-1/0", "/o/chk-1/1"}


def _forgotten_shared_file(catalog: Catalog) -> tuple[FileRef, int]:
    """A shared file of a subsumed snapshot, forgotten by a deleter (as expire does); the
    PENDING snapshot that meant to reuse it."""
    first = _snapshot(catalog)
    sst = FileRef("/o/shared/1.sst", 500, checksum="c1", shared=True, operator="agg")
    catalog.attach_files(first, [sst])
    catalog.complete_snapshot(first, 0)
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.subsume_snapshot(first)
    token = catalog.acquire_lease("files", "expire", 60)
    assert catalog.forget_files("orders", [sst.path], lease="files", token=token) == 1
    return FileRef(sst.path, sst.size, sst.checksum, shared=True, reused=True), second


def test_a_reused_file_the_catalog_forgot_is_refused_and_nothing_is_kept(
    catalog: Catalog,
) -> None:
    reused, second = _forgotten_shared_file(catalog)
    new = FileRef("/o/shared/2.sst", 7, shared=True, operator="agg")
    with pytest.raises(ReusedFileMissing, match=r"reuses 1 file\(s\).*/o/shared/1.sst"):
        catalog.attach_files(second, [new, reused])
    assert catalog.snapshot_files(second) == []
    assert catalog.known_paths("orders") == set()
    # the same path written anew by the snapshot (not reused) is registered as its own
    fresh = FileRef(reused.path, reused.size, reused.checksum, shared=True)
    assert catalog.attach_files(second, [new, fresh]) == 2
    assert {f.created_by_snapshot_id for f in catalog.snapshot_files(second)} == {second}


@pytest.mark.postgres
def test_forgetting_locks_the_rows_a_concurrent_attach_would_reference(
    pg_catalog: Catalog, postgres_catalog_url: str
) -> None:
    """READ COMMITTED: without the row locks, an attach committing between forget_files' check
    of live_refs and its delete would lose its reference silently, and the file be deleted."""
    import psycopg

    catalog = pg_catalog
    first = _snapshot(catalog)
    sst = FileRef("/o/shared/1.sst", 500, checksum="c1", shared=True, operator="agg")
    catalog.attach_files(first, [sst])
    catalog.complete_snapshot(first, 0)
    catalog.subsume_snapshot(first)
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    token = catalog.acquire_lease("files", "expire", 60)
    dsn = postgres_catalog_url.replace("postgresql+psycopg://", "postgresql://")
    seen: list[str] = []

    def before_delete(conn, cursor, statement, params, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if seen or not statement.lstrip().upper().startswith("DELETE FROM SK_FILES"):
            return
        with psycopg.connect(dsn) as other:  # another session, as a running job's attach
            try:
                other.execute(
                    "SELECT id FROM sk_files WHERE path = %s FOR UPDATE NOWAIT", (sst.path,)
                )
                seen.append("unlocked")
            except psycopg.errors.LockNotAvailable:
                seen.append("locked")

    event.listen(catalog.engine, "before_cursor_execute", before_delete)
    try:
        assert catalog.forget_files("orders", [sst.path], lease="files", token=token) == 1
    finally:
        event.remove(catalog.engine, "before_cursor_execute", before_delete)
    assert seen == ["locked"]
    # the attach that waited finds the row gone and refuses the reference
    with pytest.raises(ReusedFileMissing):
        catalog.attach_files(second, [FileRef(sst.path, 500, "c1", shared=True, reused=True)])


def test_references_keep_their_details_order_and_subtasks_whatever_the_grouping(
    catalog: Catalog,
) -> None:
    """References are stored a group per operator subtask and key-group range: each still reads
    back with its own details, and a file two subtasks read is two references."""
    sid = _snapshot(catalog)
    refs = [
        FileRef("/o/shared/b.sst", 5, shared=True, operator="agg", subtask=1,
                key_group_start=64, key_group_end=127, details={"local_path": "000002.sst"}),
        FileRef("/o/shared/a.sst", 5, shared=True, operator="agg", subtask=0,
                key_group_start=0, key_group_end=63, details={"local_path": "000001.sst"}),
        FileRef("/o/shared/a.sst", 5, shared=True, operator="agg", subtask=1,
                key_group_start=64, key_group_end=127),
        FileRef("/o/chk-1/MANIFEST", 9, operator="agg", subtask=0,
                key_group_start=0, key_group_end=63, details={"role": "private", "n": [1, 2]}),
        FileRef("/o/chk-1/_metadata", 3),
    ]  # fmt: skip
    assert catalog.attach_files(sid, refs) == 5
    got = [
        (f.path, f.operator, f.subtask, f.key_group_start, f.key_group_end, f.details)
        for f in catalog.snapshot_files(sid)
    ]
    assert sorted(got, key=repr) == sorted(
        [
            (r.path, r.operator, r.subtask, r.key_group_start, r.key_group_end, r.details)
            for r in refs
        ],
        key=repr,
    )
    page = catalog.snapshot_files_page(sid, limit=2, offset=1)
    assert page.total == 5
    assert [f.path for f in page.items] == [f.path for f in catalog.snapshot_files(sid)][1:3]
    summary = catalog.snapshot_files_summary(sid)
    assert (summary.references, summary.files, summary.bytes) == (5, 4, 5 + 5 + 9 + 3)
    catalog.complete_snapshot(sid, 0)
    assert catalog.get_snapshot(sid).bytes == 22  # each file once


def test_forgetting_a_file_takes_it_out_of_the_dead_snapshots_references(catalog: Catalog) -> None:
    """A forgotten file leaves no reference behind: a new file that gets its id (SQLite hands
    out the highest id again) is not referenced by the dead snapshot, nor by another job's dead
    snapshot that referenced it as foreign."""
    first = _snapshot(catalog)
    own = FileRef("/o/chk-1/own", 10, operator="agg", details={"role": "private"})
    shared = FileRef("/o/shared/1.sst", 5, shared=True, operator="agg")
    catalog.attach_files(first, [shared, own])
    catalog.complete_snapshot(first, 0)
    child = _snapshot(catalog, "child")
    catalog.attach_files(child, [replace(shared, foreign=True)])
    catalog.complete_snapshot(child, 0)
    catalog.discard_snapshot(child)
    catalog.discard_snapshot(first)
    token = catalog.acquire_lease("files", "expire", 60)
    assert catalog.forget_files("orders", [own.path], lease="files", token=token) == 1
    assert [f.path for f in catalog.snapshot_files(first)] == [shared.path]
    assert catalog.forget_files("orders", [shared.path], lease="files", token=token) == 1
    assert catalog.snapshot_files(first) == catalog.snapshot_files(child) == []
    with catalog._read() as s:
        assert s.scalar(select(func.count()).select_from(ref)) == 0
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.attach_files(second, [FileRef("/o/chk-2/own", 10, operator="agg")])
    assert [f.path for f in catalog.snapshot_files(second)] == ["/o/chk-2/own"]
    assert catalog.snapshot_files(first) == catalog.snapshot_files(child) == []


def test_details_that_are_not_json_name_the_reference_and_attach_nothing(catalog: Catalog) -> None:
    sid = _snapshot(catalog)
    refs = [
        FileRef("/o/shared/1.sst", 5, shared=True, operator="agg", details={"ok": 1}),
        FileRef("/o/shared/2.sst", 5, shared=True, operator="agg", details={"bad": {1, 2}}),
    ]
    with pytest.raises(InvalidCatalogInput, match="/o/shared/2.sst"):
        catalog.attach_files(sid, refs)
    assert catalog.snapshot_files(sid) == []
    assert catalog.known_paths("orders") == set()


def test_details_that_contain_themselves_name_the_reference_and_attach_nothing(
    catalog: Catalog,
) -> None:
    sid = _snapshot(catalog)
    loop: dict[str, object] = {"role": "shared"}
    loop["again"] = loop
    group = FileGroup(
        ["/o/shared/1.sst", "/o/shared/2.sst"], [5, 5], True, [None, None], [None, loop]
    )
    with pytest.raises(InvalidCatalogInput, match="details of /o/shared/2.sst must be JSON"):
        catalog.attach_files(sid, [group])
    with pytest.raises(InvalidCatalogInput, match="common details of the group of /o/shared/1"):
        catalog.attach_files(sid, [FileGroup(["/o/shared/1.sst"], [5], True, common_details=loop)])
    assert catalog.snapshot_files(sid) == []
    assert catalog.known_paths("orders") == set()


def _listing(catalog: Catalog, snapshot_id: int) -> list[tuple[object, ...]]:
    return [
        (f.path.split("/", 2)[-1], f.size, f.checksum, f.shared, f.operator, f.subtask,
         f.key_group_start, f.key_group_end, f.details)
        for f in catalog.snapshot_files(snapshot_id)
    ]  # fmt: skip


def test_a_file_group_attaches_what_its_files_as_refs_would(catalog: Catalog) -> None:
    """The column form and the row form of the same references register the same files and
    read back the same, flags, checksums and details included; a path given in both forms of
    one call is one file."""
    group = FileGroup(
        ["shared/1.sst", "shared/2.sst", "chk-1/MANIFEST"],
        [5, 6, 7],
        [True, True, False],
        checksums=["c1", None, "c3"],
        details=[{"local_path": "000001.sst"}, None, {"role": "private"}],
        operator="agg",
        subtask=1,
        key_group_start=64,
        key_group_end=127,
    )
    listings = []
    for job, files in (
        ("as-groups", [replace(group, paths=[f"/as-groups/{p}" for p in group.paths])]),
        ("as-refs", [replace(r, path=f"/as-refs/{r.path}") for r in _rows(group)]),
    ):
        sid = _snapshot(catalog, job)
        assert catalog.attach_files(sid, [*files, FileRef(f"/{job}/chk-1/_metadata", 3)]) == 4
        listings.append(sorted(_listing(catalog, sid), key=repr))
    assert listings[0] == listings[1]
    sid = _snapshot(catalog, "both")
    twice = FileRef("/both/shared/1.sst", 5, shared=True, operator="agg")
    assert catalog.attach_files(sid, [FileGroup([twice.path], [5], True), twice]) == 2
    assert catalog.snapshot_files_summary(sid).files == 1


def test_a_groups_common_details_are_every_files_under_its_own(catalog: Catalog) -> None:
    """Details a group gives once read back as each file's, merged under the file's own (its own
    win on a key both give): the same listing as refs with the merged details. A forgotten file
    leaves the others their common details."""
    common = {"role": "shared", "kind": "shared"}
    own = [{"local_path": "000001.sst"}, None, {"kind": "foreign", "n": [1, 2]}]
    group = FileGroup(
        ["shared/1.sst", "shared/2.sst", "shared/3.sst"],
        [5, 6, 7],
        True,
        details=own,
        operator="agg",
        subtask=0,
        key_group_start=0,
        key_group_end=63,
        common_details=common,
    )
    merged = replace(group, details=[{**common, **(d or {})} for d in own], common_details=None)
    listings = []
    for job, g in (("common", group), ("merged", merged)):
        sid = _snapshot(catalog, job)
        catalog.attach_files(sid, [replace(g, paths=[f"/{job}/{p}" for p in g.paths])])
        listings.append(sorted(_listing(catalog, sid), key=repr))
    assert listings[0] == listings[1]
    assert [d for *_, d in listings[0]] == [
        {"role": "shared", "kind": "shared", "local_path": "000001.sst"},
        {"role": "shared", "kind": "shared"},
        {"role": "shared", "kind": "foreign", "n": [1, 2]},
    ]
    sid = catalog.list_snapshots("common")[0].id
    catalog.complete_snapshot(sid, 0)
    catalog.discard_snapshot(sid)
    token = catalog.acquire_lease("files", "expire", 60)
    catalog.forget_files("common", ["/common/shared/1.sst"], lease="files", token=token)
    assert [f.details for f in catalog.snapshot_files(sid)] == [
        {"role": "shared", "kind": "shared"},
        {"role": "shared", "kind": "foreign", "n": [1, 2]},
    ]


@pytest.mark.parametrize(
    ("common", "message"),
    [(["role", "shared"], "must be a dict"), ({"bad": {1, 2}}, "must be JSON")],
)
def test_common_details_that_are_not_a_json_object_are_refused_whole(
    catalog: Catalog, common: object, message: str
) -> None:
    sid = _snapshot(catalog)
    group = FileGroup(["/o/shared/1.sst"], [5], True, common_details=common)  # type: ignore[arg-type]
    with pytest.raises(
        InvalidCatalogInput, match=f"common details of the group of /o/shared/1.sst {message}"
    ):
        catalog.attach_files(sid, [FileRef("/o/ok", 1), group])
    assert catalog.snapshot_files(sid) == [] and catalog.known_paths("orders") == set()


def _rows(g: FileGroup) -> list[FileRef]:
    return [
        FileRef(path, g.sizes[i], checksum=(g.checksums or [None] * len(g.paths))[i],
                shared=g.shared if isinstance(g.shared, bool) else g.shared[i],
                operator=g.operator, subtask=g.subtask, key_group_start=g.key_group_start,
                key_group_end=g.key_group_end, details=(g.details or [None] * len(g.paths))[i])
        for i, path in enumerate(g.paths)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (FileGroup(["/o/a", "/o/b"], [1]), "2 paths but 1 sizes"),
        (FileGroup(["/o/a"], [1], [True, False]), "1 paths but 2 shared flags"),
        (FileGroup(["/o/a", "  "], [1, 2]), "a file path"),
        (FileGroup(["/o/a", "/o/b"], [1, -2]), "the size of /o/b"),
        (FileGroup(["/o/a", "/o/a"], [1, 2]), "/o/a is listed twice with different size"),
        (FileGroup(["/o/a"], [1], subtask=9), "the subtask of /o/a"),
        (FileGroup(["/o/a"], [1], key_group_start=3), "give both key_group_start"),
    ],
)
def test_a_bad_file_group_is_refused_whole(
    catalog: Catalog, group: FileGroup, message: str
) -> None:
    sid = _snapshot(catalog)
    with pytest.raises(InvalidCatalogInput, match=message):
        catalog.attach_files(sid, [FileRef("/o/ok", 1), group])
    assert catalog.snapshot_files(sid) == [] and catalog.known_paths("orders") == set()


# --- several snapshots in one call: the outcome of one call per snapshot, in order ---

#: per snapshot of the call: shared files read (number -> bytes read of a growing file, 0 for a
#: plain shared file), and whether it also names the first snapshot's exclusive file (refused)
ATTACHMENTS = st.lists(
    st.tuples(
        st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=5),
        st.sampled_from([False] * 9 + [True]),
    ),
    min_size=1,
    max_size=4,
)


def _attachments(job: str, i: int, files: dict[int, int], steal: int | None) -> list[FileRef]:
    """The files of the job's ``i``-th snapshot."""
    refs = [FileRef(f"/{job}/chk-{i}/_metadata", 7, operator="op")]
    for n, grown in sorted(files.items()):
        if grown:
            refs.append(FileRef(f"/{job}/merged/{n}", 10 + grown, shared=True, grows=True))
        else:
            refs.append(FileRef(f"/{job}/shared/{n}", n + 1, shared=True, operator="op"))
    if steal is not None:  # an exclusive file of another snapshot: refused
        refs.append(FileRef(f"/{job}/chk-{steal}/_metadata", 7))
    return refs


def _files_state(catalog: Catalog, job: str, order: list[int]) -> tuple[list, dict]:
    """The job's files and each snapshot's references, with paths and snapshot ids relative to
    the job (so two jobs' states compare)."""
    rank: dict[int | None, int] = {sid: i for i, sid in enumerate(order)}
    with catalog._read() as s:
        rows = s.execute(
            select(
                File.path, File.size, File.shared, File.created_by_snapshot_id,
                File.last_used_snapshot_id, File.live_refs,
            ).where(File.job_id == catalog.get_job(job).id)
        ).all()  # fmt: skip
    files = sorted(
        (p.replace(f"/{job}/", "/"), size, shared, rank.get(c), rank.get(u), n)
        for p, size, shared, c, u, n in rows
    )
    refs = {
        rank[sid]: sorted(f.path.replace(f"/{job}/", "/") for f in catalog.snapshot_files(sid))
        for sid in order
    }
    return files, refs


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(before=st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=4), calls=ATTACHMENTS)
def test_attaching_several_snapshots_at_once_is_attaching_them_one_by_one(
    catalog: Catalog, before: dict[int, int], calls: list[tuple[dict[int, int], bool]]
) -> None:
    """Files known before the call, files the call's first snapshot creates and the next ones
    reuse, files that grow, a snapshot with a partial earlier attach: the same files, counts,
    creators, last users and references as one attach_files per snapshot; a refused call keeps
    nothing."""
    outcomes: list[tuple[str, object]] = []
    for way in ("one-by-one", "at-once"):
        job = f"{way}-{len(catalog.list_jobs())}"
        catalog.register_job(job, max_parallelism=128)
        first = catalog.begin_snapshot(job, location=f"file:///{job}/0", parallelism=1)
        catalog.attach_files(first.id, _attachments(job, 0, before, None))
        catalog.complete_snapshot(first.id, first.version)
        sids = [
            catalog.begin_snapshot(job, location=f"file:///{job}/{i}", parallelism=1).id
            for i in range(1, len(calls) + 1)
        ]
        # the call's first snapshot already has one of its files (an earlier attach of it)
        catalog.attach_files(sids[0], [FileRef(f"/{job}/shared/0", 1, shared=True)])
        work = [
            (sid, _attachments(job, i, files, 0 if steal else None))
            for i, (sid, (files, steal)) in enumerate(zip(sids, calls, strict=True), 1)
        ]
        order = [first.id, *sids]
        before_call = _files_state(catalog, job, order)
        try:
            if way == "one-by-one":
                with catalog.batch():
                    for sid, refs in work:
                        catalog.attach_files(sid, refs)
            else:
                assert catalog.attach_files_many(work) == sum(len(r) for _, r in work)
        except FileAlreadyRegistered as exc:
            assert _files_state(catalog, job, order) == before_call
            outcomes.append(("refused", str(exc).split(" is already")[0].replace(f"/{job}/", "/")))
        else:
            outcomes.append(("attached", _files_state(catalog, job, order)))
    assert outcomes[0] == outcomes[1]


def test_attaching_to_snapshots_of_two_jobs_or_one_snapshot_twice_is_refused(
    catalog: Catalog,
) -> None:
    a, b = _snapshot(catalog, "a"), _snapshot(catalog, "b")
    with pytest.raises(InvalidCatalogInput, match="belong to different jobs"):
        catalog.attach_files_many([(a, [FileRef("/a/x", 1)]), (b, [FileRef("/b/x", 1)])])
    with pytest.raises(InvalidCatalogInput, match="appears twice"):
        catalog.attach_files_many([(a, [FileRef("/a/x", 1)]), (a, [FileRef("/a/y", 1)])])
    assert catalog.snapshot_files(a) == [] and catalog.snapshot_files(b) == []


@pytest.mark.parametrize("which", ["least", "greatest", "between"])
def test_a_known_file_is_found_wherever_its_path_sorts_among_the_new_ones(
    catalog: Catalog, which: str
) -> None:
    """The attach looks up the paths it is given (skipping the lookup only when no known path
    sorts between the least and the greatest of them): a known file at either end of that range,
    or inside it, is found as known: reused if shared, refused if another job's."""
    paths = {"least": "/o/shared/a", "between": "/o/shared/m", "greatest": "/o/shared/z"}
    first = _snapshot(catalog)
    catalog.attach_files(first, [FileRef(paths[which], 5, shared=True)])
    catalog.complete_snapshot(first, 0)
    refs = [FileRef(p, 5, shared=True) for p in paths.values()]
    other = _snapshot(catalog, "other")
    with pytest.raises(FileAlreadyRegistered, match=paths[which]):
        catalog.attach_files(other, refs)
    assert catalog.known_paths("other") == set()
    second = catalog.begin_snapshot("orders", location="file:///2", parallelism=4).id
    catalog.attach_files(second, refs)
    files = {f.path: f for f in catalog.snapshot_files(second)}
    assert files[paths[which]].created_by_snapshot_id == first
    assert {p for p, f in files.items() if f.created_by_snapshot_id == second} == set(
        paths.values()
    ) - {paths[which]}


@pytest.mark.parametrize("files", [1, 6, 7, 500, 1234])
def test_file_rows_land_whole_and_in_order_whatever_the_insert_statements(
    catalog: Catalog, files: int
) -> None:
    """SQLite takes a snapshot's new file rows in INSERTs of many rows each, as many as its
    bound-parameter limit allows: with a limit of 64 (6 rows of 10 values a statement) every
    row lands, with its values and its id in order, whatever the count and the last chunk."""
    if catalog.engine.dialect.name == "sqlite":
        import sqlite3

        catalog.engine.dispose()  # the next connection is made with the low limit

        @event.listens_for(catalog.engine, "connect")
        def _low_limit(dbapi_connection: sqlite3.Connection, _record: object) -> None:
            dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 64)

    sid = _snapshot(catalog)
    paths = [f"/orders/shared/{i:05d}.sst" for i in range(files)]
    sizes = [i * 3 for i in range(files)]
    catalog.attach_files(sid, [FileGroup(paths, sizes, shared=True, operator="agg")])
    got = catalog.snapshot_files(sid)
    expected = [(p, n, True) for p, n in zip(paths, sizes, strict=True)]
    assert [(f.path, f.size, f.shared) for f in got] == expected
    ids = [f.file_id for f in got]
    assert ids == list(range(ids[0], ids[0] + files))  # allocated in the order given
