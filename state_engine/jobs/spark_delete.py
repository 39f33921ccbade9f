"""Very large deletions spread over Spark's executors, as one Spark job.

Below ``spark_min_files`` (default 20,000 files), or on storage the executors cannot reach, the
driver's thread pool deletes (:func:`state_engine.maintenance.deletion.delete_urls`): each delete
is a single metadata call, so threads saturate the store without a Spark job's overhead.
Executors delete through fsspec, as the driver would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from state_engine.errors import StatekeeperError
from state_engine.faults import crash_point
from state_engine.maintenance.deletion import THREADS, Deleter, delete_urls
from state_engine.maintenance.reachable import spark_url
from state_engine.snapshot.storage import delete_each

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_MIN_FILES = 20_000


def executor_delete() -> Callable[[Iterable[str]], list[str | None]]:
    """What a Spark task runs on its partition of URLs. It pickles by reference to the storage
    and faults modules only, so an executor imports neither the jobs nor the catalog."""
    return functools.partial(
        delete_each, after_each=functools.partial(crash_point, "deletion.after_delete_one")
    )


def spark_deleter(
    spark: SparkSession | None,
    *,
    spark_min_files: int = SPARK_MIN_FILES,
    threads: int = THREADS,
) -> Deleter:
    """Deletes URLs on ``spark``'s executors when they are many and reachable, else on threads."""

    def delete(urls: Sequence[str]) -> set[str]:
        if not urls:
            return set()
        if spark is not None and len(urls) >= spark_min_files and _spark_reachable(urls):
            slices = max(1, min(len(urls) // 1000 + 1, 4 * spark.sparkContext.defaultParallelism))
            found = spark.sparkContext.parallelize(list(urls), slices).mapPartitions(
                executor_delete()
            )
            return {u for u in found.collect() if u is not None}
        return delete_urls(urls, threads=threads)

    return delete


def _spark_reachable(urls: Sequence[str]) -> bool:
    try:
        for scheme in {u.split("://", 1)[0] for u in urls}:
            spark_url(f"{scheme}://x")
    except StatekeeperError:
        return False
    return True
