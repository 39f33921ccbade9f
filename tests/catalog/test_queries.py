"""The questions people ask, through the repository and through the views in plain SQL."""

from __future__ import annotations

import pytest

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from state_engine.errors import QueryFailed, ReadOnlyViolation


def _history(catalog: Catalog) -> list[int]:
    """Three checkpoints of 'orders' growing by one file each; one of 'users'."""
    ids = []
    for job in ("orders", "users"):
        catalog.register_job(job, max_parallelism=4)
    for n in range(1, 4):
        snap = catalog.begin_snapshot("orders", location=f"file:///o/chk-{n}", parallelism=2)
        files = [FileRef(f"/o/shared/{k}", 100, shared=True, operator="agg") for k in range(n)]
        catalog.attach_files(snap.id, [*files, FileRef(f"/o/chk-{n}/meta", 1, operator="src")])
        catalog.record_key_group_stats(
            snap.id, [KeyGroupStatRow("agg", kg, rows=n if kg else 4 * n) for kg in range(4)]
        )
        catalog.complete_snapshot(snap.id, 0)
        ids.append(snap.id)
    users = catalog.begin_snapshot("users", location="file:///u", parallelism=1)
    catalog.attach_files(users.id, [FileRef("/u/x", 7)])
    catalog.complete_snapshot(users.id, 0)
    catalog.subsume_snapshot(ids[0])
    return ids


def test_latest_completed_snapshot_per_job(catalog: Catalog) -> None:
    ids = _history(catalog)
    catalog.begin_snapshot("orders", location="file:///o/pending", parallelism=2)
    assert catalog.latest_snapshot("orders").id == ids[-1]  # type: ignore[union-attr]  # the job has snapshots
    assert [(s.job, s.checkpoint_id) for s in catalog.latest_snapshots()] == [
        ("orders", 3),
        ("users", 1),
    ]
    rows = catalog.query("SELECT job, checkpoint_id FROM sk_v_latest_snapshots ORDER BY job").rows
    assert rows == [("orders", 3), ("users", 1)]


def test_state_size_over_time_per_operator(catalog: Catalog) -> None:
    _history(catalog)
    agg = catalog.state_size_history("orders", operator="agg")
    assert [(p.checkpoint_id, p.files, p.bytes, p.shared_bytes) for p in agg] == [
        (1, 1, 100, 100),
        (2, 2, 200, 200),
        (3, 3, 300, 300),
    ]
    assert [p.checkpoint_id for p in catalog.state_size_history("orders", limit=1)] == [3, 3]
    rows = catalog.query(
        "SELECT checkpoint_id, operator, bytes FROM sk_v_state_size "
        "WHERE job = 'orders' AND operator = 'src' ORDER BY checkpoint_id"
    ).rows
    assert rows == [(1, "src", 1), (2, "src", 1), (3, "src", 1)]


def test_key_group_skew_is_max_over_mean(catalog: Catalog) -> None:
    ids = _history(catalog)
    [skew] = catalog.key_group_skew(ids[1])  # rows per key group: 8, 2, 2, 2
    assert (skew.total_rows, skew.max_rows, skew.mean_rows) == (14, 8, 3.5)
    assert skew.skew == pytest.approx(8 / 3.5)
    [(value,)] = catalog.query(
        f"SELECT skew FROM sk_v_key_group_skew WHERE snapshot_id = {ids[1]}"
    ).rows
    assert float(value) == pytest.approx(8 / 3.5)


def test_orphan_candidates_and_snapshot_files_views(catalog: Catalog) -> None:
    ids = _history(catalog)
    assert {f.path for f in catalog.orphan_candidates()} == {"/o/chk-1/meta"}
    rows = catalog.query("SELECT job, path FROM sk_v_orphan_candidates").rows
    assert rows == [("orders", "/o/chk-1/meta")]
    rows = catalog.query(
        f"SELECT path FROM sk_v_snapshot_files WHERE snapshot_id = {ids[2]} ORDER BY path"
    ).rows
    assert [r[0] for r in rows] == ["/o/chk-3/meta", "/o/shared/0", "/o/shared/1", "/o/shared/2"]


