"""Capture a savepoint of one job, triggered by hand from the Airflow UI's form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag
from statekeeper_airflow.actions import job_examples
from statekeeper_airflow.operators import StatekeeperJobOperator

from state_engine.ids import MAX_ID
from state_engine.names import MAX_JOB_NAME_LENGTH

DOC = """
### Statekeeper savepoint

Triggered by hand (**Trigger** in the UI shows a form). The `savepoint` Spark job writes a
relocatable canonical SAVEPOINT of a completed snapshot of `job`: canonical, heap delta and
RocksDB native inputs alike. The savepoint holds relative paths only: its directory can be
copied or moved and still restores. Savepoints belong to the user: no scheduled DAG expires them.

The run is recorded in the catalog with this DAG's id, run id and task id; the new snapshot is an
asset event on `statekeeper://<job>/snapshots`. A job or snapshot the catalog does not know fails
the task at once (no retry) with the reason; such a run is not recorded in the catalog.
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
- `ttl` (Flink jobs only): the TTL of each TTL state in ms, one `STATE=MS` per item (Flink does
  not store it; without it the converted state loses its TTL).
- `pyflink_types` (PyFlink jobs only): how each Python state is coded, one
  `STATE=KIND[:TYPE[:TYPE]]` per item, e.g. `total=value:LONG`.
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
            maxLength=MAX_JOB_NAME_LENGTH,
            # the catalog's jobs when this file was parsed, as suggestions (any name is accepted)
            **job_examples(),
            title="Job",
            description="Name of the Statekeeper job to capture (as listed by `statectl jobs`).",
        ),
        "source_snapshot": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_ID,
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
        "ttl": Param(
            [],
            type=["null", "array"],
            items={"type": "string", "pattern": "^[^=]+=[1-9][0-9]*$"},
            title="TTLs of a Flink job's states (ms)",
            description="Flink jobs only: one STATE=MS per line, the TTL the Flink job configured "
            "for that state (Flink does not store it), e.g. lastSeen=3600000.",
        ),
        "pyflink_types": Param(
            [],
            type=["null", "array"],
            items={"type": "string", "pattern": "^[^=]+=.+$"},
            title="PyFlink state types",
            description="PyFlink jobs only: one STATE=KIND[:TYPE[:TYPE]] per line, how a Python "
            "state is coded, e.g. total=value:LONG.",
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
            # empty lists stay unset: only a Flink job's conversion takes them
            "ttl": "{{ params.ttl or None }}",
            "pyflink_types": "{{ params.pyflink_types or None }}",
        },
    )


statekeeper_savepoint()
