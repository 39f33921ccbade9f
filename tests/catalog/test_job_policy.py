"""A job's management policy: stored per job, defaulting by origin, migrated safe (0008)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from state_engine.catalog import Catalog, downgrade, parse_url, upgrade
from state_engine.errors import InvalidCatalogInput, NoSuchJob
from tests.fixtures.catalog import DATABASES


def test_a_new_job_gets_its_origins_default_and_keeps_a_policy_it_is_given(
    catalog: Catalog,
) -> None:
    assert catalog.register_job("sk", max_parallelism=8).manage == ("retention", "orphans")
    assert catalog.register_job("fl", max_parallelism=8, origin="flink").manage == ()
    given = catalog.register_job("fl2", max_parallelism=8, origin="flink", manage=["orphans"])
    assert given.manage == ("orphans",)
    # registering an existing job again keeps its policy, whatever the default
    catalog.set_job_policy("sk", [])
    assert catalog.register_job("sk", max_parallelism=8).manage == ()
    assert catalog.get_job("sk").manage == ()


def test_set_policy_stores_each_action_once_in_a_fixed_order(catalog: Catalog) -> None:
    catalog.register_job("fl", max_parallelism=8, origin="flink")
    job = catalog.set_job_policy("fl", ["orphans", "retention", "orphans"])
    assert job.manage == ("retention", "orphans")
    assert [j.manage for j in catalog.list_jobs()] == [("retention", "orphans")]
    assert catalog.set_job_policy("fl", []).manage == ()
    assert catalog.get_job("fl").manage == ()


@pytest.mark.parametrize("bad", [["compaction"], "retention", ["retention", "ttl"]])
def test_an_unknown_action_is_refused_and_nothing_changes(catalog: Catalog, bad: object) -> None:
    catalog.register_job("fl", max_parallelism=8, origin="flink", manage=["retention"])
    with pytest.raises(InvalidCatalogInput, match="retention, orphans|list of actions"):
        catalog.set_job_policy("fl", bad)  # type: ignore[arg-type]
    assert catalog.get_job("fl").manage == ("retention",)


def test_the_policy_of_an_unknown_job_is_refused(catalog: Catalog) -> None:
    with pytest.raises(NoSuchJob, match="statectl jobs"):
        catalog.set_job_policy("nope", ["orphans"])


@pytest.fixture(params=DATABASES)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    make: Callable[[], str] = request.getfixturevalue("make_pg_database")
    return make()


def test_0008_makes_imported_flink_jobs_read_only_and_keeps_statekeeper_jobs_managed(
    empty_url: str,
) -> None:
    upgrade(empty_url, "0007")
    engine = create_engine(parse_url(empty_url))
    try:
        with engine.begin() as conn:
            for name, origin in (("sk", "statekeeper"), ("fl", "flink")):
                conn.execute(
                    text(
                        "INSERT INTO sk_jobs (name, max_parallelism, properties, created_at, "
                        "origin) VALUES (:n, 8, '{}', CURRENT_TIMESTAMP, :o)"
                    ),
                    {"n": name, "o": origin},
                )
    finally:
        engine.dispose()
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        assert {j.name: j.manage for j in cat.list_jobs()} == {
            "fl": (),
            "sk": ("retention", "orphans"),
        }
    downgrade(empty_url, "0007")
    upgrade(empty_url)
    with Catalog.open(empty_url) as cat:
        assert cat.get_job("sk").manage == ("retention", "orphans")
