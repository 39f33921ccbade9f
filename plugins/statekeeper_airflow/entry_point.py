"""The plugin as the ``airflow.plugins`` entry point names it (pyproject.toml), so that an Airflow
installed next to the statekeeper wheel finds it without a plugins folder.

Airflow loads its plugins folder first, then the entry points, and reports a second plugin of the
same name as an import error ("already registered, skipping"). Where the folder already loaded
``statekeeper_plugin.py`` (a checkout, the Docker image, compose's mount of ``plugins/``), the entry
point therefore yields no class, which Airflow passes over silently. Decided at each load, not at
import, because Airflow may load its plugins again with another folder in the same process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PLUGIN_MODULE = "statekeeper_plugin"


def loaded_from_plugins_folder(plugins_folder: str | None) -> bool:
    """Whether Airflow's plugins folder is where ``statekeeper_plugin`` was loaded from."""
    file = getattr(sys.modules.get(PLUGIN_MODULE), "__file__", None)
    if not plugins_folder or not file:
        return False
    return Path(file).resolve().parent == Path(plugins_folder).resolve()


def __getattr__(name: str) -> Any:
    if name != "StatekeeperPlugin":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from airflow import settings

    if loaded_from_plugins_folder(settings.PLUGINS_FOLDER):
        return None
    from statekeeper_plugin import StatekeeperPlugin

    return StatekeeperPlugin
