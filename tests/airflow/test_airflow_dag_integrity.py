"""Every DAG in dags/ imports cleanly and carries the metadata operators rely on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.airflow.sk_airflow_support import DAGS

if TYPE_CHECKING:  # airflow is imported only once the conftest configured it
    from airflow.dag_processing.dagbag import DagBag


@pytest.fixture(scope="module")
def dag_bag() -> DagBag:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_file_imports_without_errors(dag_bag: DagBag) -> None:
    assert dag_bag.import_errors == {}


def test_the_bag_holds_only_our_dags_and_the_health_dag_is_one(dag_bag: DagBag) -> None:
    dags = dag_bag.dags
    assert "statekeeper_catalog_health" in dags
    for dag in dags.values():
        assert Path(dag.fileloc).parent == DAGS, f"{dag.dag_id} comes from {dag.fileloc}"


def test_every_dag_has_tags_owner_retries_and_docs(dag_bag: DagBag) -> None:
    problems = []
    for dag_id, dag in dag_bag.dags.items():
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
