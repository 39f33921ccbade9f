"""The install gives the full pyspark at the pinned version, and it runs a local session."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pinned(distribution: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # pyspark is pinned in the [spark] extra; the engine alone does not depend on it.
    extras = project.get("optional-dependencies", {}).values()
    for dep in [*project["dependencies"], *(d for deps in extras for d in deps)]:
        match = re.fullmatch(rf"{re.escape(distribution)}==([\w.]+)", dep)
        if match:
            return match.group(1)
    raise AssertionError(f"{distribution} is not pinned with == in pyproject.toml")


@pytest.mark.spark
def test_local_spark_session_runs_the_pinned_full_pyspark(spark) -> None:
    import pyspark

    assert pyspark.__version__ == pinned("pyspark")
    assert spark.version == pinned("pyspark")
    assert spark.sparkContext.master.startswith("local")
    # A Python UDF round trip proves the workers run (pyspark-client alone could not do this).
    rows = spark.range(10).rdd.map(lambda r: r.id * 2).sum()
    assert rows == 90


def test_required_top_level_folders_hold_something() -> None:
    for folder in ("dags", "plugins", "state_engine", "migrations", "tests"):
        path = ROOT / folder
        assert path.is_dir(), f"{folder}/ is missing"


def test_no_module_in_state_engine_shadows_the_standard_library() -> None:
    # `spark-submit .../state_engine/jobs/__main__.py` and `python path/to/module.py` put the
    # module's own folder first on sys.path, where a file named like a stdlib module shadows it.
    import sys

    package = ROOT / "state_engine"
    clashes = sorted(
        str(path.relative_to(ROOT))
        for path in package.rglob("*")
        if (path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()))
        and path.stem in sys.stdlib_module_names
    )
    assert clashes == [], f"rename these, they shadow the standard library: {clashes}"


def test_the_jobs_application_runs_as_a_script_as_spark_submit_runs_it() -> None:
    import subprocess
    import sys

    script = ROOT / "state_engine" / "jobs" / "__main__.py"
    done = subprocess.run(
        [sys.executable, str(script), "-h"], capture_output=True, text=True, cwd=ROOT / "tests"
    )
    assert done.returncode == 0, done.stderr
    for job in ("compaction", "savepoint", "ttl_cleanup", "rescale", "expire", "orphan_cleanup"):
        assert job in done.stdout