def test_maintenance_history_view(catalog: Catalog) -> None:
    catalog.register_job("orders", max_parallelism=4)
    catalog.start_run("e-1", "expire", job="orders")
    catalog.fail_run("e-1", "boom")
    rows = catalog.query("SELECT run_id, job, status, error FROM sk_v_maintenance_history").rows
    assert rows == [("e-1", "orders", "FAILED", "boom")]


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO sk_jobs (name) VALUES ('x')",
        "SELECT 1; DROP TABLE sk_jobs",
        "-- a comment first\nDELETE FROM sk_jobs",
        "WITH j AS (SELECT 1) DELETE FROM sk_jobs",
        "",
    ],
)
def test_read_only_sql_refuses_writes(catalog: Catalog, sql: str) -> None:
    catalog.register_job("orders", max_parallelism=4)
    with pytest.raises(ReadOnlyViolation):
        catalog.query(sql)
    assert [j.name for j in catalog.list_jobs()] == ["orders"]


def test_a_write_hidden_from_the_keyword_check_is_refused_by_the_database(
    catalog: Catalog,
) -> None:
    catalog.register_job("orders", max_parallelism=4)
    if catalog.engine.dialect.name == "postgresql":
        sneaky = "EXPLAIN ANALYZE DELETE FROM sk_jobs"
    else:
        sneaky = "WITH j AS (SELECT 1) DELETE FROM sk_jobs"  # SQLite allows a CTE before DELETE
    with pytest.raises(ReadOnlyViolation, match="refused a write|not a query"):
        catalog.query(sneaky)
    if catalog.engine.dialect.name == "postgresql":
        with pytest.raises(ReadOnlyViolation, match="refused a write"):
            catalog.query(
                "WITH gone AS (DELETE FROM sk_jobs RETURNING id) SELECT count(*) FROM gone"
            )
    assert [j.name for j in catalog.list_jobs()] == ["orders"]
    # The connection went back to the pool writable.
    catalog.register_job("users", max_parallelism=4)


def test_a_broken_query_names_the_tables_and_views(catalog: Catalog) -> None:
    with pytest.raises(QueryFailed, match="sk_v_"):
        catalog.query("SELECT * FROM no_such_table")
    assert catalog.query("SELECT 1 AS one, 'a;b' AS s -- trailing;").rows == [(1, "a;b")]


def test_path_owners_names_the_job_of_each_known_path(catalog: Catalog) -> None:
    for job in ("a", "b"):
        catalog.register_job(job, max_parallelism=8)
        snap = catalog.begin_snapshot(job, location=f"file:///{job}/chk-1", parallelism=1)
        catalog.attach_files(
            snap.id, [FileRef(path=f"file:///{job}/chk-1/{n}", size=1) for n in range(3)]
        )
    wanted = ["file:///a/chk-1/0", "file:///b/chk-1/2", "file:///c/nowhere", "file:///a/chk-1/0"]
    assert catalog.path_owners(wanted) == {"file:///a/chk-1/0": "a", "file:///b/chk-1/2": "b"}
    assert catalog.path_owners([]) == {}


def test_path_owners_other_than_a_job_leaves_out_that_jobs_paths(catalog: Catalog) -> None:
    # ids in registration order: the job asked about sits between, below and above the others
    for job in ("a", "b", "c"):
        catalog.register_job(job, max_parallelism=8)
    wanted = [f"file:///{job}/chk-1/0" for job in ("a", "b", "c")]
    assert catalog.path_owners(wanted, other_than="a") == {}  # no file anywhere yet
    for job in ("a", "b", "c"):
        snap = catalog.begin_snapshot(job, location=f"file:///{job}/chk-1", parallelism=1)
        catalog.attach_files(snap.id, [FileRef(path=f"file:///{job}/chk-1/0", size=1)])
        held = {f"file:///{j}/chk-1/0": j for j in ("a", "b", "c")[: "abc".index(job) + 1]}
        assert catalog.path_owners(wanted, other_than=job) == {
            p: j for p, j in held.items() if j != job
        }
    assert catalog.path_owners(wanted, other_than="b") == {wanted[0]: "a", wanted[2]: "c"}
    assert catalog.path_owners(wanted, other_than="c") == {wanted[0]: "a", wanted[1]: "b"}
    # a job the catalog does not have yet (a first import): every known path is another's
    assert catalog.path_owners(wanted, other_than="new") == dict(zip(wanted, "abc", strict=True))
