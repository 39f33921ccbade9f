"""Alembic environment of the Statekeeper catalog.

Run through :mod:`state_engine.catalog.migrate` (``statectl catalog upgrade``), which hands over an
open connection; the ``alembic`` command line works too, with ``sqlalchemy.url`` or
``STATEKEEPER_CATALOG_URL`` naming the database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from state_engine.catalog.engine import foreign_keys_unenforced, make_engine
from state_engine.catalog.migrate import VERSION_TABLE
from state_engine.catalog.models import Base
from state_engine.config import Settings

config = context.config


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=True,
        # One transaction for the whole run, also on SQLite (Alembic assumes it cannot roll back
        # DDL and commits after each revision; it can, and the engine begins its transactions
        # itself): a revision that refuses leaves the catalog at the revision it was at.
        transactional_ddl=True,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().catalog_url
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _migrate(conn: Connection) -> None:
    _configure(connection=conn)
    # Some revisions rebuild a table on SQLite (it cannot drop a constraint in place); with
    # foreign keys enforced, dropping the old table would delete the rows that reference it.
    # SQLite honours the pragma only outside a transaction; such a revision checks the keys.
    with foreign_keys_unenforced(conn), context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().catalog_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _migrate(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
