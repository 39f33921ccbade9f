"""Links from the Statekeeper pages into Airflow's own UI: the DAGs that act on a job (trigger
forms) and the DAG runs and task logs behind each maintenance run.

No form of our own: every action opens Airflow's page for the DAG, so Airflow's login and
permissions decide who may trigger what. The links carry the job (and snapshot) as the trigger
form's configuration in the URL (``?conf={...}``, as Airflow 2.7+ read it). Airflow 3.3.2's UI has
no way to pre-fill a trigger form from a link (apache/airflow#59231 added one, #59769 reverted it;
#54800 is open), so the DAG's trigger form offers the catalog's jobs as suggestions
(:func:`job_examples`) and each page shows the configuration JSON to paste.

Links are relative to the plugin's root (``root``), so they work under any ``[api] base_url``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

#: Where the plugin app is mounted under Airflow's root (statekeeper_plugin.py's url_prefix).
MOUNT_DEPTH = 1


@dataclass(frozen=True)
class Action:
    label: str
    dag_id: str
    conf: dict[str, object]
    hint: str


def airflow_root(root: str) -> str:
    """From a page whose way back to the plugin's root is ``root``, the way to Airflow's root."""
    return root + "../" * MOUNT_DEPTH


def dag_href(root: str, dag_id: str, conf: dict[str, object] | None = None) -> str:
    base = f"{airflow_root(root)}dags/{quote(dag_id, safe='')}"
    if not conf:
        return base
    return f"{base}?{urlencode({'conf': json.dumps(conf, separators=(',', ':'))})}"


def job_actions(job: str, snapshot_id: int | None = None) -> list[Action]:
    """What an operator does to a job (or one of its snapshots) from Airflow's trigger forms."""
    source: dict[str, object] = {} if snapshot_id is None else {"source_snapshot": snapshot_id}
    return [
        Action(
            "Take savepoint",
            "statekeeper_savepoint",
            {"job": job, **source},
            "a relocatable canonical savepoint",
        ),
        Action(
            "Rescale…",
            "statekeeper_rescale",
            {"job": job, **source},
            "choose the new parallelism in the form",
        ),
        Action("TTL cleanup", "statekeeper_ttl_cleanup", {}, "every job's expired entries"),
        Action("Compact", "statekeeper_maintenance", {}, "compaction, expiry, orphan cleanup"),
    ]


#: The task of each maintenance kind in the DAGs that run it, and whether it is mapped.
TASKS: dict[tuple[str, str], tuple[str, bool]] = {
    ("statekeeper_savepoint", "savepoint"): ("savepoint", False),
    ("statekeeper_rescale", "rescale"): ("rescale", False),
    ("statekeeper_ttl_cleanup", "ttl_cleanup"): ("ttl_cleanup", True),
    ("statekeeper_maintenance", "compaction"): ("maintain.compaction", True),
    ("statekeeper_maintenance", "expire"): ("maintain.expire", True),
    ("statekeeper_maintenance", "orphan_cleanup"): ("maintain.orphan_cleanup", True),
}


def dag_run_href(root: str, dag_id: str, airflow_run_id: str) -> str:
    return (
        f"{airflow_root(root)}dags/{quote(dag_id, safe='')}/runs/{quote(airflow_run_id, safe='')}"
    )


def task_log_href(root: str, dag_id: str, airflow_run_id: str, kind: str) -> str | None:
    """The task instance page (its log) of a run's kind, when this project's DAGs run it."""
    task = TASKS.get((dag_id, kind))
    if task is None:
        return None
    task_id, mapped = task
    href = f"{dag_run_href(root, dag_id, airflow_run_id)}/tasks/{quote(task_id, safe='')}"
    return f"{href}/mapped" if mapped else href


def known_jobs(limit: int = 200) -> list[str]:
    """The catalog's job names, for the trigger forms' suggestions; [] when the catalog cannot
    be read (a DAG file must parse without its catalog)."""
    try:
        from state_engine.catalog import Catalog
        from state_engine.catalog.engine import parse_url, sqlite_path
        from state_engine.config import Settings

        settings = Settings.from_env()
        path = sqlite_path(parse_url(settings.catalog_url))
        if path is not None and not path.is_file():
            return []  # no catalog yet: parsing a DAG must not create one
        with Catalog.from_settings(settings) as catalog:
            return [j.name for j in catalog.list_jobs(limit=limit)]
    except Exception:  # noqa: BLE001  (parse-time suggestions are optional by design)
        return []


def job_examples() -> dict[str, Any]:
    """A job ``Param``'s JSON-schema keywords: the catalog's jobs as ``examples``, or none."""
    jobs = known_jobs()
    return {"examples": jobs} if jobs else {}
