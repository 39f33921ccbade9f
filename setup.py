"""Which packages the wheel holds; every other setting is in pyproject.toml.

pyproject.toml alone cannot both discover packages and ship a folder under another name, and
``migrations/`` and ``plugins/`` stay at the top level, where Alembic and Airflow users look:

* ``state_engine/`` is discovered, so a new subpackage ships without touching this file;
* ``plugins/statekeeper_airflow/`` and ``plugins/statekeeper_plugin.py`` ship as the top-level
  ``statekeeper_airflow`` and ``statekeeper_plugin``, the names an Airflow plugins folder gives them
  (DAGs import ``statekeeper_airflow`` either way);
* ``migrations/`` ships as ``statekeeper_migrations`` (a bare ``migrations`` would collide with
  other projects' in site-packages); ``state_engine.catalog.migrate`` finds Alembic's scripts there.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["state_engine", "state_engine.*"]),
        *find_namespace_packages("plugins", include=["statekeeper_airflow*"]),
        "statekeeper_migrations",
        "statekeeper_migrations.versions",
    ],
    py_modules=["statekeeper_plugin"],
    package_dir={
        "": "plugins",
        "state_engine": "state_engine",
        "statekeeper_migrations": "migrations",
    },
    # Not next to the modules in plugins/: Airflow puts its plugins folder on sys.path, where a
    # second copy of this distribution's metadata would register the plugin's entry point twice.
    options={"egg_info": {"egg_base": "."}},
)
