"""The schema: models and migrations agree, migrations go up and down, versions are guarded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, create_engine, inspect, text
from sqlalchemy.pool import StaticPool

from state_engine.catalog import (
    VERSION_TABLE,
    Catalog,
    FileGroup,
    current_revision,
    downgrade,
    head_revision,
    parse_url,
    upgrade,
)
from state_engine.catalog.models import Base
from state_engine.errors import CatalogUnreachable, CatalogVersionMismatch, CommitConflict
from tests.fixtures.catalog import DATABASES

VIEWS = {
    "sk_v_latest_snapshots",
    "sk_v_state_size",
    "sk_v_snapshot_files",
    "sk_v_orphan_candidates",
    "sk_v_key_group_skew",
    "sk_v_maintenance_history",
}


@pytest.fixture(params=DATABASES)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database without any catalog schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'catalog.db'}"
    make: Callable[[], str] = request.getfixturevalue("make_pg_database")
    return make()


def test_models_and_migrations_agree(catalog_url: str) -> None:
    engine = create_engine(parse_url(catalog_url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_upgrade_from_base_to_head_and_back_down(empty_url: str) -> None:
    assert current_revision(empty_url) is None
    before, after = upgrade(empty_url)
    assert (before, after) == (None, head_revision())
    engine = create_engine(parse_url(empty_url))
    try:
        names = inspect(engine)
        assert {"sk_jobs", "sk_snapshots", "sk_files", "sk_leases"} <= set(names.get_table_names())
        assert set(names.get_view_names()) >= VIEWS
        assert upgrade(empty_url) == (head_revision(), head_revision())  # a no-op at head
        downgrade(empty_url)
        assert current_revision(empty_url) is None
        names = inspect(engine)
        assert not [t for t in names.get_table_names() if t.startswith("sk_")]
        assert not [v for v in names.get_view_names() if v.startswith("sk_")]
        upgrade(empty_url)
        assert current_revision(empty_url) == head_revision()
    finally:
        engine.dispose()


def test_opening_a_catalog_that_was_never_migrated_names_the_upgrade(empty_url: str) -> None:
    with pytest.raises(CatalogVersionMismatch, match="run `statectl catalog upgrade`"):
        Catalog.open(empty_url)
    if empty_url.startswith("sqlite"):
        assert not Path(parse_url(empty_url).database or "").exists()  # asking created nothing


def _stamp(url: str, revision: str | None) -> None:
    engine = create_engine(parse_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {VERSION_TABLE}"))
            if revision is not None:
                conn.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES (:r)"), {"r": revision})
    finally:
        engine.dispose()


def test_a_catalog_ahead_of_the_code_is_refused(catalog_url: str) -> None:
    _stamp(catalog_url, "9999_from_the_future")
    try:
        with pytest.raises(CatalogVersionMismatch, match="older than the catalog; upgrade"):
            Catalog.open(catalog_url)
        with pytest.raises(CatalogVersionMismatch, match="9999_from_the_future"):
            upgrade(catalog_url)
    finally:
        _stamp(catalog_url, head_revision())  # the PostgreSQL catalog is shared by the session
    Catalog.open(catalog_url).close()


def test_a_catalog_behind_the_code_is_refused(catalog_url: str) -> None:
    _stamp(catalog_url, None)
    try:
        with pytest.raises(CatalogVersionMismatch, match="statectl catalog upgrade"):
            Catalog.open(catalog_url)
    finally:
        _stamp(catalog_url, head_revision())


@pytest.mark.parametrize(
    "url",
    ["not a url", "sqlite//missing-colon", "mysql://u@h/db", "postgresql://u@h:notaport/db"],
)
def test_a_malformed_catalog_url_is_a_clear_error(url: str) -> None:
    with pytest.raises(CatalogUnreachable, match="catalog"):
        Catalog.open(url)


def test_an_unreachable_catalog_is_a_clear_error() -> None:
    with pytest.raises(CatalogUnreachable, match="cannot connect"):
        Catalog.open("postgresql://postgres@127.0.0.1:1/nothing")


def test_postgresql_urls_use_psycopg() -> None:
    assert parse_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url("postgres://u@h/db").drivername == "postgresql+psycopg"


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(url)
    with Catalog.open(url) as cat, cat.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        busy_timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        assert busy_timeout is not None and busy_timeout >= 1000


def test_0005_keeps_every_row_moves_discard_stamps_and_frees_discarded_checkpoint_ids(
    empty_url: str,
) -> None:
    """Revision 0005 rebuilds sk_snapshots on SQLite: nothing that references a snapshot may go
    (a cascading delete would take the file references with it), the expired Flink snapshots'
    ``_metadata`` stamps move from ``error`` into ``details``, and a DISCARDED snapshot's
    checkpoint id may be taken again while a live one's may not."""
    upgrade(empty_url, "0004")
    note = (
        "expired; its _metadata was 912 bytes, modified at 1764000000.25, changed at "
        "1764000001.5 (epoch s)"
    )
    engine = create_engine(parse_url(empty_url))
    try:
        with engine.begin() as conn:  # the code is at head: rows of revision 0004 by hand
            now = "2026-11-25 10:00:00"
            job_id = conn.execute(
                text(
                    "INSERT INTO sk_jobs (name, max_parallelism, properties, created_at, origin) "
                    "VALUES ('j', 8, '{}', :now, 'flink') RETURNING id"
                ),
                {"now": now},
            ).scalar_one()
            ids = {}
            for cid, status, error in ((1, "COMPLETED", None), (2, "DISCARDED", note)):
                sid = ids[cid] = conn.execute(
                    text(
                        "INSERT INTO sk_snapshots (job_id, checkpoint_id, kind, format, status, "
                        "parallelism, max_parallelism, location, bytes, entries, created_at, "
                        "trigger, version, error) VALUES (:job, :cid, 'CHECKPOINT', 'NATIVE', "
                        ":status, 1, 8, :loc, 0, 0, :now, 'import', 0, :error) RETURNING id"
                    ),
                    {
                        "job": job_id,
                        "cid": cid,
                        "status": status,
                        "loc": f"file:///j/chk-{cid}",
                        "now": now,
                        "error": error,
                    },  # fmt: skip
                ).scalar_one()
                fid = conn.execute(
                    text(
                        "INSERT INTO sk_files (job_id, path, size, shared, live_refs, "
                        "created_at, created_by_snapshot_id) VALUES (:job, :path, 3, false, "
                        ":refs, :now, :sid) RETURNING id"
                    ),
                    {
                        "job": job_id,
                        "path": f"file:///j/chk-{cid}/f",
                        "refs": int(cid == 1),
                        "now": now,
                        "sid": sid,
                    },  # fmt: skip
                ).scalar_one()
                conn.execute(
                    text(
                        "INSERT INTO sk_snapshot_files (snapshot_id, file_id) VALUES (:sid, :fid)"
                    ),
                    {"sid": sid, "fid": fid},
                )
    finally:
        engine.dispose()
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        for cid, sid in ids.items():
            assert [f.path for f in cat.snapshot_files(sid)] == [f"file:///j/chk-{cid}/f"]
        record = cat.get_snapshot(ids[2])
        assert record.details == {
            "discarded_metadata": {"size": 912, "modified": 1764000000.25, "changed": 1764000001.5}
        }
        again = cat.begin_snapshot("j", location="file:///j/chk-2", parallelism=1, checkpoint_id=2)
        assert again.id != ids[2]
        with pytest.raises(CommitConflict):
            cat.begin_snapshot("j", location="file:///j/x", parallelism=1, checkpoint_id=1)
    with pytest.raises(RuntimeError, match="checkpoint id 2 on more than one snapshot"):
        downgrade(empty_url, "0004")
    assert current_revision(empty_url) == head_revision()


