"""Statekeeper inside Airflow: the catalog API and pages, the health report, the operators.

Airflow puts its plugins folder on ``sys.path``, so DAGs import this package by name. It is a
thin layer over ``state_engine``; ``state_engine`` itself never imports Airflow.
"""
