"""The multi-machine stack of docker-compose.yml, as local processes on 127.0.0.1.

One definition of how each part starts (commands, the environment variable names that wire them)
serves the cluster fixtures and the test that holds docker-compose.yml to the same wiring: what
runs here is what the containers run, minus Docker.

- S3: moto's server (an S3 API on a free port), a bucket for checkpoints.
- Spark: a standalone master and two 1-core workers from the venv's pyspark (``bin/spark-class``),
  configured by ``docker/spark/spark-defaults.conf`` like the compose services.
- Airflow: ``airflow db migrate`` on a fresh PostgreSQL database, then the scheduler
  (LocalExecutor), the DAG processor and the API server, with the SimpleAuthManager and a known
  password.

Processes start in their own session and are stopped by PID (SIGTERM, then SIGKILL); their logs
stay in the session's temporary directory and are printed when a wait fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SPARK_CONF_DIR = ROOT / "docker" / "spark"
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"
APPLICATION = ROOT / "state_engine" / "jobs" / "__main__.py"

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
AIRFLOW_COMMANDS = (("db", "migrate"), ("scheduler",), ("dag-processor",), ("api-server",))

# The variables that wire the parts together, set alike here and in docker-compose.yml.
STATEKEEPER_ENV = ("STATEKEEPER_CATALOG_URL", "STATEKEEPER_CHECKPOINT_ROOT")
S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
AIRFLOW_ENV = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW_CONN_SPARK_DEFAULT",
)
SPARK_ENV = ("SPARK_CONF_DIR",)

# How long a part may take to come up or a DAG run to finish before the test gives up: a guard
# against a hang on a machine loaded many times over, never a measure of speed.
PATIENCE_S = 900.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of every process of the stack: the venv first on PATH, 127.0.0.1 only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYSPARK"))}
    env.update(
        {
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONF_DIR": str(SPARK_CONF_DIR),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, even if killed outright
    (teardown then never runs), so no daemon outlives its session."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Service:
    """One long-running process of the stack."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Service:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                env=dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.log.parent,
                preexec_fn=_die_with_parent,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL to what is left after a grace period."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue


class StackError(AssertionError):
    pass


def wait_until(
    check: Callable[[], Any], what: str, services: Sequence[Service], patience: float = PATIENCE_S
) -> Any:
    """Poll ``check`` until it returns something truthy; a dead service fails at once."""
    deadline = time.monotonic() + patience
    while True:
        result = check()
        if result:
            return result
        dead = [s for s in services if not s.alive()]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0].name} exited" if dead else f"not within {patience:.0f} s"
            logs = "\n".join(f"--- {s.name} ({s.log}):\n{s.tail()}" for s in services)
            raise StackError(f"waiting for {what}: {why}\n{logs}")
        time.sleep(0.25)


def http_json(
    url: str,
    *,
    method: str = "GET",
    body: Any = None,
    token: str | None = None,
) -> tuple[int, Any]:
    """(status, parsed JSON or text) of one request; connection errors are status 0."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- the parts ---


@dataclass
class S3Endpoint:
    url: str
    bucket: str
    service: Service
    key: str = ""
    secret: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            key=self.key, secret=self.secret, endpoint_url=self.url, skip_instance_cache=True
        )


# moto checks credentials and IAM policies after this many requests: the three that create
# the stack's user, its policy and its access key.
_UNAUTHENTICATED_SETUP = ("create_user", "put_user_policy", "create_access_key")


def start_s3(workdir: Path, bucket: str = "statekeeper") -> S3Endpoint:
    """An S3 endpoint that checks credentials (wrong keys are refused, as by a real store)."""
    import boto3

    port = free_port()
    service = Service(
        "s3",
        [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        base_env({"INITIAL_NO_AUTH_ACTION_COUNT": str(len(_UNAUTHENTICATED_SETUP))}),
        workdir / "s3.log",
    ).start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: port_open(port), "the S3 endpoint", [service])
    iam = boto3.client(
        "iam", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id="setup", aws_secret_access_key="setup",
    )  # fmt: skip
    iam.create_user(UserName="statekeeper")
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip
    iam.put_user_policy(UserName="statekeeper", PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="statekeeper")["AccessKey"]
    endpoint = S3Endpoint(url, bucket, service, key["AccessKeyId"], key["SecretAccessKey"])
    endpoint.fs().mkdir(bucket)
    return endpoint


@dataclass
class SparkCluster:
    master_url: str
    ui_url: str
    services: list[Service]

    def alive_workers(self) -> int:
        status, body = http_json(f"{self.ui_url}/json/")
        return int(body.get("aliveworkers", 0)) if status == 200 and isinstance(body, dict) else 0

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master ran or runs (id, name, state)."""
        status, body = http_json(f"{self.ui_url}/json/")
        assert status == 200, body
        return [*body.get("activeapps", []), *body.get("completedapps", [])]

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