def test_0009_tells_imported_snapshots_their_reader_and_how_their_entries_were_got(
    empty_url: str,
) -> None:
    """Rows of revision 0007: imported ones read as Flink's, keep their import time as
    ``imported_at`` and are 'not counted' unless canonical with entries; others by format."""
    upgrade(empty_url, "0007")
    engine = create_engine(parse_url(empty_url))
    rows = {  # checkpoint id: (trigger, format, entries, bytes)
        1: ("flink-import", "NATIVE", 0, 500),
        2: ("flink-import", "CANONICAL", 40, 500),
        3: ("flink-import", "CANONICAL", 0, 500),
        4: ("periodic", "NATIVE", 7, 500),
        5: ("periodic", "CANONICAL", 7, 500),
    }
    try:
        with engine.begin() as conn:
            now = "2026-11-25 10:00:00"
            job_id = conn.execute(
                text(
                    "INSERT INTO sk_jobs (name, max_parallelism, properties, created_at, origin) "
                    "VALUES ('j', 8, '{}', :now, 'flink') RETURNING id"
                ),
                {"now": now},
            ).scalar_one()
            for cid, (trigger, fmt, entries, size) in rows.items():
                conn.execute(
                    text(
                        "INSERT INTO sk_snapshots (job_id, checkpoint_id, kind, format, status, "
                        "parallelism, max_parallelism, location, bytes, entries, created_at, "
                        "completed_at, trigger, version) VALUES (:job, :cid, 'CHECKPOINT', :fmt, "
                        "'COMPLETED', 1, 8, :loc, :size, :entries, :now, :now, :trigger, 1)"
                    ),
                    {"job": job_id, "cid": cid, "fmt": fmt, "loc": f"file:///j/chk-{cid}",
                     "size": size, "entries": entries, "now": now, "trigger": trigger},
                )  # fmt: skip
    finally:
        engine.dispose()
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        snaps = {s.checkpoint_id: s for s in cat.list_snapshots("j")}
    assert {c: s.metadata_format for c, s in snaps.items()} == {
        1: "flink", 2: "flink", 3: "flink", 4: "statekeeper", 5: "statekeeper"
    }  # fmt: skip
    assert {c: s.entries_basis for c, s in snaps.items()} == {
        1: "not-counted", 2: "counted", 3: "not-counted", 4: "estimated", 5: "counted"
    }  # fmt: skip
    assert all((s.imported_at is not None) == (c <= 3) for c, s in snaps.items())
    assert snaps[1].imported_at == snaps[1].completed_at
    downgrade(empty_url, "0007")
    assert current_revision(empty_url) == "0007"


