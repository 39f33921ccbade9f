"""Apache Flink checkpoints and savepoints, read from the bytes Flink wrote.

Modules (import the one you need; this package imports nothing eagerly so that ``statectl`` and the
Airflow DAGs stay fast to start):

* ``metadata`` -- the ``_metadata`` reader (versions 3 to 6) and its typed records;
* ``javaser`` -- the small Java-serialization parser for ``CheckpointProperties``;
* ``import_job`` -- ``statectl flink import``: directory scan and catalog sync;
* ``retention`` -- expire and orphan cleanup on Flink directories.

The ``statectl flink`` command group is :mod:`state_engine.cli.flink`.

No module here imports Spark or Airflow.
"""
