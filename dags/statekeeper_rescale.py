"""Rescale one job's state to a new parallelism, triggered by hand from the Airflow UI's form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag
from statekeeper_airflow.actions import job_examples
from statekeeper_airflow.operators import StatekeeperJobOperator

from state_engine.parallelism_limits import UPPER_BOUND_MAX_PARALLELISM

MAX_PARALLELISM = UPPER_BOUND_MAX_PARALLELISM  # and so the upper bound on parallelism

DOC = """
### Statekeeper rescale

Triggered by hand (**Trigger** in the UI shows a form). The `rescale` Spark job makes a
completed snapshot of `job` restorable at `parallelism`:

- at the same max parallelism nothing is rewritten: the new checkpoint is a new `_metadata`
  (and catalog entry) over the existing files, each new subtask reading its key-group range;
- with a new `max_parallelism` every row is re-bucketed by its key hash into a new canonical
  savepoint (no key is deserialized).

Operator state is redistributed (SPLIT lists evenly, UNION lists whole, BROADCAST copied).
The run is recorded in the catalog with this DAG's id and run id; the new snapshot is an asset
event on `statekeeper://<job>/snapshots`. The form refuses a parallelism outside 1..32768; a
parallelism above the (new) max parallelism, or a job or snapshot the catalog does not know,
fails the task at once with the reason, recorded FAILED in the catalog.
Spark runs in-process (`local[*]`) unless the `spark_default` connection names a cluster.

**Flink jobs** (imported with `statectl flink import`): the job's snapshot (its latest one Flink
wrote, or `source_snapshot`) is rewritten on Spark into a new canonical Flink savepoint at
`parallelism` and `max_parallelism` (every key moves to its new key group), a SAVEPOINT of the
job in the catalog; the task log says how to restore it (`flink run -s <dir>`) and warns when the
job's configured max parallelism must change. A parallelism-only change of a canonical savepoint
needs no rewrite: the log says so, with the command.

**Params**
- `job`: the job to rescale (required).
- `parallelism`: the new parallelism, 1..32768 (required).
- `max_parallelism`: a new max parallelism, 1..32768; empty keeps the job's.
- `source_snapshot`: the snapshot id to rescale; empty: the job's latest completed snapshot.
- `savepoint_dir`: where the new savepoint goes (a URL or a path under the job's root); empty:
  the job's `savepoints/`.
"""


@dag(
    dag_id="statekeeper_rescale",
    schedule=None,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["statekeeper", "operations", "rescale"],
    default_args={"owner": "statekeeper", "retries": 1, "retry_delay": timedelta(minutes=2)},
    doc_md=DOC,
    # keeps "{{ params.parallelism }}" an int (and an empty param None) instead of its text
    render_template_as_native_obj=True,
    params={
        "job": Param(
            type="string",
            minLength=1,
            # the catalog's jobs when this file was parsed, as suggestions (any name is accepted)
            **job_examples(),
            title="Job",
            description="Name of the Statekeeper job to rescale (as listed by `statectl jobs`).",
        ),
        "parallelism": Param(
            type="integer",
            minimum=1,
            maximum=MAX_PARALLELISM,
            title="New parallelism",
            description=f"Number of subtasks the job will restore with (1 to {MAX_PARALLELISM}, "
            "at most the max parallelism).",
        ),
        "max_parallelism": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_PARALLELISM,
            title="New max parallelism",
            description=f"Number of key groups (1 to {MAX_PARALLELISM}). Leave empty to keep the "
            "job's; a new value rewrites the state into a new savepoint.",
        ),
        "source_snapshot": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Source snapshot",
            description="Id of the completed snapshot to rescale; leave empty for the job's "
            "latest completed snapshot.",
        ),
        "savepoint_dir": Param(
            None,
            type=["null", "string"],
            title="Savepoint directory",
            description="Directory of the new savepoint (a URL or a path under the job's root); "
            "leave empty for the job's savepoints/.",
        ),
    },
)
def statekeeper_rescale() -> None:
    StatekeeperJobOperator(
        task_id="rescale",
        maintenance="rescale",
        job="{{ params.job }}",
        job_params={
            "snapshot": "{{ params.source_snapshot }}",
            "parallelism": "{{ params.parallelism }}",
            "max_parallelism": "{{ params.max_parallelism }}",
            "savepoint_dir": "{{ params.savepoint_dir }}",
        },
    )


statekeeper_rescale()
