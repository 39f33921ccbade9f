"""expire: retention over real checkpoints of a CheckpointManager; only unreferenced files go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from state_engine.errors import (
    InvalidJobParams,
    MaintenanceJobFailed,
    NoSuchJob,
    NoSuchRun,
    NoSuchSnapshot,
    RetentionRemovesEverything,
)
from state_engine.jobs import expire
from state_engine.maintenance import deletion
from tests.jobs.deletiondata import (
    JOB,
    checkpoints,
    close,
    exists,
    files_under,
    make_subtasks,
    manager,
    referenced_urls,
    restored_state,
)


@pytest.fixture
def job4(catalog, storage, tmp_path: Path):
    """Four completed canonical checkpoints and the state each holds."""
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(catalog, storage) as m:
        records, states = checkpoints(m, subtasks, 4)
        yield m, records, states
    close(subtasks)


def test_retain_last_expires_older_checkpoints_and_their_files(catalog, storage, job4, tmp_path):
    m, records, states = job4
    old, kept = records[:2], records[2:]
    old_files = referenced_urls(catalog, [r.id for r in old])
    kept_files = referenced_urls(catalog, [r.id for r in kept])
    sizes = {f.path: f.size for r in old for f in catalog.snapshot_files(r.id)}

    report = expire.run(None, catalog, job=JOB, retain_last=2)

    assert [catalog.get_snapshot(r.id).status for r in records] == [
        "DISCARDED",
        "DISCARDED",
        "COMPLETED",
        "COMPLETED",
    ]
    assert not any(exists(u) for u in old_files)
    assert all(exists(u) for u in kept_files)
    assert not any(exists(r.location) for r in old)  # the emptied chk-<n>/ went too
    stats = report["stats"]
    assert stats["snapshots_expired"] == 2 and stats["checkpoints_kept"] == 2
    assert stats["files_deleted"] == len(old_files)
    assert stats["bytes_deleted"] == sum(sizes.values())
    assert {e["id"] for e in stats["expired"]} == {r.id for r in old}
    assert catalog.releasable_files(JOB) == []
    for r, state in zip(kept, states[2:], strict=True):
        assert restored_state(m, r.id, tmp_path) == state
    run = catalog.get_run(report["run_id"])
    assert run.status == "SUCCEEDED" and run.params["retain_last"] == 2
    assert run.stats["stats"]["files_deleted"] == len(old_files)


def test_shared_files_of_a_delta_chain_survive_while_the_latest_uses_them(
    catalog, storage, tmp_path
):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(catalog, storage, "delta", full_every=8) as m:
        records, states = checkpoints(m, subtasks, 3)
        latest = records[-1]
        latest_files = referenced_urls(catalog, [latest.id])
        shared = {u for u in latest_files if "/shared/" in u}
        assert shared  # the chain's base and deltas live in shared/
        older = referenced_urls(catalog, [r.id for r in records[:-1]])
        assert older & shared  # and the older checkpoints use them too

        report = expire.run(None, catalog, job=JOB, retain_last=1)

        assert report["stats"]["snapshots_expired"] == 2
        assert all(exists(u) for u in latest_files)
        assert not any(exists(u) for u in older - latest_files)
        assert report["stats"]["files_deleted"] == len(older - latest_files)
        assert restored_state(m, latest.id, tmp_path) == states[-1]
        # the running manager keeps checkpointing on the chain it still holds
        more, more_states = checkpoints(m, subtasks, 1, start=3)
        assert restored_state(m, more[0].id, tmp_path) == more_states[0]
    close(subtasks)


def test_older_than_never_takes_the_latest_and_refuses_to_take_all(catalog, storage, job4):
    _, records, _ = job4
    before = files_under(storage)
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    with pytest.raises(RetentionRemovesEverything, match="latest"):
        expire.run(None, catalog, job=JOB, older_than=future, run_id="all-of-them")
    assert files_under(storage) == before
    assert all(catalog.get_snapshot(r.id).status == "COMPLETED" for r in records)
    with pytest.raises(NoSuchRun):  # refused for its arguments before it touched anything
        catalog.get_run("all-of-them")

    report = expire.run(None, catalog, job=JOB, older_than="0s", retain_last=1)
    assert report["stats"]["snapshots_expired"] == 3
    assert catalog.get_snapshot(records[-1].id).status == "COMPLETED"
    # a cut-off before every checkpoint expires nothing
    report = expire.run(None, catalog, job=JOB, older_than="2000-01-01T00:00:00Z")
    assert report["stats"]["snapshots_expired"] == 0 and report["stats"]["files_deleted"] == 0


def test_dry_run_reports_exactly_what_the_real_run_deletes(catalog, storage, job4):
    _, records, _ = job4
    before = files_under(storage)
    dry = expire.run(None, catalog, job=JOB, retain_last=1, dry_run=True)["stats"]
    assert files_under(storage) == before
    assert all(catalog.get_snapshot(r.id).status == "COMPLETED" for r in records)
    assert [e["id"] for e in dry["would_expire"]] == [r.id for r in records[2::-1]]
    would = {item["path"] for item in dry["would_delete"]["items"]}
    assert dry["files_deleted"] == 0 and dry["files_found"] == len(would) > 0

    real = expire.run(None, catalog, job=JOB, retain_last=1)["stats"]
    assert set(real["deleted"]["items"]) == would
    assert real["bytes_deleted"] == dry["bytes_found"]
    assert before - files_under(storage) == would


def test_savepoints_go_only_when_named(catalog, storage, tmp_path):
    subtasks = make_subtasks("heap", tmp_path / "db")
    with manager(catalog, storage) as m:
        checkpoints(m, subtasks, 1)
        sp1 = m.trigger(subtasks, kind="SAVEPOINT").result()
        sp2 = m.trigger(subtasks, kind="SAVEPOINT").result()
        checkpoints(m, subtasks, 2, start=1)
    close(subtasks)
    sp_files = referenced_urls(catalog, [sp1.id])

    expire.run(None, catalog, job=JOB, retain_last=1)
    assert catalog.get_snapshot(sp1.id).status == "COMPLETED"
    assert all(exists(u) for u in sp_files)

    name = sp1.location.rstrip("/").rsplit("/", 1)[-1]
    report = expire.run(None, catalog, job=JOB, savepoints=[name])
    assert [e["id"] for e in report["stats"]["expired"]] == [sp1.id]
    assert catalog.get_snapshot(sp1.id).status == "DISCARDED"
    assert not any(exists(u) for u in sp_files) and not exists(sp1.location)
    assert catalog.get_snapshot(sp2.id).status == "COMPLETED" and exists(sp2.location)
    # by snapshot id works too
    expire.run(None, catalog, job=JOB, savepoints=[sp2.id])
    assert catalog.get_snapshot(sp2.id).status == "DISCARDED" and not exists(sp2.location)


@pytest.mark.parametrize(
    "params,error,match",
    [
        ({"job": "no-such-job", "retain_last": 1}, NoSuchJob, "not in the catalog"),
        ({"job": JOB, "retain_last": 0}, RetentionRemovesEverything, "retain_last=0"),
        ({"job": JOB}, InvalidJobParams, "needs a retention"),
        ({"job": JOB, "retain_last": -2}, InvalidJobParams, "negative"),
        ({"job": JOB, "older_than": "soon"}, InvalidJobParams, "not a duration"),
        ({"job": JOB, "savepoints": ["nope"]}, NoSuchSnapshot, "no savepoint 'nope'"),
    ],
)
def test_bad_input_deletes_nothing_and_records_no_run(catalog, storage, job4, params, error, match):
    _, records, _ = job4
    before = files_under(storage)
    with pytest.raises(error, match=match):
        expire.run(None, catalog, run_id="bad", **params)
    assert files_under(storage) == before
    assert all(catalog.get_snapshot(r.id).status == "COMPLETED" for r in records)
    with pytest.raises(NoSuchRun):  # an argument error is not a run
        catalog.get_run("bad")


def test_a_retry_with_the_same_run_id_finishes_the_deletion(catalog, storage, job4, monkeypatch):
    _, records, _ = job4
    old_files = referenced_urls(catalog, [records[0].id])

    def crash(kind: str, job: str) -> None:
        raise OSError("storage went away")

    monkeypatch.setattr(deletion.hooks, "before_forget", crash)
    with pytest.raises(MaintenanceJobFailed, match="storage went away"):
        expire.run(None, catalog, job=JOB, retain_last=3, run_id="nightly")
    # the snapshot was expired in the catalog, its files not yet forgotten nor deleted
    assert catalog.get_snapshot(records[0].id).status == "DISCARDED"
    assert all(exists(u) for u in old_files)
    assert catalog.get_run("nightly").status == "FAILED"
    assert catalog.get_lease("statekeeper/payments/files").released_at is not None

    monkeypatch.setattr(deletion.hooks, "before_forget", None)
    report = expire.run(None, catalog, job=JOB, retain_last=3, run_id="nightly")
    assert report["attempt"] == 2 and report["stats"]["files_deleted"] == len(old_files)
    assert not any(exists(u) for u in old_files)
    again = expire.run(None, catalog, job=JOB, retain_last=3, run_id="nightly")
    assert again["skipped"] is True and again["stats"]["files_deleted"] == len(old_files)
