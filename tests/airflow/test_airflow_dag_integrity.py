"""Every DAG in dags/ imports cleanly and carries the metadata operators rely on."""

from __future__ import annotations

from pathlib import Path

import pytest
from sk_airflow_support import DAGS


@pytest.fixture(scope="module")
def dag_bag() -> object:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_file_imports_without_errors(dag_bag: object) -> None:
    assert dag_bag.import_errors == {}  # type: ignore[attr-defined]


def test_the_bag_holds_only_our_dags_and_the_health_dag_is_one(dag_bag: object) -> None:
    dags = dag_bag.dags  # type: ignore[attr-defined]
    assert "statekeeper_catalog_health" in dags
    for dag in dags.values():
        assert Path(dag.fileloc).parent == DAGS, f"{dag.dag_id} comes from {dag.fileloc}"


def test_every_dag_has_tags_owner_retries_and_docs(dag_bag: object) -> None:
    problems = []
    for dag_id, dag in dag_bag.dags.items():  # type: ignore[attr-defined]
        if not dag.tags:
            problems.append(f"{dag_id}: no tags")
        if not dag.doc_md or not dag.doc_md.strip():
            problems.append(f"{dag_id}: no doc_md")
        owner = dag.default_args.get("owner")
        if not owner or owner == "airflow":
            problems.append(f"{dag_id}: default_args has no owner of its own")
        if "retries" not in dag.default_args:
            problems.append(f"{dag_id}: default_args sets no retries")
        for task in dag.tasks:
            if task.owner != owner:
                problems.append(f"{dag_id}.{task.task_id}: owner {task.owner!r}, not {owner!r}")
    assert problems == []
