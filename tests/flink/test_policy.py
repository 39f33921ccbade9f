"""A Flink job's management policy at the command line: read-only until the user says otherwise.

Real Flink 2.3 directories (a private copy), a real catalog on both databases, statectl as a
user runs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from state_engine import cli
from state_engine.catalog import Catalog
from state_engine.flink.import_job import import_flink
from state_engine.flink.retention import scheduled_skips

from .conftest import FlinkFixtures

OLD = 1_700_000_000


def _tree(root: Path) -> dict[str, int]:
    return {str(f.relative_to(root)): f.stat().st_size for f in root.rglob("*") if f.is_file()}


def _plant(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left behind")
    os.utime(path, (OLD, OLD))
    return path


@pytest.fixture
def statectl(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_a_deleting_command_on_a_read_only_flink_job_refuses_and_deletes_nothing(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    statectl: Callable[..., tuple[int, str, str]],
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    assert statectl("flink", "import", str(job_dir), "--job", "hm")[0] == 0
    orphan = _plant(job_dir / "shared" / "lost-sst")
    before = _tree(job_dir)

    code, out, err = statectl("maintain", "orphan_cleanup", "--job", "hm", "--older-than", "1d")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "job 'hm' is read-only for Statekeeper: nothing deleted" in err
    assert "`statectl jobs set-policy hm --manage orphans`" in err
    code, _, err = statectl("maintain", "expire", "--job", "hm", "--retain-last", "1")
    assert code == 1 and "`statectl jobs set-policy hm --manage retention`" in err
    assert _tree(job_dir) == before
    with Catalog.open(catalog_url) as cat:
        assert cat.list_runs(job="hm") == []  # a refusal is no run

    # a dry run deletes nothing: allowed, and it says what a managed job's cleanup would delete
    code, out, _ = statectl(
        "maintain", "orphan_cleanup", "--job", "hm", "--older-than", "1d", "--dry-run"
    )
    assert code == 0 and json.loads(out)["deleted"]["items"] == [orphan.as_uri()]
    assert _tree(job_dir) == before

    # granting orphans lets orphan cleanup delete; retention is still refused, naming both
    code, out, _ = statectl("jobs", "set-policy", "hm", "--manage", "orphans")
    assert (code, out) == (0, "job hm: management policy orphans\n")
    code, out, _ = statectl("maintain", "orphan_cleanup", "--job", "hm", "--older-than", "1d")
    report = json.loads(out)
    assert code == 0 and report["deleted"]["items"] == [orphan.as_uri()]
    assert report["deleted"]["bytes"] == len(b"left behind") == report["stats"]["bytes_deleted"]
    assert not orphan.exists()
    code, out, _ = statectl("runs", "--job", "hm")
    header, _, *rows = out.splitlines()
    assert "deleted" in header.split()
    assert sum("1 (11 B)" in row for row in rows) == 1  # said as deleted, not "bytes_out 0 B"
    code, _, err = statectl("maintain", "expire", "--job", "hm", "--retain-last", "1")
    assert code == 1
    assert "lets Statekeeper manage orphans only, not retention" in err
    assert "`statectl jobs set-policy hm --manage retention,orphans`" in err
    assert (job_dir / "chk-8" / "_metadata").exists()

    assert statectl("jobs", "set-policy", "hm", "--read-only")[0] == 0
    with Catalog.open(catalog_url) as cat:
        assert cat.get_job("hm").manage == ()


def test_import_with_manage_sets_the_policy_a_later_sync_keeps_it_and_jobs_shows_it(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    statectl: Callable[..., tuple[int, str, str]],
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    sp = flink_copy(flink_fixtures.java_savepoints("hashmap"))
    manage = ["--manage", "orphans,retention"]
    assert statectl("flink", "import", str(job_dir), "--job", "hm", *manage)[0] == 0
    assert statectl("flink", "import", str(sp), "--job", "sp")[0] == 0
    assert statectl("flink", "import", str(job_dir), "--job", "hm")[0] == 0  # a sync
    code, out, _ = statectl("jobs", "--json")
    assert code == 0
    assert {j["name"]: j["manage"] for j in json.loads(out)} == {
        "hm": ["retention", "orphans"],
        "sp": [],
    }
    code, out, _ = statectl("jobs")
    header, *rows = out.splitlines()
    assert header.split()[-1] == "manage"
    assert [r.split()[-1] for r in rows if r.split()[1:2] in (["hm"], ["sp"])] == [
        "retention,orphans",
        "read-only",
    ]
    with Catalog.open(catalog_url) as cat:
        # savepoint directories only: scheduled orphan cleanup has nothing there
        assert set(scheduled_skips(cat, cat.get_job("sp"))) == {"orphan_cleanup"}
        assert scheduled_skips(cat, cat.get_job("hm")) == {}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--manage", "orphans,compaction"], "unknown action 'compaction'"),
        (["--manage", ","], "--manage needs one or more of retention,orphans"),
    ],
)
def test_a_bad_manage_is_one_line_and_imports_nothing(
    catalog_url: str,
    flink_fixtures: FlinkFixtures,
    flink_copy: Callable[[Path], Path],
    statectl: Callable[..., tuple[int, str, str]],
    argv: list[str],
    message: str,
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    code, out, err = statectl("flink", "import", str(job_dir), "--job", "hm", *argv)
    assert (code, out) == (1, "") and err.count("\n") == 1 and message in err
    code, _, err = statectl("jobs", "set-policy", "nope", *argv)
    assert code == 1 and message in err
    with Catalog.open(catalog_url) as cat:
        assert cat.list_jobs() == []


def test_set_policy_of_an_unknown_job_names_the_listing(
    statectl: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = statectl("jobs", "set-policy", "nope", "--manage", "orphans")
    assert code == 1 and "no job 'nope'" in err and err.count("\n") == 1


def test_import_flink_with_manage_from_python(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "hm", manage=["retention"])
    assert catalog.get_job("hm").manage == ("retention",)
    import_flink(catalog, [str(job_dir)], "hm")
    assert catalog.get_job("hm").manage == ("retention",)
