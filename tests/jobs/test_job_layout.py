"""The maintenance jobs import shared infrastructure, never each other; the one committer
imports neither Spark nor the checkpoint manager (the manager, the jobs and restore import it)."""

from __future__ import annotations

import ast
from pathlib import Path

import state_engine

ROOT = Path(state_engine.__file__).parent
JOBS = {
    "compaction",
    "expire",
    "flink_rewrite",
    "orphan_cleanup",
    "rescale",
    "savepoint",
    "state_inspect",
    "ttl_cleanup",
}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_job_module_imports_another_job_module() -> None:
    for job in sorted(JOBS):
        imported = _imports(ROOT / "jobs" / f"{job}.py")
        sideways = sorted(
            m for m in imported if m.startswith("state_engine.jobs.") and m.split(".")[2] in JOBS
        )
        assert not sideways, f"jobs/{job}.py imports job modules {sideways}"


def test_the_committer_imports_neither_spark_nor_the_manager_and_they_import_it() -> None:
    imported = _imports(ROOT / "checkpoint" / "commit.py")
    assert not [m for m in imported if m.startswith(("pyspark", "state_engine.jobs"))]
    assert not [m for m in imported if m.startswith("state_engine.checkpoint.manager")]
    for user in ("checkpoint/manager.py", "checkpoint/restore.py", "maintenance/output.py"):
        assert any(m.startswith("state_engine.checkpoint.commit") for m in _imports(ROOT / user))
