"""The wheel, installed as a user installs it: built from the sources, into a fresh venv, no `-e`.

One venv, in two steps (about a minute on a loaded 2-core machine, most of it Airflow's import):
the engine alone (no extras) migrates a SQLite catalog with ``statectl`` and imports no Spark or
Airflow; then ``[airflow]`` on top, where Airflow's own plugins manager finds the plugin through
the ``airflow.plugins`` entry point with an empty plugins folder, and, with the checkout's
``plugins/`` as its folder, loads it from there once without an "already registered" error.
Packages come from uv's cache (what ``make install`` fetched), at the versions this venv tested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from; anything else the build needed would fail it here first.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "state_engine", "plugins", "migrations")
ENGINE_ONLY_ABSENT = ("pyspark", "airflow", "pandas", "psycopg", "s3fs")
#: a module finding files from its own location above its package: a wheel has no checkout there
CLIMBS = re.compile(r"__file__.*(\.parents\[|\.parent\.parent)")
#: the one module allowed to: it looks beside the package first (a checkout runs its own
#: revisions), then in the statekeeper_migrations the wheel ships
MAY_CLIMB = {"state_engine/catalog/migrate.py"}


def checkout_paths(wheel: zipfile.ZipFile) -> list[str]:
    """What in ``wheel`` needs a source checkout: the demo (it drives the checkout's ``dags/``
    and ``plugins/``) or a module that climbs from its own file to a folder of the checkout."""
    out = []
    for name in wheel.namelist():
        demo = name.split("/")[0] == "demo" or name.startswith("state_engine/demo")
        text = wheel.read(name).decode("utf-8", errors="replace")
        climbs = name.endswith(".py") and name not in MAY_CLIMB and bool(CLIMBS.search(text))
        if demo or climbs:
            out.append(name)
    return sorted(out)


def test_a_wheel_with_the_demo_or_a_checkout_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "statekeeper-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("state_engine/keygroups.py", "import numpy\n")
        wheel.writestr("state_engine/catalog/migrate.py", "Path(x.__file__).parent.parent\n")
        # the demo's Airflow driver as it was, in state_engine/: the DAGs at parents[1]/"dags"
        wheel.writestr("state_engine/tour.py", "REPO = Path(__file__).resolve().parents[1]\n")
        wheel.writestr("demo/__main__.py", "from demo.story import main\n")
    with zipfile.ZipFile(path) as wheel:
        assert checkout_paths(wheel) == ["demo/__main__.py", "state_engine/tour.py"]
    # and the checkout's own sources of the wheel's modules have none
    with zipfile.ZipFile(tmp_path / "sources.zip", "w") as sources:
        for folder in ("state_engine", "plugins", "migrations"):
            for module in (ROOT / folder).rglob("*.py"):
                sources.write(module, module.relative_to(ROOT).as_posix())
    with zipfile.ZipFile(tmp_path / "sources.zip") as sources:
        assert checkout_paths(sources) == []


# Run inside the fresh venv: Airflow's plugins manager, first with an empty plugins folder (the
# entry point is the only way in), then again with the checkout's plugins/ as the folder.
PLUGIN_PROBE = """
import json, sys
from airflow import plugins_manager, settings

def load(folder):
    settings.PLUGINS_FOLDER = folder
    plugins_manager._get_plugins.cache_clear()
    plugins, errors = plugins_manager._get_plugins()
    return {
        "plugins": [
            {"name": p.name, "source": str(p.source),
             "url_prefixes": [a["url_prefix"] for a in p.fastapi_apps]}
            for p in plugins
        ],
        "errors": errors,
        "module": sys.modules["statekeeper_plugin"].__file__,
    }

