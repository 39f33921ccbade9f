"""Daily TTL cleanup: a new snapshot without the expired entries, for every job that has some."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task
from statekeeper_airflow.operators import SNAPSHOTS, StatekeeperJobOperator

log = logging.getLogger(__name__)

DOC = """
### Statekeeper TTL cleanup

Runs daily against the catalog named by `STATEKEEPER_CATALOG_URL`.

1. **plan** reads every job's latest COMPLETED snapshot from the catalog and keeps those that
   are canonical and hold at least one state with a TTL (read from the snapshot's `_metadata`).
   Jobs without a completed snapshot, whose latest snapshot is a heap delta (the maintenance
   DAG's compaction makes it canonical) or without TTL states are logged and left alone.
2. **ttl_cleanup** (one mapped task per job) runs the `ttl_cleanup` Spark job on that snapshot:
   it writes a new canonical checkpoint without the entries whose TTL expired (processing-time
   TTL against `at`, or the time of the run; event-time TTL against `watermark`, when given)
   and records the run, with this DAG's id and run id, in the catalog. The input is never
   modified. Each new snapshot is an asset event on `statekeeper://<job>/snapshots` (alias
   `statekeeper-snapshots`).

Spark runs in-process (`local[*]`) unless the `spark_default` connection names a cluster.
A retry of a task reuses its catalog run id: a run that already succeeded is not written twice.

**Flink jobs** (imported with `statectl flink import`) are cleaned when `ttl` is given (a Flink
snapshot does not store the TTL): each one's latest snapshot Flink wrote is rewritten on Spark
into a new canonical Flink savepoint without the entries Flink would treat as expired at `at`
(`lastAccessTimestamp + ttl <= at`), a SAVEPOINT of the job in the catalog; the task log says how
to restore it. Without `ttl` they are logged and left alone.

**Params**: `job` (or empty): clean only this job. `ttl` (a list of `STATE=MS`): the TTL of each
Flink TTL state to clean. `watermark` (epoch ms or empty): event-time watermark for event-time
TTL states; empty leaves those states as they are. `at` (epoch ms or empty): the processing
time that processing-time TTL states expire against; empty: the time of the run. A job whose
clock is not the wall clock (e.g. one driven by record timestamps) needs its own time here, or
the cleanup drops entries the job would still read.
"""


@dag(
    dag_id="statekeeper_ttl_cleanup",
    schedule="@daily",
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["statekeeper", "maintenance", "ttl"],
    default_args={"owner": "statekeeper", "retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=DOC,
    params={
        "job": Param(
            None,
            type=["null", "string"],
            title="Job",
            description="Clean only this job; leave empty for every job.",
        ),
        "ttl": Param(
            [],
            type="array",
            items={"type": "string", "pattern": "^[^=]+=[0-9]+$"},
            title="Flink TTLs (STATE=MS)",
            description="Flink jobs: the TTL in ms of each TTL state to clean, as STATE=MS (a "
            "Flink snapshot does not store it); leave empty to leave Flink jobs alone.",
        ),
        "watermark": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="Event-time watermark (epoch ms)",
            description="Entries of event-time TTL states expire against this watermark; leave "
            "empty to keep every event-time state as it is.",
        ),
        "at": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="Processing time (epoch ms)",
            description="Entries of processing-time TTL states expire against this time; leave "
            "empty to use the time of the run.",
        ),
    },
)
def statekeeper_ttl_cleanup() -> None:
    @task
    def plan(params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from state_engine.catalog import Catalog
        from state_engine.maintenance.plan import ttl_plan

        with Catalog.from_settings() as catalog:
            result = ttl_plan(catalog)
            flink = {j.name for j in catalog.list_jobs() if j.origin == "flink"}
        only = (params or {}).get("job") or None
        ttl = list((params or {}).get("ttl") or [])
        for item in result["skipped"]:
            if not (ttl and item["job"] in flink) and only in (None, item["job"]):
                log.info("%s: skipped: %s", item["job"], item["reason"])
        watermark = (params or {}).get("watermark")
        at = (params or {}).get("at")
        targets = [
            {
                "job": t["job"],
                "job_params": {"snapshot": t["snapshot"], "watermark": watermark, "at": at},
            }
            for t in result["targets"]
            if only in (None, t["job"])
        ]
        if ttl:  # Flink jobs: their latest snapshot Flink wrote, into a Flink savepoint
            targets += [
                {"job": name, "job_params": {"ttl": ttl, "at": at}}
                for name in sorted(flink)
                if only in (None, name)
            ]
        return targets

    StatekeeperJobOperator.partial(
        task_id="ttl_cleanup",
        maintenance="ttl_cleanup",
        outlets=[SNAPSHOTS],
        max_active_tis_per_dagrun=2,
    ).expand_kwargs(plan())


statekeeper_ttl_cleanup()
