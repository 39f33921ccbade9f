"""``make demo``'s story, reduced: the same stages on a tiny stream.

The short run uses ``--maintenance spark`` (the DAGs' jobs with the DAGs' parameters on the test
session's SparkSession): the DAGs themselves run under tests/airflow, and four ``airflow dags
test`` processes would cost two minutes. The Airflow driver is checked on its own below: a DAG
run that fails must stop the demo with the DAG, the reason and the log.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from demo import story as demo
from demo.airflow_cli import AirflowCli, airflow_env, failure_message
from state_engine.catalog import Catalog
from state_engine.config import Settings
from state_engine.examples import fraud

# 2,500 s of record time per partition: a card idle for the 15 min profile TTL expires
TINY = [
    "--records-per-partition", "2500",
    "--cards-per-partition", "400",
    "--checkpoint-every", "1500",
    "--kill-at", "5000",
]  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("STATEKEEPER_CATALOG_URL", "STATEKEEPER_CHECKPOINT_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "sk"))
    return tmp_path / "sk"


def run_demo(argv: list[str], spark: object) -> tuple[int, str]:
    out = io.StringIO()
    code = demo.run(demo.parser().parse_args(argv), out, spark=spark)
    return code, out.getvalue()


@pytest.mark.spark
def test_the_story_loses_nothing_and_a_rerun_starts_fresh(home: Path, spark: object) -> None:
    code, out = run_demo([*TINY, "--maintenance", "spark"], spark)
    assert code == 0, out
    for stage in range(1, 7):
        assert f"[{stage}/6]" in out
    assert "KILLED after 5,000 of 10,000 records" in out
    assert re.search(r"chk-2 .* shared SSTs: \d+ new, [1-9]\d* reused", out), out
    assert "compaction: skipped: latest snapshot 3 is NATIVE" in out
    assert "IDENTICAL: every one of the" in out
    with Catalog.from_settings(Settings.from_env()) as catalog:
        runs = {r.kind: r for r in catalog.list_runs(job=demo.JOB, limit=None)}
        assert {k: r.status for k, r in runs.items()} == {
            k: "SUCCEEDED"
            for k in ("expire", "orphan_cleanup", "savepoint", "ttl_cleanup", "rescale")
        }
        ttl = runs["ttl_cleanup"]
        # the job's time at chk-3 (record 4,500: ~1,125 s into each partition), not the wall
        # clock (which would drop every profile and change the alerts)
        assert ttl.params["at"] < fraud.START_MS + 1_130_000
        assert (ttl.stats or {})["stats"]["dropped"] > 0
        assert ttl.input_snapshot_id == runs["savepoint"].output_snapshot_id
        assert runs["rescale"].input_snapshot_id == ttl.output_snapshot_id
        rescaled_id = runs["rescale"].output_snapshot_id
        assert rescaled_id is not None
        rescaled = catalog.get_snapshot(rescaled_id)
        assert rescaled.parallelism == 3
        latest = catalog.latest_snapshot(demo.JOB)
        assert latest is not None and latest.parallelism == 3 and latest.trigger == "final"

    # A second run clears the first one's job, checkpoints and scratch, and nothing else.
    keep = home / "airflow" / "simple_auth_manager_passwords.json.generated"
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_text("{}")
    code, again = run_demo([*TINY, "--maintenance", "spark"], spark)
    assert code == 0, again
    assert "cleared: " + str(home / "catalog.db") in again
    assert keep.exists()
    with Catalog.from_settings(Settings.from_env()) as catalog:
        assert min(s.id for s in catalog.list_snapshots(demo.JOB)) == 1


def test_a_catalog_with_other_jobs_is_left_alone(home: Path) -> None:
    from state_engine.catalog.migrate import upgrade

    settings = Settings.from_env()
    upgrade(settings.catalog_url)
    with Catalog.from_settings(settings) as catalog:
        catalog.register_job("orders", max_parallelism=128)
        catalog.register_job(demo.JOB, max_parallelism=128)
    code, out = run_demo([*TINY, "--maintenance", "spark"], None)
    assert code == 1
    assert "holds a previous demo's job 'fraud-detection' and other jobs (orders)" in out
    with Catalog.from_settings(settings) as catalog:
        assert {j.name for j in catalog.list_jobs()} == {"orders", demo.JOB}


def test_a_kill_point_outside_the_stream_is_refused(home: Path) -> None:
    code, out = run_demo([*TINY[:-2], "--kill-at", "10000"], None)
    assert code == 2 and "--kill-at must be between" in out
    assert not home.exists()


def test_the_airflow_env_is_the_embedded_defaults_whatever_the_caller_set(home: Path) -> None:
    settings = Settings.from_env()
    env = airflow_env(
        settings,
        {"PATH": "/usr/bin", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////elsewhere.db",
         "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING", "AIRFLOW_HOME": "/elsewhere"},
    )  # fmt: skip
    assert env["AIRFLOW_HOME"] == str(home / "airflow")
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in env
    assert env["AIRFLOW__LOGGING__LOGGING_LEVEL"] == "INFO"
    assert env["STATEKEEPER_CATALOG_URL"] == settings.catalog_url
    assert Path(env["AIRFLOW__CORE__DAGS_FOLDER"], "statekeeper_rescale.py").exists()


@pytest.mark.airflow
@pytest.mark.slow
def test_a_failed_dag_run_is_reported_with_its_reason(home: Path) -> None:
    from state_engine.catalog.migrate import upgrade

    settings = Settings.from_env()
    upgrade(settings.catalog_url)
    cli = AirflowCli(settings, home / "logs")
    cli.migrate()
    test = cli.dags_test("statekeeper_rescale", {"job": "no-such-job", "parallelism": 3})
    assert not test.succeeded
    assert test.state == "failed" and test.run_id is not None
    message = failure_message(test)
    assert "`airflow dags test statekeeper_rescale` did not succeed" in message
    assert "dag run state failed" in message and str(test.log) in message
    assert "no-such-job" in test.log.read_text()


def test_a_long_step_prints_a_line_every_ten_seconds_off_a_terminal() -> None:
    """The heartbeat is driven by its own clock: the test moves time by hand, not by waiting."""
    import io
    import threading

    from demo import story as demo

    out = io.StringIO()
    console = demo.Console(out)
    assert not console.tty
    console.line("start")
    console._last_line -= demo.HEARTBEAT_S  # ten seconds of silence have passed
    console.progress(5, 10, "records")
    assert out.getvalue().splitlines()[-1].strip() == "... 5/10 records"
    console.progress(6, 10, "records")  # right after a line: nothing new
    assert out.getvalue().splitlines()[-1].strip() == "... 5/10 records"

    released = threading.Event()
    with console.ticking("the reference run"):
        console._last_line -= demo.HEARTBEAT_S
        # the heartbeat thread notices the silence on its next beat and prints a line
        while "running for" not in out.getvalue():
            released.wait(0.05)
    assert "... the reference run: running for" in out.getvalue()
