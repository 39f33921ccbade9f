"""Names, numbers and pipes at statectl's edge: every bad job name and every id outside the
catalog's signed 64-bit range is refused in one line naming the rule (no traceback, nothing
recorded), a job name is held to the same rule where the runtime creates its job, and every
listing command survives a reader that closes the pipe early (``| head``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from state_engine.catalog import Catalog, FileRef
from state_engine.cli import main
from state_engine.errors import InvalidJobName
from state_engine.examples import fraud
from state_engine.ids import MAX_ID
from state_engine.names import check_job_name
from state_engine.runtime import JobRunner

REPO = Path(__file__).resolve().parents[2]

#: (a job name, what the refusal says of it)
BAD_NAMES = [
    ("bad\njob", "unprintable"),
    ("\t", "unprintable"),
    ("tab\tinside", "unprintable"),
    ("cr\rreturn", "unprintable"),
    ("\x1b[2J\x1b[31mred", "unprintable"),
    ("del\x7f", "unprintable"),
    ("nel\x85line", "unprintable"),
    ("line\u2028sep", "unprintable"),
    ("bidi\u202eevil", "unprintable"),
    ("../../etc", "path separator or '..'"),
    ("a/b", "path separator or '..'"),
    ("a\\b", "path separator or '..'"),
    ("..", "path separator or '..'"),
    (" leading", "leading or trailing space"),
    ("trailing ", "leading or trailing space"),
    (".hidden", "starts with '.'"),
    ("", "is empty"),
    ("x" * 201, "201 characters long"),
]
GOOD_NAMES = ["orders", "fraud detection", "Zahlungen-ÄÖÜ", "orders_v2.eu=1", "x" * 200]

TOO_BIG = str(MAX_ID + 1)
#: (a command line holding an id, the option or argument it names)
BAD_IDS = [
    (["show", "99999999999999999999"], "SNAPSHOT"),
    (["show", TOO_BIG], "SNAPSHOT"),
    (["show", "0"], "SNAPSHOT"),
    (["show", "-1"], "SNAPSHOT"),
    (["files", "99999999999999999999"], "SNAPSHOT"),
    (["files", "--json", TOO_BIG], "SNAPSHOT"),
    (["state", "show", "99999999999999999999"], "SNAPSHOT"),
    (["maintain", "savepoint", "--snapshot", "99999999999999999999"], "--snapshot"),
    (["maintain", "ttl_cleanup", "--snapshot", TOO_BIG], "--snapshot"),
    (["maintain", "rescale", "--parallelism", "2", "--snapshot", TOO_BIG], "--snapshot"),
    (["runs", "--limit", "99999999999999999999"], "--limit"),
    (["snapshots", "orders", "--limit", TOO_BIG], "--limit"),
    (["state", "show", "1", "--limit", TOO_BIG], "--limit"),
]


@pytest.fixture
def env(catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", root.as_uri())
    return {"url": catalog_url, "root": root.as_uri()}


def _one_line_refusal(err: str) -> str:
    assert "Traceback" not in err and "OverflowError" not in err, err
    lines = err.strip().split("\n")
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("name", "says"), BAD_NAMES, ids=[repr(n)[:24] for n, _ in BAD_NAMES])
def test_flink_import_refuses_a_bad_job_name_in_one_line_with_the_rule(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, says: str
) -> None:
    code = main(["flink", "import", str(tmp_path), "--job", name])
    out, err = capsys.readouterr()
    line = _one_line_refusal(err)
    assert code == 1 and out == ""
    assert says in line and "printable characters" in line  # what was wrong, and the rule
    assert "\x1b" not in line and "\r" not in line and "\x7f" not in line  # shown escaped
    with Catalog.open(env["url"]) as catalog:
        assert catalog.list_jobs() == [] and catalog.list_runs() == []


@pytest.mark.parametrize(
    ("name", "says"), BAD_NAMES[:12], ids=[repr(n)[:24] for n, _ in BAD_NAMES[:12]]
)
def test_the_runtime_refuses_the_same_names_before_it_registers_the_job(
    env: dict[str, str], catalog: Catalog, name: str, says: str
) -> None:
    job = fraud.build_job(1, checkpoint_every=100, name=name, records_per_partition=20)
    with pytest.raises(InvalidJobName, match="printable characters") as err:
        JobRunner(job, catalog=catalog, storage=env["root"]).run()
    assert says in str(err.value) and "\n" not in str(err.value)
    assert catalog.list_jobs() == []


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_names_inside_the_rule_pass(name: str) -> None:
    assert check_job_name(name) == name


@pytest.mark.parametrize(("argv", "names"), BAD_IDS, ids=[" ".join(a)[:40] for a, _ in BAD_IDS])
def test_an_id_outside_the_64_bit_range_is_refused_in_one_line(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str], names: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    line = _one_line_refusal(err)
    assert exit_.value.code == 2 and out == ""
    assert names in line and "out of range" in line
    assert f"from 0 to {MAX_ID}" in line or f"from 1 to {MAX_ID}" in line
    assert "--help" in line  # where to look
    with Catalog.open(env["url"]) as catalog:
        assert catalog.list_runs() == []  # nothing recorded


def test_the_refusals_are_one_line_from_the_installed_command_too(env: dict[str, str]) -> None:
    for argv in (["show", "99999999999999999999"], ["flink", "import", "/x", "--job", "a\nb"]):
        done = subprocess.run(
            [sys.executable, "-m", "state_engine.cli", *argv],
            capture_output=True, text=True, env=_child_env(), timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode in (1, 2) and done.stdout == ""
        _one_line_refusal(done.stderr)


# --- closed pipes ---


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def big_catalog(env: dict[str, str]) -> Iterator[dict[str, int]]:
    """Enough jobs, snapshots, files and runs that each listing is far above a pipe's buffer."""
    with Catalog.open(env["url"]) as catalog, catalog.batch():
        for i in range(400):
            catalog.register_job(f"job-{i:04d}-" + "x" * 100, max_parallelism=128)
        catalog.register_job("orders", max_parallelism=128)
        snapshot = 0
        for _ in range(400):
            snap = catalog.begin_snapshot("orders", location=env["root"], parallelism=1)
            snapshot = snap.id
        catalog.attach_files(
            snapshot,
            [FileRef(f"/orders/chk/{i:05d}-" + "y" * 80, 10, operator="op") for i in range(2000)],
        )
        for i in range(400):
            catalog.start_run(f"run-{i:04d}", "expire", job="orders", params={"pad": "z" * 200})
    yield {"snapshot": snapshot}


