"""Alembic's scripts of the catalog, shipped in the wheel as ``statekeeper_migrations``.

A regular package (not a namespace) so that the installed copy has one directory to hand to
Alembic; see ``state_engine.catalog.migrate``.
"""