print(json.dumps({"entry_point": load(sys.argv[1]), "folder": load(sys.argv[2])}))
"""


def _uv() -> str:
    uv = Path(sys.executable).with_name("uv")
    found = str(uv) if uv.is_file() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is missing from this venv; `make install` puts it there")
    return found


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment without its venv, catalog or Airflow settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STATEKEEPER_", "AIRFLOW", "PYTHON", "VIRTUAL_ENV", "PYSPARK"))
    }
    env["STATEKEEPER_CATALOG_URL"] = f"sqlite:///{tmp_path / 'catalog' / 'catalog.db'}"
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _constraints(tmp_path: Path, env: dict[str, str]) -> Path:
    """This venv's versions, so the fresh venv gets what the suite tested (and uv's cache has)."""
    frozen = _run([_uv(), "pip", "freeze", "--python", sys.executable], env, tmp_path)
    pins = [line for line in frozen.splitlines() if "==" in line and "statekeeper" not in line]
    path = tmp_path / "constraints.txt"
    path.write_text("\n".join(pins) + "\n")
    return path


@pytest.mark.slow
def test_the_wheel_installs_the_engine_alone_then_the_airflow_plugin(tmp_path: Path) -> None:
    from state_engine.catalog.migrate import VERSION_TABLE, head_revision

    env = _clean_env(tmp_path)
    uv = _uv()

    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    _run([uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist")], env, source)
    [wheel] = (tmp_path / "dist").glob("statekeeper-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(
            archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")
        )
        assert checkout_paths(archive) == [], f"{wheel.name} needs a source checkout"
    for shipped in (
        "statekeeper_migrations/env.py",
        "statekeeper_migrations/script.py.mako",
        f"statekeeper_migrations/versions/{head_revision()}_",
        "statekeeper_airflow/operators.py",
        "statekeeper_airflow/entry_point.py",
        "statekeeper_plugin.py",
        "state_engine/snapshot/storage.py",
    ):
        assert any(n.startswith(shipped) for n in names), f"{shipped} is not in {wheel.name}"
    assert "[airflow.plugins]" in entry_points
    assert "statekeeper = statekeeper_airflow.entry_point:StatekeeperPlugin" in entry_points

    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env, tmp_path)
    constraints = _constraints(tmp_path, env)
    install = [uv, "pip", "install", "--quiet", "--python", python, "-c", str(constraints)]

    # 1. No extras: the state engine and statectl, nothing of Spark, Airflow, S3 or PostgreSQL.
    _run([*install, str(wheel)], env, tmp_path)
    probe = (
        "import importlib.util, json, state_engine.snapshot.storage, state_engine;"
        f"print(json.dumps([state_engine.__file__, [n for n in {ENGINE_ONLY_ABSENT!r}"
        " if importlib.util.find_spec(n)]]))"
    )
    engine_file, present = json.loads(_run([python, "-c", probe], env, tmp_path))
    assert Path(engine_file).is_relative_to(venv), "the checkout, not the wheel, was imported"
    assert present == [], f"installed without extras, yet {present} are importable"

    statectl = str(venv / "bin" / "statectl")
    out = _run([statectl, "catalog", "upgrade"], env, tmp_path)
    assert f"upgraded from empty to {head_revision()}" in out
    with sqlite3.connect(tmp_path / "catalog" / "catalog.db") as db:
        [(revision,)] = db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    assert revision == head_revision()
    assert "at head" in _run([statectl, "catalog", "current"], env, tmp_path)
    # What an extra brings, asked of the engine alone: one line naming the extra, no traceback.
    for argv, extra_env, extra in (
        ([statectl, "maintain", "expire", "--job", "j"], {}, "spark"),
        (
            [statectl, "catalog", "upgrade"],
            {"STATEKEEPER_CATALOG_URL": "postgresql://nobody@127.0.0.1:5432/none"},
            "postgres",
        ),
    ):
        done = subprocess.run(
            argv, env={**env, **extra_env}, cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"pip install 'statekeeper[{extra}]'" in done.stderr

    # 2. [airflow]: the plugin through the entry point, and no duplicate beside a plugins folder.
    _run([*install, f"{wheel}[airflow]"], env, tmp_path)
    empty_folder = tmp_path / "airflow" / "plugins"
    empty_folder.mkdir(parents=True)
    argv = [python, "-c", PLUGIN_PROBE, str(empty_folder), str(ROOT / "plugins")]
    result = json.loads(_run(argv, env, tmp_path).splitlines()[-1])

    by_entry_point = result["entry_point"]
    assert by_entry_point["errors"] == {}
    [plugin] = [p for p in by_entry_point["plugins"] if p["name"] == "statekeeper"]
    assert plugin["source"].startswith("statekeeper==0.1.0: EntryPoint(name='statekeeper'")
    assert plugin["url_prefixes"] == ["/statekeeper"]
    assert Path(by_entry_point["module"]).is_relative_to(venv)

    by_folder = result["folder"]
    assert by_folder["errors"] == {}, "the entry point registered the plugin a second time"
    [plugin] = [p for p in by_folder["plugins"] if p["name"] == "statekeeper"]
    assert plugin["source"] == "$PLUGINS_FOLDER/statekeeper_plugin.py"
    assert Path(by_folder["module"]) == ROOT / "plugins" / "statekeeper_plugin.py"
