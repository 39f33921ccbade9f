"""Settings, read once from ``STATEKEEPER_*`` environment variables.

The embedded defaults live under ``STATEKEEPER_HOME`` (default ``./.statekeeper``): a SQLite
catalog, local checkpoint storage and Spark in ``local[*]`` mode. Production points
``STATEKEEPER_CATALOG_URL`` at PostgreSQL and ``STATEKEEPER_CHECKPOINT_ROOT`` at any fsspec URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from state_engine.errors import ConfigurationError


@dataclass(frozen=True)
class Settings:
    home: Path
    catalog_url: str
    checkpoint_root: str
    spark_master: str
    # savepoint directories outside the job's checkpoint root that jobs may write to (URLs)
    allowed_savepoint_dirs: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        raw_home = env.get("STATEKEEPER_HOME", "").strip() or ".statekeeper"
        home = Path(raw_home).expanduser().resolve()
        catalog_url = env.get("STATEKEEPER_CATALOG_URL", "").strip() or (
            f"sqlite:///{home / 'catalog.db'}"
        )
        checkpoint_root = env.get("STATEKEEPER_CHECKPOINT_ROOT", "").strip() or (
            (home / "checkpoints").as_uri()
        )
        spark_master = env.get("STATEKEEPER_SPARK_MASTER", "").strip() or "local[*]"
        if "://" not in catalog_url:
            raise ConfigurationError(
                f"STATEKEEPER_CATALOG_URL={catalog_url!r} is not a database URL; use e.g. "
                "'postgresql+psycopg://user@host:5432/db' or 'sqlite:////abs/path/catalog.db'"
            )
        allowed = env.get("STATEKEEPER_ALLOWED_SAVEPOINT_DIRS", "")
        return cls(
            home=home,
            catalog_url=catalog_url,
            checkpoint_root=checkpoint_root,
            spark_master=spark_master,
            allowed_savepoint_dirs=tuple(d.strip() for d in allowed.split(",") if d.strip()),
        )
