"""Statekeeper's state layer: Flink-style keyed and operator state, checkpoints, catalog, jobs."""

__version__ = "0.1.0"
