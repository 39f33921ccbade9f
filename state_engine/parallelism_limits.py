"""Flink's bounds on max parallelism (``KeyGroupRangeAssignment``): the one place they are written.

A leaf module (no imports) so the catalog, the Flink metadata reader and the Airflow DAGs use the
same numbers without loading NumPy or pyarrow; :mod:`state_engine.keygroups` re-exports them.
"""

#: The smallest default max parallelism Flink picks (``computeDefaultMaxParallelism``).
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 128
#: The largest max parallelism (and so parallelism) Flink allows: ``1 << 15``.
UPPER_BOUND_MAX_PARALLELISM = 32768
