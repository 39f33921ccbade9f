"""docker-compose.yml and the Dockerfile wire the stack exactly as tests/cluster runs it.

No Docker engine runs here, so the containers' parts are proven as local processes (sk_cluster.py).
These tests hold the compose file to that same wiring: the same commands for Airflow and Spark,
the same environment variable names, the same Spark configuration directory and the same
spark-submit application. They need no running stack.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.sk_cluster import (
    AIRFLOW_COMMANDS,
    AIRFLOW_ENV,
    APPLICATION,
    MASTER_CLASS,
    ROOT,
    S3_ENV,
    SPARK_CONF_DIR,
    STATEKEEPER_ENV,
    WORKER_CLASS,
)

AIRFLOW_SERVICES = ("airflow-scheduler", "airflow-dag-processor", "airflow-apiserver")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_airflow_services_run_the_commands_the_cluster_test_runs(services) -> None:
    by_service = {
        "airflow-scheduler": ("scheduler",),
        "airflow-dag-processor": ("dag-processor",),
        "airflow-apiserver": ("api-server",),
    }
    for name, argv in by_service.items():
        assert tuple(services[name]["command"]) == ("airflow", *argv)
        assert argv in AIRFLOW_COMMANDS
    init = (ROOT / "docker" / "airflow-init.sh").read_text().splitlines()
    assert "airflow " + " ".join(AIRFLOW_COMMANDS[0]) in init


def test_airflow_services_set_every_variable_the_cluster_test_sets(services) -> None:
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        missing = set(AIRFLOW_ENV + STATEKEEPER_ENV + S3_ENV) - set(env)
        assert not missing, f"{name} lacks {sorted(missing)}"
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        # psycopg 3 for the sync engine; asyncpg (a dependency) serves Airflow's async engine
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://")
        conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert conn["conn_type"] == "spark" and conn["host"].startswith("spark://")


def test_spark_services_start_the_same_classes_with_the_same_environment(services) -> None:
    commands = {name: " ".join(s.get("command") or []) for name, s in services.items()}
    assert MASTER_CLASS in commands["spark-master"]
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert WORKER_CLASS in commands[worker]
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        env = services[name]["environment"]
        missing = set(STATEKEEPER_ENV + S3_ENV) - set(env)
        assert not missing, f"{name} lacks {sorted(missing)}"


def test_the_image_reads_the_spark_conf_the_cluster_test_reads() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "SPARK_CONF_DIR=/opt/statekeeper/docker/spark" in text
    assert SPARK_CONF_DIR == ROOT / "docker" / "spark"
    conf = (SPARK_CONF_DIR / "spark-defaults.conf").read_text()
    assert "s3a" not in conf.lower(), "storage goes through fsspec; no Hadoop S3A settings"
    assert "fetch-s3a" not in text, "no Hadoop jars are needed any more"


def test_the_operator_submits_the_application_the_cluster_test_submits() -> None:
    import state_engine.jobs

    # plugins/statekeeper_airflow/spark_submit.application_path() resolves it the same way
    assert Path(state_engine.jobs.__file__).with_name("__main__.py") == APPLICATION


def test_docker_compose_config_validates_when_a_compose_cli_is_present(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    probe = (
        subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if docker
        else None
    )
    if docker is None or probe is None or probe.returncode != 0:
        pytest.skip("no `docker compose` CLI here (the compose file is checked by the tests above)")
    env_file = tmp_path / ".env"
    env_file.write_text(
        "AIRFLOW_JWT_SECRET=x\nAIRFLOW_SECRET_KEY=x\nAIRFLOW_ADMIN_PASSWORD=x\nS3_SECRET_KEY=x\n"
    )
    done = subprocess.run(
        [docker, "compose", "--env-file", str(env_file), "-f", str(ROOT / "docker-compose.yml"),
         "config", "--quiet"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_operations_guide_runs_the_stack_without_docker_as_the_cluster_test_does() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide.split("### The same stack without Docker", 1)[1]
    block = section.split("```", 2)[1]
    assert "moto_server -H 127.0.0.1" in block
    assert "SPARK_CONF_DIR=$PWD/docker/spark" in block
    assert f"{MASTER_CLASS} --host 127.0.0.1" in block and f"{WORKER_CLASS} --cores 1" in block
    for argv in AIRFLOW_COMMANDS:
        assert "airflow " + " ".join(argv) in block
    for name in ("AIRFLOW__CORE__EXECUTOR=LocalExecutor", "AIRFLOW_CONN_SPARK_DEFAULT="):
        assert name in block
    for name in S3_ENV[:3] + STATEKEEPER_ENV:
        assert name in guide.split("## Running on a cluster", 1)[1]
