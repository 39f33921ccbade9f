"""Nothing bypasses CheckpointStorage, and importing it stays light.

(a) No module of ``state_engine/``, ``plugins/`` or ``dags/`` other than
``state_engine/snapshot/storage.py`` imports fsspec, reaches a file system's ``.fs`` or
``_strip_protocol``, or uses a private (``_``-prefixed) name of the storage module.
(b) A fresh interpreter importing ``state_engine.snapshot.storage`` (every Spark executor does)
loads no SQLAlchemy, no catalog and no state backend; neither does one running the function the
deleting jobs ship to Spark executors.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from state_engine.snapshot import storage as storage_module

REPO = Path(__file__).resolve().parents[2]
STORAGE_MODULE = "state_engine.snapshot.storage"
OWNER = REPO / "state_engine" / "snapshot" / "storage.py"
HEAVY = ("sqlalchemy", "state_engine.catalog", "state_engine.backends", "pyspark", "rocksdict")


def bypasses(source: str, where: str = "<source>") -> list[str]:
    """Every way ``source`` reaches around the storage module, as ``where:line: what``."""
    tree = ast.parse(source)
    storage_aliases: set[str] = set()
    found: list[tuple[int, str]] = []

    def flag(node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        found.append((line, f"{where}:{line}: {what}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "fsspec" or alias.name.startswith("fsspec."):
                    flag(node, f"imports {alias.name}")
                if alias.name == STORAGE_MODULE:
                    storage_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module == "fsspec" or module.startswith("fsspec."):
                flag(node, f"imports from {module}")
            if module == STORAGE_MODULE:
                for alias in node.names:
                    if alias.name.startswith("_"):
                        flag(node, f"imports private {alias.name} from the storage module")
            if module == "state_engine.snapshot":
                for alias in node.names:
                    if alias.name == "storage":
                        storage_aliases.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr == "fs":
            flag(node, "reaches a file system through .fs")
        elif node.attr == "_strip_protocol":
            flag(node, "calls _strip_protocol")
        elif node.attr.startswith("_") and not node.attr.startswith("__"):
            target = ast.unparse(node.value)
            if target in storage_aliases:
                flag(node, f"uses private {target}.{node.attr}")
    return [hit for _, hit in sorted(found)]


def _sources() -> list[Path]:
    paths = [p for d in ("state_engine", "plugins", "dags") for p in (REPO / d).rglob("*.py")]
    return sorted(p for p in paths if p != OWNER)


def test_the_checker_sees_each_kind_of_bypass() -> None:
    planted = "\n".join(
        [
            "import fsspec",
            "import fsspec.core as fc",
            "from fsspec import AbstractFileSystem",
            "from state_engine.snapshot.storage import _modified, FileStore",
            "from state_engine.snapshot import storage as st",
            "import state_engine.snapshot.storage as st2",
            "snap.fs.rm_file(p)",
            "x = fs._strip_protocol(u)",
            "st._protocol(fs)",
            "st2._CHUNK",
            "snap.store.delete(p)",  # the API: fine
        ]
    )
    found = bypasses(planted)
    assert [f.split(": ", 1)[1] for f in found] == [
        "imports fsspec",
        "imports fsspec.core",
        "imports from fsspec",
        "imports private _modified from the storage module",
        "reaches a file system through .fs",
        "calls _strip_protocol",
        "uses private st._protocol",
        "uses private st2._CHUNK",
    ]


def test_no_module_reaches_around_checkpoint_storage() -> None:
    sources = _sources()
    assert len(sources) > 50  # the walk found the code
    found = [
        hit for path in sources for hit in bypasses(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "use CheckpointStorage / SnapshotDir / FileStore instead:\n" + "\n".join(
        found
    )


def _fresh_modules(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]


def test_importing_storage_loads_no_catalog_backend_or_sqlalchemy() -> None:
    modules = _fresh_modules("import state_engine.snapshot.storage")
    assert STORAGE_MODULE in modules
    assert _heavy(modules) == []
    siblings = ("state_engine.checkpoint.", "state_engine.snapshot.")
    loaded = [m for m in modules if m != STORAGE_MODULE]
    assert "state_engine.checkpoint" not in loaded
    assert not any(m.startswith(siblings) for m in loaded)


def test_the_checkpoint_package_imports_nothing_heavy_and_still_exports_its_names() -> None:
    modules = _fresh_modules("import state_engine.checkpoint")
    assert _heavy(modules) == []
    import state_engine.checkpoint as package

    for name in package.__all__:
        assert getattr(package, name) is not None
    with pytest.raises(AttributeError):
        package.NoSuchName  # noqa: B018


def test_spark_executors_deleting_files_import_storage_only(tmp_path: Path) -> None:
    from state_engine.jobs.spark_delete import executor_delete

    doomed = tmp_path / "doomed.bin"
    doomed.write_bytes(b"x")
    payload = tmp_path / "task.pickle"
    payload.write_bytes(pickle.dumps(executor_delete()))
    code = (
        "import pickle, pathlib\n"
        f"task = pickle.loads(pathlib.Path({str(payload)!r}).read_bytes())\n"
        f"assert task([{doomed.as_uri()!r}, {doomed.as_uri()!r}]) == [{doomed.as_uri()!r}, None]"
    )
    modules = _fresh_modules(code)
    assert not doomed.exists()
    assert STORAGE_MODULE in modules
    assert _heavy(modules) == []
    assert "state_engine.jobs.spark_delete" not in modules


def test_storage_module_is_the_one_that_imports_fsspec() -> None:
    assert bypasses(OWNER.read_text()) != []  # the checker would see it: it lives here only
    assert storage_module.FileStore.__module__ == STORAGE_MODULE


def test_spark_tasks_writing_and_reading_snapshots_load_no_catalog_or_keyed_backend() -> None:
    modules = _fresh_modules(
        "import state_engine.jobs.canonical_write, state_engine.jobs.snapshot_read"
    )
    banned = ("sqlalchemy", "state_engine.catalog", "rocksdict", "pyspark")
    backends = ("state_engine.backends.heap", "state_engine.backends.rocksdb")
    assert [m for m in modules if m.startswith(banned + backends)] == []
