"""Capture a savepoint of one job, triggered by hand from the Airflow UI's form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag
from statekeeper_airflow.actions import job_examples
from statekeeper_airflow.operators import StatekeeperJobOperator

DOC = """
### Statekeeper savepoint

Triggered by hand (**Trigger** in the UI shows a form). The `savepoint` Spark job writes a
relocatable canonical SAVEPOINT of a completed snapshot of `job`: canonical, heap delta and
RocksDB native inputs alike. The savepoint holds relative paths only: its directory can be
copied or moved and still restores. Savepoints belong to the user: no scheduled DAG expires them.

The run is recorded in the catalog with this DAG's id and run id; the new snapshot is an asset
event on `statekeeper://<job>/snapshots`. A job or snapshot the catalog does not know fails the
task at once (no retry) with the reason, and the catalog records the FAILED run.
Spark runs in-process (`local[*]`) unless the `spark_default` connection names a cluster.

**Params**
- `job`: the job to capture (required).
- `source_snapshot`: the snapshot id to capture; empty: the job's latest completed snapshot.
- `target_dir`: where to write it: a path under the job's checkpoint root, or a URL under the
  root or under a directory named in `STATEKEEPER_ALLOWED_SAVEPOINT_DIRS` (comma-separated URLs,
  set on the workers); anything else is refused before Spark starts. Empty: the job's default
  savepoint directory.
- `drop_expired`: leave out entries whose processing-time TTL had expired when the run was
  triggered.
"""


@dag(
    dag_id="statekeeper_savepoint",
    schedule=None,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["statekeeper", "operations", "savepoint"],
    default_args={"owner": "statekeeper", "retries": 1, "retry_delay": timedelta(minutes=2)},
    doc_md=DOC,
    # keeps "{{ params.source_snapshot }}" an int (or None) instead of its text
    render_template_as_native_obj=True,
    params={
        "job": Param(
            type="string",
            minLength=1,
            # the catalog's jobs when this file was parsed, as suggestions (any name is accepted)
            **job_examples(),
            title="Job",
            description="Name of the Statekeeper job to capture (as listed by `statectl jobs`).",
        ),
        "source_snapshot": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Source snapshot",
            description="Id of the completed snapshot to capture; leave empty for the job's "
            "latest completed snapshot.",
        ),
        "target_dir": Param(
            None,
            type=["null", "string"],
            title="Target directory",
            description="Where to write the savepoint: a path under the job's checkpoint root, "
            "or a URL under it or under STATEKEEPER_ALLOWED_SAVEPOINT_DIRS; leave empty for the "
            "job's savepoint directory.",
        ),
        "drop_expired": Param(
            False,
            type="boolean",
            title="Drop expired entries",
            description="Leave out entries whose processing-time TTL had expired when this run "
            "was triggered.",
        ),
    },
)
def statekeeper_savepoint() -> None:
    StatekeeperJobOperator(
        task_id="savepoint",
        maintenance="savepoint",
        job="{{ params.job }}",
        job_params={
            "snapshot": "{{ params.source_snapshot }}",
            "savepoint_dir": "{{ params.target_dir }}",
            # the trigger time, not the task's: a retry drops exactly what the first try dropped
            "at": "{{ (dag_run.run_after.timestamp() * 1000) | int "
            "if params.drop_expired else None }}",
        },
    )


statekeeper_savepoint()