def test_migrations_leave_sqlite_foreign_keys_enforced(tmp_path: Path) -> None:
    """The rebuild runs with SQLite's foreign keys off; an engine handed in gets them back."""
    from state_engine.catalog.engine import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}", poolclass=StaticPool)
    try:
        upgrade(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_0006_groups_every_reference_and_a_downgrade_unnests_them(empty_url: str) -> None:
    """Revision 0006 moves sk_snapshot_files rows into groups per snapshot, operator subtask and
    key-group range: every reference reads back with its subtask, range and details, another
    job's reference stays a reference elsewhere, and a downgrade gives the rows back."""
    upgrade(empty_url, "0005")
    engine = create_engine(parse_url(empty_url))
    now = "2026-11-28 10:00:00"

    def insert(conn, sql: str, **params: object) -> int:  # type: ignore[no-untyped-def]
        return int(conn.execute(text(sql + " RETURNING id"), params).scalar_one())

    # (snapshot, file, subtask, key groups, details): snapshot 2 is job "b"'s, its reference
    # to job "a"'s shared file a foreign one
    refs = [
        (1, "a.sst", 0, (0, 3), '{"local_path": "000001.sst"}'),
        (1, "own", 0, (0, 3), None),
        (1, "a.sst", 1, (4, 7), '{"local_path": "000001.sst"}'),
        (2, "a.sst", None, None, None),
    ]
    try:
        with engine.begin() as conn:
            jobs = {
                name: insert(
                    conn,
                    "INSERT INTO sk_jobs (name, max_parallelism, properties, created_at, origin) "
                    "VALUES (:name, 8, '{}', :now, 'flink')",
                    name=name,
                    now=now,
                )
                for name in ("a", "b")
            }
            op_id = insert(
                conn,
                "INSERT INTO sk_operators (job_id, uid, created_at) VALUES (:job, 'agg', :now)",
                job=jobs["a"],
                now=now,
            )
            snaps = {
                n: insert(
                    conn,
                    "INSERT INTO sk_snapshots (job_id, checkpoint_id, kind, format, status, "
                    "parallelism, max_parallelism, location, bytes, entries, created_at, "
                    "trigger, version) VALUES (:job, :n, 'CHECKPOINT', 'NATIVE', 'COMPLETED', "
                    "2, 8, :loc, 0, 0, :now, 'import', 0)",
                    job=jobs["a" if n == 1 else "b"],
                    n=n,
                    loc=f"file:///s/{n}",
                    now=now,
                )
                for n in (1, 2)
            }
            files = {
                name: insert(
                    conn,
                    "INSERT INTO sk_files (job_id, path, size, shared, live_refs, created_at, "
                    "created_by_snapshot_id) VALUES (:job, :path, 3, :shared, :refs, :now, :sid)",
                    job=jobs["a"],
                    path=f"file:///a/{name}",
                    shared=name == "a.sst",
                    refs=2 if name == "a.sst" else 1,
                    now=now,
                    sid=snaps[1],
                )
                for name in ("a.sst", "own")
            }
            for n, name, subtask, kgs, details in refs:
                conn.execute(
                    text(
                        "INSERT INTO sk_snapshot_files (snapshot_id, file_id, operator_id, "
                        "subtask, key_group_start, key_group_end, details) VALUES "
                        "(:sid, :fid, :op, :subtask, :start, :end, "
                        f"{'NULL' if details is None else ':details'})"
                    ),
                    {
                        "sid": snaps[n],
                        "fid": files[name],
                        "op": op_id if n == 1 else None,
                        "subtask": subtask,
                        "start": kgs and kgs[0],
                        "end": kgs and kgs[1],
                        "details": details,
                    },
                )
    finally:
        engine.dispose()

    def expected(n: int) -> list[tuple[object, ...]]:
        return sorted(
            (f"file:///a/{name}", subtask, kgs, None if d is None else json.loads(d))
            for m, name, subtask, kgs, d in refs
            if m == n
        )

    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        for n in (1, 2):
            got = sorted(
                (
                    f.path,
                    f.subtask,
                    None if f.key_group_start is None else (f.key_group_start, f.key_group_end),
                    f.details,
                )
                for f in cat.snapshot_files(snaps[n])
            )
            assert got == expected(n)
        assert cat.paths_referenced_elsewhere("a") == {"file:///a/a.sst"}
        assert cat.paths_referenced_elsewhere("b") == set()
        with cat.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM sk_v_snapshot_files")).scalar() == 4
    downgrade(empty_url, "0005")
    engine = create_engine(parse_url(empty_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT snapshot_id, file_id, subtask, key_group_start, key_group_end, "
                    "details FROM sk_snapshot_files"
                ).columns(details=JSON)
            ).all()
    finally:
        engine.dispose()
    assert sorted(rows, key=repr) == sorted(
        [
            (
                snaps[n],
                files[name],
                subtask,
                kgs and kgs[0],
                kgs and kgs[1],
                None if d is None else json.loads(d),
            )
            for n, name, subtask, kgs, d in refs
        ],
        key=repr,
    )


def test_0007_downgrade_folds_common_details_into_every_files_entry(empty_url: str) -> None:
    """A group's common details (revision 0007) are every file's after a downgrade: each file's
    entry holds them under its own, so no reference loses what the writer recorded."""
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        cat.register_job("a", max_parallelism=8)
        sid = cat.begin_snapshot("a", location="file:///a/chk-1", parallelism=1).id
        cat.attach_files(
            sid,
            [
                FileGroup(
                    ["file:///a/shared/1", "file:///a/shared/2"],
                    [3, 4],
                    True,
                    details=[{"local_path": "000001.sst"}, None],
                    common_details={"role": "shared", "kind": "shared"},
                ),
                FileGroup(["file:///a/chk-1/_metadata"], [5]),
            ],
        )
        before = sorted((f.path, f.details) for f in cat.snapshot_files(sid))
    assert before[1:] == [
        ("file:///a/shared/1", {"role": "shared", "kind": "shared", "local_path": "000001.sst"}),
        ("file:///a/shared/2", {"role": "shared", "kind": "shared"}),
    ]
    downgrade(empty_url, "0006")
    engine = create_engine(parse_url(empty_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT details FROM sk_snapshot_file_groups ORDER BY id").columns(
                    details=JSON
                )
            ).all()
            columns = {c["name"] for c in inspect(conn).get_columns("sk_snapshot_file_groups")}
    finally:
        engine.dispose()
    assert "common_details" not in columns
    assert [r[0] for r in rows] == [[before[1][1], before[2][1]], None]
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        assert sorted((f.path, f.details) for f in cat.snapshot_files(sid)) == before
