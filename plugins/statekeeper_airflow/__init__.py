"""Statekeeper inside Airflow: the catalog API and pages, the operators.

DAGs import this package by name: from the install (setup.py ships ``plugins/`` as top-level
packages) or from Airflow's plugins folder, which Airflow puts on ``sys.path``. It is a thin
layer over ``state_engine`` (the catalog health report and the maintenance plans live there);
``state_engine`` itself never imports Airflow.
"""
