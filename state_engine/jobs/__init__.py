"""The PySpark maintenance jobs: the only package that imports pyspark.

Each job is ``run(spark, catalog, **params) -> report`` (see :mod:`state_engine.jobs.run`) and a
command line: ``python -m state_engine.jobs NAME --param value`` or ``statectl maintain NAME``.
"""
