"""Airflow side of Apache Flink jobs: sync from configured directories, maintenance dispatch, and
a savepoint triggered through Flink's REST API.

* :func:`configured_jobs` -- the jobs the ``statekeeper_flink_sync`` DAG imports (the Variable
  ``statekeeper_flink_jobs``, else the file named by ``STATEKEEPER_FLINK_JOBS_FILE``; see
  :mod:`state_engine.flink.jobs_config`).
* :func:`run_flink_maintenance` -- ``expire``, ``orphan_cleanup`` and ``savepoint`` of a job of
  origin flink run in-process without Spark (the maintenance and savepoint DAGs call it first).
* :class:`FlinkSavepointOperator` -- ``POST /jobs/:jobid/savepoints`` on a running Flink cluster
  through the HTTP connection ``flink_default``, polls the trigger until the savepoint completes,
  then imports it into the catalog.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

log = logging.getLogger(__name__)

FLINK_CONN_ID = "flink_default"
FLINK_KINDS = ("expire", "orphan_cleanup", "savepoint")


def configured_jobs() -> list[dict[str, Any]]:
    """The configured Flink jobs as plain dicts (for XCom)."""
    from airflow.sdk import Variable

    from state_engine.flink.jobs_config import VARIABLE, load_jobs_config

    text = Variable.get(VARIABLE, default=None)
    return [c.as_dict() for c in load_jobs_config(text)]


def sync_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """Import/sync one configured job's directories into the catalog; the import report."""
    from state_engine.catalog import Catalog
    from state_engine.errors import ConfigurationError, FlinkError, NotFound
    from state_engine.flink.import_job import import_flink

    paths = ([job["checkpoint_dir"]] if job.get("checkpoint_dir") else []) + list(
        job.get("savepoint_dirs") or []
    )
    try:
        with Catalog.from_settings() as catalog:
            report = import_flink(catalog, paths, job["name"], manage=job.get("manage"))
    except (ConfigurationError, NotFound, FlinkError) as exc:
        raise AirflowFailException(f"Flink job {job['name']!r}: {exc}") from exc
    log.info("%s", report.render())
    for missing in report.missing_directories:
        # its snapshots stay (a volume may come back); verify fails on them until it is back
        log.warning(
            "Flink job %r: directory %s is missing; its snapshots are kept. If it was deleted on "
            "purpose: statectl flink forget-directory %s --job %s, and take it out of the job's "
            "configuration",
            job["name"],
            missing,
            missing,
            job["name"],
        )
    return report.to_dict()


def verify_job(name: str) -> dict[str, Any]:
    """``statectl verify NAME --sync``; fails the task when the catalog and storage disagree.

    A running Flink job subsumes checkpoints at any moment, also between the sync and this
    verify: when a snapshot's ``_metadata`` is missing, the job's directories are synced once more
    (which marks a subsumed checkpoint vanished) and verified again. What a sync does not explain
    (a missing directory, a missing data file) still fails."""
    from state_engine.catalog import Catalog
    from state_engine.verify import verify

    with Catalog.from_settings() as catalog:
        report = verify(catalog, name, sync=True)
    text = report.render()
    log.info("%s", text)
    if not report.ok:
        raise AirflowFailException(f"verify of Flink job {name!r} found inconsistencies:\n{text}")
    return report.to_dict()


def run_flink_maintenance(
    kind: str, params: Mapping[str, Any], ids: Mapping[str, str]
) -> dict[str, Any] | None:
    """Run ``kind`` on a job of origin flink in-process; None when ``params['job']`` is not one."""
    from state_engine.catalog import Catalog
    from state_engine.config import Settings
    from state_engine.errors import FlinkConversionError, InvalidJobParams
    from state_engine.flink.retention import is_flink_job, run_maintenance

    settings = Settings.from_env()
    with Catalog.from_settings(settings) as catalog:
        job = params.get("job")
        if not is_flink_job(catalog, job):
            return None
        if kind in ("expire", "orphan_cleanup"):
            return run_maintenance(catalog, kind, settings, **ids, **params)
        if kind == "savepoint":
            from state_engine.flink import convert

            snapshot = params.get("snapshot")
            if snapshot is None:
                # the newest snapshot *Flink* wrote: a savepoint converted earlier is newer
                # still, but it is Statekeeper's, not a Flink snapshot to convert
                try:
                    snapshot = convert.latest_flink_snapshot(catalog, str(job))
                except FlinkConversionError as exc:
                    raise InvalidJobParams(str(exc)) from None  # no retry can fix it
            if snapshot is None:  # not reached: is_flink_job said it is a Flink job
                raise InvalidJobParams(f"job {job!r} is not a Flink job")
            return convert.run(
                catalog,
                int(snapshot),
                savepoint_dir=params.get("savepoint_dir"),
                run_id=ids.get("run_id"),
                settings=settings,
            )
        raise InvalidJobParams(
            f"{kind} does not work on Flink job {job!r} (its snapshots are Flink's): convert a "
            "snapshot with the savepoint DAG, then run it on the converted savepoint's job"
        )


