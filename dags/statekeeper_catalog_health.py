"""Hourly catalog health: reachable and at head, then a report per job (returned as XCom)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task
from airflow.sdk.exceptions import AirflowFailException

log = logging.getLogger(__name__)

DOC = """
### Statekeeper catalog health

Runs hourly against the catalog named by `STATEKEEPER_CATALOG_URL` (or the SQLite catalog under
`STATEKEEPER_HOME`).

1. **check_catalog** fails when the catalog is unreachable (retried) or its schema is not at
   this code's head revision (not retried: run `statectl catalog upgrade`, then clear the task).
2. **report** returns, per job, the latest completed snapshot and its age, and the PENDING
   snapshots older than `stale_pending_minutes`: commits that never completed. Their files stay
   pinned until the snapshot is failed: the job's next run does so when it starts (a run's own
   commits only; it holds the job's writer lease), the maintenance DAG's expire step after
   `abort_pending_older_than` (or `statectl maintain expire --job JOB
   --abort-pending-older-than 1h`), and the orphan cleanup then reclaims the rest.

The report is the task's return value (XCom `return_value`).
"""


@dag(
    dag_id="statekeeper_catalog_health",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["statekeeper", "catalog", "monitoring"],
    default_args={"owner": "statekeeper", "retries": 2, "retry_delay": timedelta(minutes=2)},
    doc_md=DOC,
    params={
        "stale_pending_minutes": Param(
            30,
            type="integer",
            minimum=1,
            title="Stale PENDING after (minutes)",
            description="A PENDING snapshot older than this is reported as a stale commit.",
        )
    },
)
def statekeeper_catalog_health() -> None:
    @task
    def check_catalog() -> str:
        from state_engine.catalog import check_at_head
        from state_engine.config import Settings
        from state_engine.errors import CatalogVersionMismatch, ConfigurationError

        try:
            return check_at_head(Settings.from_env().catalog_url)
        except (CatalogVersionMismatch, ConfigurationError) as exc:
            # Retrying cannot fix a schema or a setting: fail at once with the message.
            raise AirflowFailException(str(exc)) from exc

    @task
    def report(revision: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        from state_engine.catalog import Catalog
        from state_engine.health import health_report, summary_lines

        minutes = int((params or {})["stale_pending_minutes"])
        with Catalog.from_settings() as catalog:
            result = health_report(
                catalog, now=datetime.now(UTC), stale_pending_after=timedelta(minutes=minutes)
            )
        result["revision"] = revision
        for line in summary_lines(result):
            log.info("%s", line)
        return result

    report(check_catalog())  # type: ignore[arg-type]  # an XComArg, resolved to the str at run time


statekeeper_catalog_health()
