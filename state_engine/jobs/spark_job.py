"""A maintenance job on Spark: a recorded run (:mod:`state_engine.maintenance.run`) whose body
is handed the session.

``@maintenance_job(kind, resolve)`` turns ``body(spark, catalog, ctx, **params) -> JobResult``
into ``run(spark, catalog, *, run_id=None, dag_id=None, airflow_run_id=None, settings=None,
**params) -> report``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from state_engine.maintenance.run import Report, Resolver, recorded_run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from state_engine.catalog import Catalog

SparkBody = Callable[..., Any]
SparkRunner = Callable[..., Report]


def maintenance_job(kind: str, resolve: Resolver) -> Callable[[SparkBody], SparkRunner]:
    """Make ``body`` a recorded maintenance run of ``kind`` on the session it is given."""

    def wrap(body: SparkBody) -> SparkRunner:
        @functools.wraps(body)
        def run(spark: SparkSession | None, catalog: Catalog, **options: Any) -> Report:
            return recorded_run(kind, resolve)(functools.partial(body, spark))(catalog, **options)

        run.kind = kind  # type: ignore[attr-defined]  # tags the job function with its kind
        return run

    return wrap
