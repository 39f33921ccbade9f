"""``make demo``: the fraud-detection job end to end, run from a source checkout.

Not part of the wheel: the demo drives this checkout's ``dags/`` and ``plugins/`` through the
``airflow`` command line. :mod:`demo.story` tells the story, :mod:`demo.airflow_cli` runs Airflow.
"""
