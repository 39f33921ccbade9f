"""``statectl state show`` on snapshots of Flink jobs: decoded in-process, no Spark, no JVM."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.cli import main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STATEKEEPER_HOME", str(home))
    monkeypatch.delenv("STATEKEEPER_CATALOG_URL", raising=False)
    assert main(["catalog", "upgrade"]) == 0
    return home


def _register(home: Path, job: str, directory: Path, checkpoint_id: int, kind: str) -> int:
    """A COMPLETED snapshot of a job of origin flink, as ``statectl flink import`` records it."""
    with Catalog.open(f"sqlite:///{home / 'catalog.db'}") as cat:
        cat.register_job(job, max_parallelism=128, location=str(directory.parent), origin="flink")
        snap = cat.begin_snapshot(
            job,
            location=str(directory),
            parallelism=2,
            kind=kind,
            format="NATIVE",
            checkpoint_id=checkpoint_id,
        )
        cat.complete_snapshot(snap.id, snap.version, bytes=0, entries=0)
        return snap.id


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(["state", "show", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and out.startswith("[") else out), err


def test_state_show_json_limit_0_is_every_row_of_the_flink_snapshot(
    home: Path, flink_fixtures: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    chk = flink_fixtures.java_job("hashmap") / "chk-11"
    sid = _register(home, "fraud", chk, 11, "CHECKPOINT")
    code, rows, err = _show(capsys, str(sid), "--json", "--limit", "0")
    assert code == 0, err
    expected = [
        json.loads(line)
        for line in (flink_fixtures.java / "expected/hashmap/chk-11.jsonl").read_text().splitlines()
    ]
    n_rows = sum(3 + len(o["merchants"]) for o in expected)
    assert len(rows) == n_rows
    assert list(rows[0]) == [
        "operator", "key_group", "state", "key", "namespace", "user_key", "value", "expires_at"
    ]  # fmt: skip
    by_key = {o["key"]: o for o in expected}
    for r in rows:
        o = by_key[r["key"]]
        assert r["key_group"] == o["key_group"]
        want = o["merchants"][r["user_key"]] if r["state"] == "merchants" else o[r["state"]]
        assert json.loads(r["value"]) == want
    code, some, _ = _show(capsys, str(sid), "--json", "--state", "recent", "--key", "card-000001")
    assert [(r["state"], r["key"], json.loads(r["value"])) for r in some] == [
        ("recent", "card-000001", by_key["card-000001"]["recent"])
    ]
    code, table, _ = _show(capsys, str(sid), "--limit", "3")
    assert code == 0 and "card-" in table and len(table.splitlines()) == 5  # header, rule, 3


def test_state_show_raw_gives_base64_bytes(
    home: Path, flink_fixtures: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = flink_fixtures.java_savepoints("rocksdb") / "savepoint-0cf791-72b072c25cc0"
    sid = _register(home, "fraud-rocks", sp, 9, "SAVEPOINT")
    code, rows, err = _show(capsys, str(sid), "--json", "--raw", "--state", "total", "--limit", "0")
    assert code == 0, err
    assert len(rows) == 2997  # keys of savepoint 9 (fixture README)
    value = base64.b64decode(rows[0]["value"])
    assert len(value) == 8  # a Long
    assert base64.b64decode(rows[0]["key"])[0] == rows[0]["key_group"]


def test_bad_requests_are_one_line_errors(
    home: Path, flink_fixtures: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = flink_fixtures.java_savepoints("hashmap") / "savepoint-24b66e-d8d099a6f7d1"
    sid = _register(home, "fraud", sp, 5, "SAVEPOINT")
    code, _, err = _show(capsys, str(sid), "--operator", "nope")
    assert code != 0 and "nope" in err and "Traceback" not in err and err.count("\n") == 1
    code, _, err = _show(capsys, str(sid), "--state", "totals")
    assert code != 0 and "'totals'" in err and "total" in err and err.count("\n") == 1
    code, _, err = _show(capsys, str(sid), "--pyflink-type", "total")
    assert code != 0 and "NAME=KIND" in err and err.count("\n") == 1
    with Catalog.open(f"sqlite:///{home / 'catalog.db'}") as cat:
        cat.register_job("native-job", max_parallelism=128)
        own = cat.begin_snapshot("native-job", location="file:///x/chk-1", parallelism=1)
    code, _, err = _show(capsys, str(own.id), "--raw")
    assert code != 0 and "Flink" in err and err.count("\n") == 1
