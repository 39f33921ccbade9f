"""Schema migrations: upgrade, downgrade, and the guard that refuses a catalog not at head."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

import state_engine
from state_engine.catalog.engine import (
    BEGIN_MODE,
    display_url,
    make_engine,
    one_line,
    parse_url,
    sqlite_path,
)
from state_engine.errors import CatalogUnreachable, CatalogVersionMismatch

# Its own version table, so the catalog can live in the same database as Airflow's metadata.
VERSION_TABLE = "statekeeper_alembic_version"


def _migrations_dir() -> Path:
    """Alembic's scripts for the code that is running: ``migrations/`` next to the imported
    ``state_engine/`` (a checkout, installed editable or only on sys.path: an older tree run
    beside this one gets its own revisions), else the package ``statekeeper_migrations`` (the
    ``migrations/`` a wheel ships)."""
    beside = Path(state_engine.__file__).resolve().parent.parent / "migrations"
    if (beside / "env.py").is_file():
        return beside
    spec = importlib.util.find_spec("statekeeper_migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return beside


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at ``migrations/``, whatever the current directory is."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        # Alembic would say "use the 'init' command", the wrong fix for a broken install.
        raise CatalogVersionMismatch(
            f"the catalog's migration scripts are missing from {MIGRATIONS_DIR}; "
            "reinstall statekeeper"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise CatalogVersionMismatch(
            f"no migrations found in {MIGRATIONS_DIR}; reinstall statekeeper"
        )
    return head


def known_revisions() -> set[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return {rev.revision for rev in script.walk_revisions()}


@contextmanager
def _connect(url: str | URL | Engine, *, write: bool) -> Iterator[Connection]:
    engine = url if isinstance(url, Engine) else make_engine(url)
    try:
        bind = engine.execution_options(**{BEGIN_MODE: "IMMEDIATE"}) if write else engine
        try:
            conn = bind.connect()
        except DBAPIError as exc:
            raise CatalogUnreachable(
                f"cannot connect to the catalog at {display_url(engine.url)}: "
                f"{one_line(exc.orig)}; check the URL and that the database is running"
            ) from exc
        with conn:
            yield conn
    finally:
        if not isinstance(url, Engine):
            engine.dispose()


def current_revision(url: str | URL | Engine) -> str | None:
    """The revision the catalog database is at (None: never migrated)."""
    path = sqlite_path(url.url if isinstance(url, Engine) else parse_url(url))
    if path is not None and not path.exists():
        return None  # and asking leaves no empty database file behind
    with _connect(url, write=False) as conn:
        revision = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()
        conn.rollback()
        return revision


def upgrade(url: str | URL | Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the catalog to ``revision``; returns (revision before, revision after)."""
    if not isinstance(url, Engine):
        path = sqlite_path(parse_url(url))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    before = current_revision(url)
    if before is not None and before not in known_revisions():
        raise _ahead(url, before)
    with _connect(url, write=True) as conn:
        command.upgrade(alembic_config(conn), revision)
        conn.commit()
    return before, current_revision(url)


def downgrade(url: str | URL | Engine, revision: str = "base") -> None:
    """Migrate the catalog down to ``revision`` (``base`` drops every catalog table)."""
    with _connect(url, write=True) as conn:
        command.downgrade(alembic_config(conn), revision)
        conn.commit()


def check_at_head(url: str | URL | Engine) -> str:
    """Raise CatalogVersionMismatch unless the catalog is exactly at this code's head revision."""
    current = current_revision(url)
    head = head_revision()
    if current == head:
        return head
    where = display_url(url.url if isinstance(url, Engine) else url)
    if current is None:
        raise CatalogVersionMismatch(
            f"the catalog at {where} has no schema yet (this code expects revision {head}); "
            "run `statectl catalog upgrade`"
        )
    if current in known_revisions():
        raise CatalogVersionMismatch(
            f"the catalog at {where} is at revision {current}, behind this code's {head}; "
            "run `statectl catalog upgrade`"
        )
    raise _ahead(url, current)


def _ahead(url: str | URL | Engine, current: str) -> CatalogVersionMismatch:
    where = display_url(url.url if isinstance(url, Engine) else url)
    return CatalogVersionMismatch(
        f"the catalog at {where} is at revision {current}, which this statectl does not know "
        f"(its newest is {head_revision()}): this statectl is older than the catalog; "
        "upgrade statekeeper"
    )