# --- the REST savepoint trigger ---


class FlinkRest:
    """Flink's REST API at the HTTP connection ``conn_id`` (host, port, schema http/https)."""

    def __init__(self, conn_id: str = FLINK_CONN_ID, timeout: float = 30.0) -> None:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
        host = conn.host or "localhost"
        if "://" in host:
            base = host.rstrip("/")
        else:
            scheme = conn.schema or "http"
            base = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
        self.base = base
        self.timeout = timeout

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise AirflowException(
                f"Flink REST {method} {path}: HTTP {exc.code}: {detail}"
            ) from exc
        except urllib.error.URLError as exc:
            raise AirflowException(f"Flink REST at {self.base} unreachable: {exc.reason}") from exc


class FlinkSavepointOperator(BaseOperator):
    """Trigger a savepoint of a running Flink job, wait for it, import it into the catalog.

    ``flink_job_id``: the Flink job id (32 hex); ``job``: the catalog job name it is imported
    under; ``target_directory``: where Flink writes it (default: the cluster's
    ``execution.checkpointing.savepoint-dir``); ``format_type``: ``CANONICAL`` or ``NATIVE``;
    ``import_paths``: the directories synced after the savepoint completes (default: the
    savepoint's own directory). Polling waits ``poll_interval`` seconds between trigger-status
    requests, at most ``max_polls`` times.
    """

    template_fields: Sequence[str] = ("flink_job_id", "job", "target_directory", "import_paths")
    ui_color = "#fde9e3"

    def __init__(
        self,
        *,
        flink_job_id: str,
        job: str,
        target_directory: str | None = None,
        format_type: str = "CANONICAL",
        import_paths: Sequence[str] | None = None,
        http_conn_id: str = FLINK_CONN_ID,
        poll_interval: float = 2.0,
        max_polls: int = 900,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.flink_job_id = flink_job_id
        self.job = job
        self.target_directory = target_directory
        self.format_type = format_type.upper()
        self.import_paths = list(import_paths or [])
        self.http_conn_id = http_conn_id
        self.poll_interval = poll_interval
        self.max_polls = max_polls
        self._stop = threading.Event()

    def trigger(self, rest: FlinkRest) -> str:
        body: dict[str, Any] = {"cancel-job": False, "formatType": self.format_type}
        if self.target_directory:
            body["target-directory"] = self.target_directory
        answer = rest.call("POST", f"/jobs/{self.flink_job_id}/savepoints", body)
        trigger_id = (answer or {}).get("request-id")
        if not trigger_id:
            raise AirflowException(
                f"Flink answered the savepoint trigger without a request-id: {answer}"
            )
        return str(trigger_id)

    def wait(self, rest: FlinkRest, trigger_id: str) -> str:
        path = f"/jobs/{self.flink_job_id}/savepoints/{trigger_id}"
        for _ in range(self.max_polls):
            answer = rest.call("GET", path) or {}
            if (answer.get("status") or {}).get("id") == "COMPLETED":
                operation = answer.get("operation") or {}
                if operation.get("location"):
                    return str(operation["location"])
                cause = operation.get("failure-cause") or {}
                raise AirflowException(
                    f"Flink savepoint {trigger_id} of job {self.flink_job_id} failed: "
                    f"{cause.get('stack-trace', cause) if isinstance(cause, dict) else cause}"[
                        :2000
                    ]
                )
            # the REST API offers no notification: poll at the configured pace
            self._stop.wait(self.poll_interval)
        raise AirflowException(
            f"Flink savepoint {trigger_id} of job {self.flink_job_id} did not complete after "
            f"{self.max_polls} polls"
        )

    def execute(self, context: Any) -> dict[str, Any]:
        rest = FlinkRest(self.http_conn_id)
        trigger_id = self.trigger(rest)
        log.info("savepoint of Flink job %s triggered: %s", self.flink_job_id, trigger_id)
        location = self.wait(rest, trigger_id)
        log.info("savepoint of Flink job %s written to %s", self.flink_job_id, location)
        paths = self.import_paths or [location]
        report = sync_job({"name": self.job, "savepoint_dirs": paths})
        return {"trigger_id": trigger_id, "location": location, "import": report}
