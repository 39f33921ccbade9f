"""orphan_cleanup: old unreferenced files under a job's roots go; nothing a snapshot uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from state_engine.cli import main as statectl_main
from state_engine.errors import DeletionLeaseHeld, InvalidJobParams, NoSuchJob, NoSuchRun
from state_engine.jobs import __main__ as jobs_main
from state_engine.jobs import expire, orphan_cleanup
from state_engine.maintenance.deletion import file_lease_name  # type: ignore[attr-defined]  # re-exported
from tests.jobs.deletiondata import (
    JOB,
    checkpoints,
    close,
    exists,
    files_under,
    make_subtasks,
    manager,
    plant,
    referenced_urls,
    restored_state,
    set_age,
)

LEASE = file_lease_name(JOB)


@pytest.fixture
def job2(catalog, storage, tmp_path: Path):
    """Two completed delta checkpoints (files in chk-<n>/ and shared/), all files made old."""
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(catalog, storage, "delta") as m:
        records, states = checkpoints(m, subtasks, 2)
        for url in files_under(storage):
            set_age(url, 30)  # so age alone would not protect them
        yield m, records, states
    close(subtasks)


def plant_orphans(storage) -> dict[str, str]:
    return {
        "abandoned": plant(storage, f"{JOB}/chk-99/keyed-0-dead.parquet", b"x" * 100),
        "abandoned_meta": plant(storage, f"{JOB}/chk-99/_metadata.inprogress-1", b"{}"),
        "shared": plant(storage, f"{JOB}/shared/sst-0-9-lost.sst", b"y" * 50),
        "stray": plant(storage, f"{JOB}/chk-1/extra-file", b"z" * 7),
        "young": plant(storage, f"{JOB}/shared/just-written", b"new", age_days=0),
    }


def test_deletes_old_unreferenced_files_and_nothing_a_snapshot_uses(
    catalog, storage, job2, tmp_path
):
    m, records, states = job2
    orphans = plant_orphans(storage)
    referenced = referenced_urls(catalog, [r.id for r in records])
    assert referenced and all(exists(u) for u in referenced)

    report = orphan_cleanup.run(None, catalog, job=JOB)

    old = {k: v for k, v in orphans.items() if k != "young"}
    assert not any(exists(u) for u in old.values())
    assert exists(orphans["young"])
    assert not exists(orphans["abandoned"].rsplit("/", 1)[0])  # chk-99/ went with its files
    assert all(exists(u) for u in referenced)
    stats = report["stats"]
    assert stats["files_found"] == stats["files_deleted"] == 4
    assert stats["bytes_deleted"] == 100 + 2 + 50 + 7
    assert stats["kept_too_young"] == 1 and stats["dirs_removed"] == 1
    assert set(stats["deleted"]["items"]) == set(old.values())
    for r, state in zip(records, states, strict=True):
        assert restored_state(m, r.id, tmp_path) == state
    assert catalog.get_run(report["run_id"]).status == "SUCCEEDED"


def test_dry_run_lists_orphans_with_sizes_and_deletes_nothing(catalog, storage, job2):
    orphans = plant_orphans(storage)
    before = files_under(storage)
    dry = orphan_cleanup.run(None, catalog, job=JOB, dry_run=True, older_than="1d")["stats"]
    assert files_under(storage) == before
    listed = {i["path"]: i["size"] for i in dry["would_delete"]["items"]}
    assert listed == {
        orphans["abandoned"]: 100,
        orphans["abandoned_meta"]: 2,
        orphans["shared"]: 50,
        orphans["stray"]: 7,
    }
    assert dry["bytes_found"] == 159 and dry["files_deleted"] == 0
    real = orphan_cleanup.run(None, catalog, job=JOB, older_than="1d")["stats"]
    assert set(real["deleted"]["items"]) == set(listed)
    assert before - files_under(storage) == set(listed)


def test_releasable_files_are_left_to_expire(catalog, storage, job2):
    _, records, _ = job2
    catalog.subsume_snapshot(records[0].id)
    releasable = {f.path for f in catalog.releasable_files(JOB)}
    assert releasable  # known to the catalog, used by no retained snapshot
    report = orphan_cleanup.run(None, catalog, job=JOB, older_than=0)
    assert report["stats"]["files_deleted"] == 0
    assert all(exists(u) for u in releasable)
    assert expire.run(None, catalog, job=JOB, retain_last=1)["stats"]["files_deleted"] == len(
        releasable
    )


def test_savepoint_directories_elsewhere_are_cleaned_too(catalog, storage, tmp_path):
    subtasks = make_subtasks("heap", tmp_path / "db")
    elsewhere = (tmp_path / "exports" / "sp-1").as_uri()
    with manager(catalog, storage) as m:
        checkpoints(m, subtasks, 1)
        sp = m.trigger(subtasks, kind="SAVEPOINT", savepoint_dir=elsewhere).result()
    close(subtasks)
    assert sp.location.rstrip("/") == elsewhere
    sp_files = referenced_urls(catalog, [sp.id])
    for u in sp_files:
        set_age(u, 10)
    stray = elsewhere + "/leftover.parquet"
    Path(tmp_path / "exports" / "sp-1" / "leftover.parquet").write_bytes(b"l" * 11)
    set_age(stray, 10)

    report = orphan_cleanup.run(None, catalog, job=JOB)
    assert report["stats"]["deleted"]["items"] == [stray]
    assert not exists(stray) and all(exists(u) for u in sp_files)


def test_a_held_lease_refuses_without_waiting_and_deletes_nothing(catalog, storage, job2):
    orphans = plant_orphans(storage)
    token = catalog.acquire_lease(LEASE, "checkpoint-manager-abc", 60)
    with pytest.raises(DeletionLeaseHeld, match="held by 'checkpoint-manager-abc'"):
        orphan_cleanup.run(None, catalog, job=JOB, run_id="blocked")
    assert all(exists(u) for u in orphans.values())
    run = catalog.get_run("blocked")
    assert run.status == "FAILED" and "checkpoint-manager-abc" in run.error
    catalog.release_lease(LEASE, token)
    # the same run id, retried once the lease is free, does the work
    report = orphan_cleanup.run(None, catalog, job=JOB, run_id="blocked")
    assert report["attempt"] == 2 and report["stats"]["files_deleted"] == 4


@pytest.mark.parametrize(
    "params,error,match",
    [
        ({"job": "ghost"}, NoSuchJob, "not in the catalog"),
        ({"job": JOB, "older_than": "three days"}, InvalidJobParams, "not a duration"),
        ({"job": JOB, "older_than": -5}, InvalidJobParams, "negative"),
        ({"job": JOB, "wait": "forever"}, InvalidJobParams, "not a duration"),
    ],
)
def test_bad_input_deletes_nothing_and_records_no_run(catalog, storage, job2, params, error, match):
    plant_orphans(storage)
    before = files_under(storage)
    with pytest.raises(error, match=match):
        orphan_cleanup.run(None, catalog, run_id="bad", **params)
    assert files_under(storage) == before
    with pytest.raises(NoSuchRun):  # an argument error is not a run
        catalog.get_run("bad")


@pytest.mark.spark
def test_command_lines_and_spark_deletes(spark, catalog, catalog_url, storage, job2, monkeypatch,
                                         tmp_path, capsys):  # fmt: skip
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", storage.root_url)
    _, records, _ = job2
    orphans = plant_orphans(storage)
    code = jobs_main.main(
        ["orphan_cleanup", "--job", JOB, "--older-than", "1d", "--dry-run", "--run-id", "o-1"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["stats"]["files_found"] == 4 and all(exists(u) for u in orphans.values())

    assert statectl_main(["maintain", "expire", "--job", JOB, "--retain-last", "0"]) == 1
    assert "retain_last=0" in capsys.readouterr().err
    assert statectl_main(["maintain", "expire", "--job", JOB, "--retain-last", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["stats"]["snapshots_expired"] == 1
    assert catalog.get_snapshot(records[0].id).status == "DISCARDED"

    # a large deletion goes through a Spark job (threshold lowered to force it here)
    report = orphan_cleanup.run(spark, catalog, job=JOB, older_than="1d", spark_min_files=1)
    assert report["stats"]["files_deleted"] == 4
    assert not any(exists(u) for k, u in orphans.items() if k != "young")
