"""Pages cut in the database: offset, limit and a total that agrees with the items."""

from __future__ import annotations

import pytest

from state_engine.catalog import Catalog, FileRef, FilesSummary, KeyGroupStatRow, Page
from state_engine.errors import InvalidCatalogInput, NoSuchJob, NoSuchSnapshot


def _pages(fetch, size: int) -> list:  # noqa: ANN001
    """Every item, page by page, checking each page's bookkeeping on the way."""
    items, offset = [], 0
    while True:
        page = fetch(limit=size, offset=offset)
        assert isinstance(page, Page)
        assert (page.offset, page.limit) == (offset, size)
        assert len(page.items) <= size
        items.extend(page.items)
        offset += size
        if not page.has_more:
            assert len(items) == page.total
            return items


def test_jobs_page_through_in_name_order(catalog: Catalog) -> None:
    for name in ["c", "a", "e", "b", "d"]:
        catalog.register_job(name, max_parallelism=8)
    assert [j.name for j in _pages(catalog.jobs_page, 2)] == ["a", "b", "c", "d", "e"]
    assert [j.name for j in catalog.list_jobs(limit=2, offset=3)] == ["d", "e"]
    assert catalog.jobs_page(limit=0).total == 5  # a count without rows
    assert catalog.jobs_page(offset=10) == Page([], 5, 10, None)


def test_snapshots_page_filters_before_counting(catalog: Catalog) -> None:
    catalog.register_job("j", max_parallelism=8)
    for n in range(7):
        snap = catalog.begin_snapshot("j", location=f"file:///{n}", parallelism=1)
        if n % 2 == 0:
            catalog.complete_snapshot(snap.id, snap.version)
    every = catalog.list_snapshots("j")
    assert _pages(lambda **kw: catalog.snapshots_page("j", **kw), 3) == every
    done = catalog.snapshots_page("j", status="COMPLETED", limit=2, offset=1)
    assert done.total == 4
    assert [s.checkpoint_id for s in done.items] == [5, 3]
    assert [s.checkpoint_id for s in catalog.list_snapshots("j", limit=2, offset=5)] == [2, 1]
    assert catalog.snapshots_page("j", kind="SAVEPOINT").total == 0
    with pytest.raises(NoSuchJob):
        catalog.snapshots_page("nope")


def test_snapshot_files_page_has_no_overlap_when_one_path_has_several_subtasks(
    catalog: Catalog,
) -> None:
    catalog.register_job("j", max_parallelism=64)
    sid = catalog.begin_snapshot("j", location="file:///1", parallelism=4).id
    refs = [
        FileRef(f"/j/{p}", 10 + p, shared=p % 2 == 1, operator="op", subtask=sub,
                key_group_start=16 * sub, key_group_end=16 * sub + 15)
        for p in range(5)
        for sub in range(3)
    ]  # fmt: skip
    catalog.attach_files(sid, refs)
    whole = catalog.snapshot_files(sid)
    assert len(whole) == 15
    paged = _pages(lambda **kw: catalog.snapshot_files_page(sid, **kw), 4)
    assert paged == whole
    assert catalog.snapshot_files(sid, limit=3, offset=14) == whole[14:]
    assert catalog.snapshot_files_summary(sid) == FilesSummary(
        references=15, files=5, bytes=10 + 11 + 12 + 13 + 14, shared_files=2, shared_bytes=11 + 13
    )
    with pytest.raises(NoSuchSnapshot):
        catalog.snapshot_files_page(sid + 100)


def test_size_history_page_walks_points_oldest_first(catalog: Catalog) -> None:
    catalog.register_job("j", max_parallelism=8)
    for n in range(4):
        snap = catalog.begin_snapshot("j", location=f"file:///{n}", parallelism=1)
        catalog.attach_files(
            snap.id, [FileRef(f"/j/{n}/{op}", 100 * n + 1, operator=op) for op in ("a", "b")]
        )
        catalog.record_key_group_stats(snap.id, [KeyGroupStatRow("a", 0, rows=n)])
        catalog.complete_snapshot(snap.id, snap.version)
    whole = catalog.state_size_history("j")
    assert [(p.checkpoint_id, p.operator) for p in whole][:3] == [(1, "a"), (1, "b"), (2, "a")]
    assert _pages(lambda **kw: catalog.size_history_page("j", **kw), 3) == whole
    only_b = catalog.size_history_page("j", operator="b", limit=2, offset=2)
    assert only_b.total == 4
    assert [p.checkpoint_id for p in only_b.items] == [3, 4]


def test_runs_page_newest_first_with_filters(catalog: Catalog, clock) -> None:  # noqa: ANN001
    catalog.register_job("j", max_parallelism=8)
    for n in range(5):
        catalog.start_run(f"r{n}", "compaction" if n % 2 else "expire", job="j")
        clock.advance(1)
    everything = catalog.list_runs(limit=None)
    assert [r.run_id for r in everything] == ["r4", "r3", "r2", "r1", "r0"]
    assert _pages(lambda **kw: catalog.runs_page(**kw), 2) == everything
    page = catalog.runs_page(kind="expire", limit=1, offset=1)
    assert (page.total, [r.run_id for r in page.items]) == (3, ["r2"])
    assert [r.run_id for r in catalog.list_runs(limit=2, offset=3)] == ["r1", "r0"]


@pytest.mark.parametrize("bad", [{"limit": -1}, {"offset": -1}, {"offset": True}])
def test_negative_windows_are_refused(catalog: Catalog, bad: dict) -> None:
    with pytest.raises(InvalidCatalogInput, match="limit|offset"):
        catalog.jobs_page(**bad)
