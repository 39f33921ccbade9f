"""The PySpark maintenance jobs: the only package that imports pyspark.

Each job is ``run(spark, catalog, **params) -> report`` (a recorded run:
:mod:`state_engine.jobs.spark_job`) and a command line (:mod:`state_engine.jobs.commands`):
``python -m state_engine.jobs NAME --param value`` or ``statectl maintain NAME``. What the jobs
share and need no Spark for is :mod:`state_engine.maintenance`.
"""