LISTINGS = [
    ["jobs"],
    ["jobs", "--json"],
    ["snapshots", "orders"],
    ["snapshots", "orders", "--json"],
    ["files", "{snapshot}"],
    ["files", "{snapshot}", "--json"],
    ["show", "{snapshot}"],
    ["runs"],
    ["runs", "--json"],
    ["runs", "--job", "orders", "--limit", "1000"],
    ["sql", "SELECT * FROM sk_maintenance_runs"],
    ["sql", "--json", "SELECT * FROM sk_snapshot_files"],
    ["catalog", "current"],
]


def test_every_listing_survives_head_closing_the_pipe(big_catalog: dict[str, int]) -> None:
    for template in LISTINGS:
        argv = [a.format(**big_catalog) for a in template]
        statectl = subprocess.Popen(
            [sys.executable, "-m", "state_engine.cli", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(),
        )  # fmt: skip
        head = subprocess.Popen(["head", "-n", "1"], stdin=statectl.stdout, stdout=subprocess.PIPE)
        assert statectl.stdout is not None
        statectl.stdout.close()  # head holds the only reading end: its exit closes the pipe
        first, _ = head.communicate(timeout=300)
        _, err = statectl.communicate(timeout=300)
        assert first, argv
        assert statectl.returncode in (0, 141), (argv, statectl.returncode, err)
        assert b"Traceback" not in err and b"BrokenPipe" not in err, (argv, err.decode())


def test_text_from_paths_and_the_catalog_is_escaped_as_tables_are(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from state_engine.cli.output import print_text

    odd = tmp_path / "e\x1b[2Jx\u202e"
    odd.mkdir()
    assert main(["flink", "import", str(odd), "--job", "ok"]) == 1
    line = _one_line_refusal(capsys.readouterr().err)
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b[2Jx" in line
    # a rendered report keeps its lines, each escaped
    print_text("imported job 'a\x1b[31m'\nverify: \x07bell")
    assert capsys.readouterr().out == "imported job 'a\\x1b[31m'\nverify: \\x07bell\n"