def spark_class(*args: str) -> list[str]:
    return ["bash", str(spark_home() / "bin" / "spark-class"), *args]


def start_spark(workdir: Path, env: Mapping[str, str], workers: int = 2) -> SparkCluster:
    port, ui = free_port(), free_port()
    master = Service(
        "spark-master",
        spark_class(
            MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)
        ),
        base_env(env),
        workdir / "spark-master.log",
    ).start()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", [master])
    for i in range(1, workers + 1):
        cluster.services.append(
            Service(
                f"spark-worker-{i}",
                spark_class(
                    WORKER_CLASS,
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(workdir / f"work-{i}"),
                    cluster.master_url,
                ),  # fmt: skip
                base_env(env),
                workdir / f"spark-worker-{i}.log",
            ).start()
        )
    wait_until(
        lambda: cluster.alive_workers() >= workers, f"{workers} Spark workers", cluster.services
    )
    return cluster


@dataclass
class AirflowDeployment:
    url: str
    password: str
    env: dict[str, str]
    services: list[Service]
    token: str = ""

    def login(self) -> str:
        status, body = http_json(
            f"{self.url}/auth/token",
            method="POST",
            body={"username": "admin", "password": self.password},
        )
        assert status in (200, 201), (status, body)
        self.token = body["access_token"]
        return self.token

    def api(self, path: str, *, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        return http_json(f"{self.url}/api/v2{path}", method=method, body=body, token=self.token)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


def airflow_env(
    home: Path, *, db_url: str, port: int, spark_master_url: str, extra: Mapping[str, str]
) -> dict[str, str]:
    host, _, spark_port = spark_master_url.rpartition(":")
    return base_env(
        {
            **extra,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "statekeeper-cluster-tests-" + "0123456789abcdef" * 4,
            "AIRFLOW__API__SECRET_KEY": "statekeeper-cluster-tests-secret",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # Only the runs a test triggers: unpausing the hourly DAG must not add a scheduled run.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            # Host with its scheme, port apart, exactly as in docker-compose.yml.
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {"conn_type": "spark", "host": host, "port": int(spark_port)}
            ),
        }
    )


def start_airflow(home: Path, env: dict[str, str]) -> AirflowDeployment:
    home.mkdir(parents=True, exist_ok=True)
    password = "cluster-tests-admin"
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    airflow = str(VENV_BIN / "airflow")
    migrate = subprocess.run(
        [airflow, *AIRFLOW_COMMANDS[0]], env=env, capture_output=True, text=True, check=False
    )
    if migrate.returncode != 0:
        raise StackError(f"airflow db migrate failed:\n{migrate.stdout}\n{migrate.stderr}")
    services = [
        Service(f"airflow-{argv[0]}", [airflow, *argv], env, home / f"{argv[0]}.log").start()
        for argv in AIRFLOW_COMMANDS[1:]
    ]
    deployment = AirflowDeployment(
        f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}", password, env, services
    )
    wait_until(
        lambda: http_json(f"{deployment.url}/api/v2/monitor/health")[0] == 200,
        "Airflow's API server",
        services,
    )
    deployment.login()
    return deployment
