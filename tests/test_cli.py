"""statectl over a real catalog: readable tables, --json, one-line errors, the version guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from state_engine.catalog import Catalog, FileRef, KeyGroupStatRow
from state_engine.cli import main

STATECTL = Path(sys.executable).parent / "statectl"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STATEKEEPER_HOME", str(home))
    monkeypatch.delenv("STATEKEEPER_CATALOG_URL", raising=False)
    return home


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def filled(home: Path, capsys: pytest.CaptureFixture[str]) -> int:
    assert _run(capsys, "catalog", "upgrade")[0] == 0
    with Catalog.open(f"sqlite:///{home / 'catalog.db'}") as cat:
        cat.register_job("orders", max_parallelism=128)
        snap = cat.begin_snapshot("orders", location="file:///ck/orders/chk-1", parallelism=2)
        cat.attach_files(
            snap.id,
            [
                FileRef("/ck/orders/chk-1/a.parquet", 4096, operator="sum", subtask=0,
                        key_group_start=0, key_group_end=63),
                FileRef("/ck/orders/shared/b.sst", 1024, shared=True, operator="sum", subtask=1,
                        key_group_start=64, key_group_end=127),
            ],
        )  # fmt: skip
        cat.record_key_group_stats(snap.id, [KeyGroupStatRow("sum", k, 10) for k in range(128)])
        cat.complete_snapshot(snap.id, 0)
        cat.start_run("nightly-1", "compaction", job="orders", params={"target": 1})
        cat.finish_run("nightly-1", stats={"files": 2}, rows_out=5)
        return snap.id


def test_every_command_refuses_a_catalog_that_is_not_at_head(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["jobs"], ["snapshots", "x"], ["show", "1"], ["files", "1"], ["runs"],
                 ["sql", "SELECT 1"]):  # fmt: skip
        code, out, err = _run(capsys, *argv)
        assert code == 1 and out == ""
        assert err.count("\n") == 1 and "run `statectl catalog upgrade`" in err
    assert not (home / "catalog.db").exists()


def test_upgrade_creates_the_embedded_catalog_and_is_repeatable(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "catalog", "upgrade")
    assert code == 0 and "upgraded from empty to" in out
    assert (home / "catalog.db").is_file()
    assert "already at head" in _run(capsys, "catalog", "upgrade")[1]
    code, out, _ = _run(capsys, "catalog", "current", "--json")
    assert json.loads(out)["current"] == json.loads(out)["head"]


def test_listings_as_tables_and_json(filled: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "jobs")
    header, rule, row = out.splitlines()
    assert header.split() == ["id", "name", "max_parallelism", "latest", "checkpoint", "bytes",
                              "completed_at", "manage"]  # fmt: skip
    # sizes for people in the table; --json keeps the byte count
    assert row.split()[:7] == ["1", "orders", "128", str(filled), "1", "5.0", "KiB"]
    assert row.split()[-1] == "retention,orphans"  # a Statekeeper job's default policy
    assert len(rule) == len(row)  # columns line up under the rule
    jobs = json.loads(_run(capsys, "jobs", "--json")[1])
    assert jobs[0]["latest_snapshot"]["id"] == filled
    assert jobs[0]["latest_snapshot"]["bytes"] == 5120

    snaps = json.loads(_run(capsys, "snapshots", "orders", "--json")[1])
    assert [(s["id"], s["status"], s["bytes"]) for s in snaps] == [(filled, "COMPLETED", 5120)]
    assert "COMPLETED" in _run(capsys, "snapshots", "orders")[1]

    shown = json.loads(_run(capsys, "show", str(filled), "--json")[1])
    assert shown["snapshot"]["status"] == "COMPLETED"
    assert shown["skew"][0]["skew"] == pytest.approx(1.0)
    text = _run(capsys, "show", str(filled))[1]
    assert "key-group skew" in text and "state size per operator" in text

    files = json.loads(_run(capsys, "files", str(filled), "--json")[1])
    assert {f["path"] for f in files} == {"/ck/orders/chk-1/a.parquet", "/ck/orders/shared/b.sst"}
    runs = json.loads(_run(capsys, "runs", "--job", "orders", "--json")[1])
    assert [(r["run_id"], r["status"], r["stats"]) for r in runs] == [
        ("nightly-1", "SUCCEEDED", {"files": 2})
    ]

    rows = json.loads(
        _run(capsys, "sql", "SELECT job, bytes FROM sk_v_latest_snapshots", "--json")[1]
    )
    assert rows == [{"job": "orders", "bytes": 5120}]


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM sk_jobs",
        "SELECT 1; DELETE FROM sk_jobs",
        "/* hidden */ UPDATE sk_jobs SET name = 'x'",
        "WITH gone AS (DELETE FROM sk_jobs RETURNING id) SELECT * FROM gone",
    ],
)
def test_sql_refuses_writes_and_leaves_the_catalog_as_it_was(
    filled: int, capsys: pytest.CaptureFixture[str], query: str
) -> None:
    code, out, err = _run(capsys, "sql", query)
    assert code == 1 and out == "" and err.startswith("statectl: error:")
    assert err.count("\n") == 1
    assert json.loads(_run(capsys, "jobs", "--json")[1])[0]["name"] == "orders"


def test_unknown_ids_and_bad_urls_are_one_line_errors(
    filled: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = _run(capsys, "show", "999")
    assert code == 1 and "no snapshot 999" in err
    code, _, err = _run(capsys, "snapshots", "nope")
    assert code == 1 and "statectl jobs" in err
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", "postgresql://postgres@127.0.0.1:1/none")
    code, _, err = _run(capsys, "jobs")
    assert code == 1 and "cannot connect" in err and err.count("\n") == 1
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", "nonsense")
    code, _, err = _run(capsys, "jobs")
    assert code == 1 and "STATEKEEPER_CATALOG_URL" in err


def test_the_installed_console_script(filled: int, home: Path) -> None:
    env = {**os.environ, "STATEKEEPER_HOME": str(home)}
    env.pop("STATEKEEPER_CATALOG_URL", None)
    done = subprocess.run(
        [str(STATECTL), "snapshots", "orders", "--json"],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["id"] == filled
    refused = subprocess.run(
        [str(STATECTL), "sql", "DROP TABLE sk_jobs"],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1 and "Traceback" not in refused.stderr


def test_statectl_offers_the_maintenance_and_state_commands(capsys) -> None:
    for argv, expected in ((["maintain", "--help"], "ttl_cleanup"), (["state", "--help"], "show")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        assert expected in capsys.readouterr().out


def test_help_and_usage_errors_import_nothing_heavy() -> None:
    """`statectl --help` must not pay for the catalog, Spark or Arrow: checked by what it
    imported (a bound that cannot flake), its time printed for information."""
    import time

    probe = (
        "import sys\n"
        "from state_engine.cli import main\n"
        "for argv in (['--help'], ['jobs', '--bogus'], ['maintain', '--help'], ['sql']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('sqlalchemy', 'pyspark', 'pyarrow', 'alembic', 'fsspec', 'numpy', 'rocksdict')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr[-2000:]
    started = time.perf_counter()
    timed = subprocess.run(
        [str(STATECTL), "--help"], capture_output=True, text=True, check=False, timeout=120
    )
    assert timed.returncode == 0 and "verify" in timed.stdout and "sql" in timed.stdout
    print(f"statectl --help took {time.perf_counter() - started:.2f} s (target < 0.5 s)")


def test_tables_escape_control_characters(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "catalog", "upgrade")[0] == 0
    with Catalog.open(f"sqlite:///{home / 'catalog.db'}") as cat:
        cat.register_job("ok", max_parallelism=8)
        cat.start_run("r\x1b[2J\x1b[H", "compaction", job="ok")
        cat.fail_run("r\x1b[2J\x1b[H", "line one\nline two\r\x07 \u202eevil")
    code, out, _ = _run(capsys, "runs")
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\r" not in out
    assert "r\\x1b[2J\\x1b[H" in out and "line one\\nline two\\r\\x07 \\u202eevil" in out
    assert len(out.splitlines()) == 3  # header, rule, one row: the newline did not break it
    # JSON carries the real strings (JSON escapes them itself)
    [run] = json.loads(_run(capsys, "runs", "--json")[1])
    assert run["error"] == "line one\nline two\r\x07 \u202eevil"


def test_sql_caps_and_timeout_from_the_command_line(
    filled: int, capsys: pytest.CaptureFixture[str]
) -> None:
    numbers = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500) "
    code, out, err = _run(capsys, "sql", numbers + "SELECT x FROM c", "--max-rows", "5")
    assert code == 0 and len(out.splitlines()) == 2 + 5
    assert "output cut at 5 rows" in err and err.count("\n") == 1
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    code, out, err = _run(capsys, "sql", forever, "--timeout", "0.2")
    assert code == 1 and out == "" and "timeout of 0.2 s" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["sql", "SELECT 1", "--max-bytes", "lots"])
    assert exit_info.value.code == 2


def test_estimated_figures_are_marked(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "catalog", "upgrade")[0] == 0
    with Catalog.open(f"sqlite:///{home / 'catalog.db'}") as cat:
        cat.register_job("rocks", max_parallelism=8)
        snap = cat.begin_snapshot("rocks", location="file:///ck/r/chk-1", parallelism=1,
                                  format="NATIVE")  # fmt: skip
        cat.record_key_group_stats(snap.id, [KeyGroupStatRow("p", k, 10 + k) for k in range(8)])
        native = cat.complete_snapshot(snap.id, snap.version)
    table = _run(capsys, "snapshots", "rocks")[1]
    assert f"~{native.entries:,}" in table and "estimated from RocksDB SST metadata" in table
    [row] = json.loads(_run(capsys, "snapshots", "rocks", "--json")[1])
    assert row["entries_estimated"] is True and row["entries"] == native.entries
    shown = _run(capsys, "show", str(native.id))[1]
    assert "ESTIMATED" in shown and "(estimated from RocksDB" in shown
    detail = json.loads(_run(capsys, "show", str(native.id), "--json")[1])
    assert detail["snapshot"]["entries_estimated"] and detail["skew"][0]["estimated"]
