"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The stack is parsed as Compose parses it (YAML with merge keys, ``${VAR:-default}`` taken at its
default) and held against the repository: services, pinned images, paths that exist, commands
that the installed Airflow and our ``statectl`` accept, classes that the bundled Spark ships.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from state_engine.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
REQUIRED = {
    "postgres",
    "s3",
    "s3-init",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker-1",
}
AIRFLOW_SERVICES = sorted(s for s in REQUIRED if s.startswith("airflow-"))
VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def with_defaults(text: str) -> str:
    """Compose's interpolation with no .env: every ``${VAR:-default}`` is its default."""
    return VARIABLE.sub(lambda m: m.group(2) or "", text.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return stack["services"]


def test_every_required_service_exists(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= REQUIRED, REQUIRED - set(services)


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} names no image"
        assert "$" not in image, f"{name}: image {image!r} depends on the environment"
        repository, _, tag = image.rpartition(":")
        assert repository and tag and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest", f"{name}: image {image!r} is not pinned"
        assert re.search(r"\d", tag), f"{name}: tag {tag!r} names no version"
        if "build" in service:
            # Our own image: tagged with the project's version, built from our Dockerfile.
            assert tag == project, f"{name}: builds {image!r}, the project is {project}"


def test_build_contexts_and_mounted_paths_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = ROOT / build["context"]
            assert context.is_dir(), f"{name}: no build context {context}"
            assert (context / build.get("dockerfile", "Dockerfile")).is_file()
        for env_file in service.get("env_file", []) or []:
            assert (ROOT / env_file).is_file(), f"{name}: no env file {env_file}"
        for volume in service.get("volumes", []) or []:
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: mounts missing {source}"


def test_the_postgres_init_script_creates_both_databases(services: dict[str, Any]) -> None:
    mounts = [v for v in services["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    [mount] = mounts
    script = ROOT / mount.split(":", 1)[0]
    assert os.access(script, os.X_OK), f"{script} is not executable"
    text = script.read_text()
    assert re.search(r"^create .* airflow$", text, re.M)
    assert re.search(r"^create .* statekeeper$", text, re.M)
    env = services["postgres"]["environment"]
    for variable in set(re.findall(r'"\$([A-Z_]+)"', text)) - {"POSTGRES_USER"}:
        assert variable in env, f"the init script reads ${variable}, which postgres is not given"


def test_airflow_services_mount_dags_and_plugins(services: dict[str, dict[str, Any]]) -> None:
    for name in [*AIRFLOW_SERVICES]:
        service = services[name]
        mounts = {v.split(":")[0]: v.split(":")[1] for v in service["volumes"]}
        env = service["environment"]
        assert mounts.get("./dags") == env["AIRFLOW__CORE__DAGS_FOLDER"], name
        assert mounts.get("./plugins") == env["AIRFLOW__CORE__PLUGINS_FOLDER"], name
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"


def test_the_wiring_of_catalog_storage_and_spark(services: dict[str, dict[str, Any]]) -> None:
    for name in [*AIRFLOW_SERVICES, "spark-master", "spark-worker-1"]:
        env = {k: with_defaults(str(v)) for k, v in services[name]["environment"].items()}
        catalog = env["STATEKEEPER_CATALOG_URL"]
        assert re.fullmatch(r"postgresql\+psycopg://\w+:[^@]+@postgres:5432/statekeeper", catalog)
        assert env["STATEKEEPER_CHECKPOINT_ROOT"] == "s3://statekeeper/checkpoints"
        assert env["AWS_ENDPOINT_URL"] == "http://s3:9000"
    # The bucket the checkpoints go to is the one s3-init creates.
    init = services["s3-init"]
    assert "mb --ignore-existing" in init["command"][0]
    assert with_defaults(init["environment"]["S3_BUCKET"]) == "statekeeper"

    conn = json.loads(services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert conn == {"conn_type": "spark", "host": "spark://spark-master", "port": 7077}
    master = " ".join(services["spark-master"]["command"])
    assert "--host spark-master --port 7077" in master
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert " ".join(services[worker]["command"]).endswith("spark://spark-master:7077")


def test_depends_on_names_services_and_waits_on_health(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for other, rule in (service.get("depends_on") or {}).items():
            assert other in services, f"{name} depends on unknown {other}"
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[other], f"{other} has no healthcheck"
            else:
                assert condition == "service_completed_successfully", (name, other)
                assert services[other].get("restart", "no") == "no", f"{other} is one-shot"
    long_running = set(services) - {"s3-init", "airflow-init"}
    for name in long_running:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def test_published_ports_do_not_collide(services: dict[str, dict[str, Any]]) -> None:
    published = [
        with_defaults(port).rsplit(":", 1)[0]
        for service in services.values()
        for port in service.get("ports", []) or []
    ]
    assert published, "nothing is published: the UI would be unreachable"
    assert [p for p, n in Counter(published).items() if n > 1] == []
    assert "8080" in published  # the Airflow UI


def commands(services: dict[str, dict[str, Any]], program: str) -> list[list[str]]:
    """Every ``program ...`` invocation: service commands, healthchecks, the init script."""
    found: list[list[str]] = []
    lines: list[str] = []
    for service in services.values():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] == program:
            found.append(command)
        test = (service.get("healthcheck") or {}).get("test", [])
        if test[:1] == ["CMD-SHELL"]:
            lines.append(test[1].replace("$$", "$"))
    lines += (ROOT / "docker" / "airflow-init.sh").read_text().splitlines()
    for line in lines:
        if line.strip().startswith(f"{program} "):
            found.append(shlex.split(line.strip()))
    return found


def test_airflow_commands_exist_in_the_installed_airflow(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    argvs = [argv[1:] for argv in commands(services, "airflow")]
    assert {a[0] for a in argvs} >= {"api-server", "scheduler", "dag-processor", "triggerer", "db"}
    check = (
        "import json, sys\n"
        "from airflow.cli.cli_parser import get_parser\n"
        "bad = {}\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        get_parser().parse_args(argv)\n"
        "    except SystemExit as exc:\n"
        "        bad[' '.join(argv)] = exc.code\n"
        "print(json.dumps(bad))\n"
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
    }
    done = subprocess.run(
        [sys.executable, "-c", check, json.dumps(argvs)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}, done.stderr[-2000:]


def test_statectl_commands_exist_in_our_parser(services: dict[str, dict[str, Any]]) -> None:
    argvs = [argv[1:] for argv in commands(services, "statectl")]
    assert ["catalog", "upgrade"] in argvs
    for argv in argvs:
        args = build_parser().parse_args(argv)
        assert getattr(args, "handler", None) is not None, argv


def test_spark_services_start_classes_the_bundled_spark_ships(
    services: dict[str, dict[str, Any]],
) -> None:
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    assert (spark_home / "bin" / "spark-class").is_file()
    [core] = (spark_home / "jars").glob("spark-core_*.jar")
    with zipfile.ZipFile(core) as jar:
        classes = set(jar.namelist())
    for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
        command = " ".join(services[name]["command"])
        assert "bin/spark-class" in command
        [main] = re.findall(r"org\.apache\.spark\.[\w.]+", command)
        assert main.replace(".", "/") + ".class" in classes, main


def test_the_dockerfile_pins_its_base_and_installs_java_and_the_project() -> None:
    text = DOCKERFILE.read_text()
    [base] = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert base == f"apache/airflow:{version('apache-airflow')}-python3.11"
    assert "openjdk-17-jre-headless" in text
    # The image installs the built wheel with every extra, not an editable tree.
    assert re.search(r"pip wheel [^\n]*--no-deps", text)
    assert re.search(r"pip install [^\n]*\"\$1\[all\]\"", text)
    assert "set -- /tmp/dist/statekeeper-*.whl" in text
    assert not re.search(r"pip install [^\n]*\s-e\s", text)
    pinned = re.search(r'"pyspark==([\d.]+)"', text)
    assert pinned and pinned.group(1) == version("pyspark")
    assert f'"apache-airflow=={version("apache-airflow")}"' in text
    for source in re.findall(r"^COPY\s+(?:--\S+\s+)*(.+)\s+\S+$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"the Dockerfile copies missing {path}"
    for script in re.findall(r"^RUN bash (\S+)", text, re.M):
        assert (ROOT / script).is_file(), script
