"""Hourly maintenance of every job: compaction of long delta chains, expiry, orphan cleanup."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, TriggerRule, dag, get_current_context, task, task_group
from airflow.sdk.exceptions import AirflowSkipException
from statekeeper_airflow.operators import SNAPSHOTS, run_maintenance

log = logging.getLogger(__name__)

DOC = """
### Statekeeper maintenance

Runs hourly against the catalog named by `STATEKEEPER_CATALOG_URL`. **list_jobs** reads every
job from the catalog; then, for each job (a mapped task group `maintain`, one instance per job,
its three steps in this order):

1. **compaction**: when the job's latest completed snapshot rests on a heap delta chain of at
   least `compaction_min_deltas` deltas, the `compaction` Spark job folds the chain into a new
   canonical checkpoint and subsumes the chain (an asset event on
   `statekeeper://<job>/snapshots`). A shorter chain, or a dry run, skips this step.
2. **expire**: the `expire` job keeps the newest `retain_last` completed checkpoints (and, with
   `expire_older_than`, those completed after that cut-off), discards the rest and deletes every
   file no retained snapshot uses (including the files the compaction released). Savepoints
   are never expired here. A PENDING snapshot begun more than `abort_pending_older_than` ago
   is a commit whose writer died: it is failed, which releases its files (and lets the orphan
   cleanup into the job's `shared/` again).
3. **orphan_cleanup**: the `orphan_cleanup` job deletes files under the job's directories that
   no snapshot references and that are older than `orphan_older_than` (files of a checkpoint in
   flight are never touched).

Expire and orphan cleanup delete only where the job's **management policy** allows it (see
`statectl jobs`): `retention` lets expire delete, `orphans` lets orphan cleanup delete. A job
imported from Apache Flink is read-only until `statectl jobs set-policy JOB --manage ...` (or
`statectl flink import ... --manage ...`) says otherwise; a Statekeeper job allows both. A step
the policy does not allow is skipped, not failed, and so is orphan cleanup of a Flink job imported
from savepoint directories only (it has no checkpoint directory to clean). **list_jobs** logs
every skip with its reason and pushes them as the XCom `plan`; each skipped task says why.
Every path a run deletes is in its report (`stats.deleted`) and on the plugin's runs page.

Expire and orphan cleanup hold the job's file lease while they delete; a run of either that
finds the lease held fails and is retried. Every run is recorded in the catalog with this
DAG's id and run id; a retry reuses the run's id, so a succeeded step is not done twice.
Spark runs in-process (`local[*]`) unless the `spark_default` connection names a cluster.

**Params**: `compaction_min_deltas` (deltas on the base before compacting, default 4),
`retain_last` (default 3), `expire_older_than` (e.g. `7d`, `12h` or an ISO timestamp; empty:
by count only), `abort_pending_older_than` (default `1d`; empty: leave PENDING snapshots
alone), `orphan_older_than` (default `3d`), `dry_run` (report what would be deleted,
change nothing).
"""


@dag(
    dag_id="statekeeper_maintenance",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["statekeeper", "maintenance", "compaction", "retention"],
    default_args={"owner": "statekeeper", "retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=DOC,
    params={
        "compaction_min_deltas": Param(
            4,
            type="integer",
            minimum=1,
            title="Compact after (deltas)",
            description="Compact a job whose latest snapshot rests on at least this many heap "
            "deltas since its last full base.",
        ),
        "retain_last": Param(
            3,
            type="integer",
            minimum=1,
            title="Checkpoints to keep",
            description="Expire keeps the newest this many completed checkpoints of every job.",
        ),
        "expire_older_than": Param(
            None,
            type=["null", "string"],
            title="Expire only checkpoints older than",
            description="A duration such as 7d or 12h, or an ISO timestamp; checkpoints beyond "
            "retain_last are expired only when completed before it. Empty: by count only.",
        ),
        "abort_pending_older_than": Param(
            "1d",
            type=["null", "string"],
            title="Fail commits pending longer than",
            description="A PENDING snapshot begun before this (a duration such as 1d, or an ISO "
            "timestamp) is a commit whose writer died: expire fails it and deletes its files. "
            "Empty: leave PENDING snapshots alone.",
        ),
        "orphan_older_than": Param(
            "3d",
            type="string",
            minLength=1,
            title="Orphan files older than",
            description="Only unreferenced files last modified before this (a duration such as "
            "3d, or an ISO timestamp) are deleted.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Report what expire and orphan cleanup would delete; change nothing "
            "(compaction is skipped).",
        ),
    },
)
def statekeeper_maintenance() -> None:
    @task
    def list_jobs() -> list[str]:
        from state_engine.catalog import Catalog
        from state_engine.flink.retention import scheduled_skips
        from state_engine.maintenance.plan import maintenance_plan

        with Catalog.from_settings() as catalog:
            plan = maintenance_plan(catalog, scheduled_skips)
        for name in plan["jobs"]:
            log.info("%s: management policy %s", name, plan["policies"][name])
        for skip in plan["skipped"]:
            log.info("%s: %s skipped: %s", skip["job"], skip["step"], skip["reason"])
        get_current_context()["ti"].xcom_push(key="plan", value=plan)
        names: list[str] = plan["jobs"]
        return names

    def skip_unless_allowed(job: str, step: str) -> None:
        """Skip (not fail) a step the job's policy or its directories leave nothing to do in."""
        from state_engine.catalog import Catalog
        from state_engine.flink.retention import scheduled_skips
        from state_engine.maintenance.plan import step_skip

        with Catalog.from_settings() as catalog:
            reason = step_skip(catalog, catalog.get_job(job), step, scheduled_skips)
        if reason is not None:
            raise AirflowSkipException(f"{job}: {step} skipped: {reason}")

    @task_group(group_id="maintain")
    def maintain(job: str) -> None:
        @task(outlets=[SNAPSHOTS])
        def compaction(job: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
            from state_engine.catalog import Catalog
            from state_engine.maintenance.plan import delta_chain

            params = params or {}
            if params["dry_run"]:
                raise AirflowSkipException(f"{job}: dry run: no compaction")
            with Catalog.from_settings() as catalog:
                chain = delta_chain(catalog, job)
            threshold = int(params["compaction_min_deltas"])
            if chain.latest_id is None or chain.deltas < threshold:
                raise AirflowSkipException(
                    f"{job}: latest snapshot {chain.latest_id} rests on {chain.deltas} deltas, "
                    f"fewer than {threshold}: no compaction"
                )
            log.info("%s: %d deltas on the base: compacting", job, chain.deltas)
            return run_maintenance(
                "compaction", job, {"snapshot": chain.latest_id}, get_current_context()
            )

        @task(trigger_rule=TriggerRule.NONE_FAILED)
        def expire(job: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
            params = params or {}
            skip_unless_allowed(job, "expire")
            return run_maintenance(
                "expire",
                job,
                {
                    "retain_last": params["retain_last"],
                    "older_than": params["expire_older_than"],
                    "abort_pending_older_than": params.get("abort_pending_older_than") or None,
                    "dry_run": params["dry_run"],
                },
                get_current_context(),
            )

        @task(trigger_rule=TriggerRule.NONE_FAILED)
        def orphan_cleanup(job: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
            params = params or {}
            skip_unless_allowed(job, "orphan_cleanup")
            return run_maintenance(
                "orphan_cleanup",
                job,
                {"older_than": params["orphan_older_than"], "dry_run": params["dry_run"]},
                get_current_context(),
            )

        compaction(job) >> expire(job) >> orphan_cleanup(job)

    maintain.expand(job=list_jobs())


statekeeper_maintenance()
