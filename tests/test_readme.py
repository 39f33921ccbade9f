"""The README's code runs as shown: its Python example prints the output the README shows, and the
``statectl`` commands of its tour answer on the catalog that example leaves. What the Python
examples of docs/ import resolves.

Each runs in a subprocess, as a reader would run it, with this checkout first on the path and a
fresh ``STATEKEEPER_HOME``. ``statectl maintain`` lines start Spark and are left to tests/jobs.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def python_examples() -> list[tuple[str, str | None]]:
    """Each Python block, with the plain block right after it (its output) if there is one."""
    found = blocks()
    return [
        (code, found[i + 1][1] if i + 1 < len(found) and found[i + 1][0] == "" else None)
        for i, (lang, code) in enumerate(found)
        if lang == "python"
    ]


def doc_imports() -> list[str]:
    """Every import statement of the Python examples in the README and docs/."""
    found = []
    for doc in (README, *sorted((ROOT / "docs").rglob("*.md"))):
        for m in FENCE.finditer(doc.read_text()):
            if m.group(1) == "python":
                tree = ast.parse(m.group(2))
                found += [
                    ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)
                ]
    return found


def tour_commands() -> list[list[str]]:
    """The ``statectl`` lines of the tour's block that follows the first Python example."""
    found = blocks()
    first = next(i for i, (lang, _) in enumerate(found) if lang == "python")
    block = next(code for lang, code in found[first + 2 :] if "statectl jobs" in code)
    commands = []
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[0] == "statectl" and argv[1] != "maintain":
            commands.append(argv)
    return commands


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEKEEPER_")}
    env.update(STATEKEEPER_HOME=str(home), PYTHONPATH=str(ROOT))
    return env


@pytest.fixture(scope="module")
def example_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first example run once: its output checked, its catalog kept for the tour."""
    home = tmp_path_factory.mktemp("readme") / "home"
    code, shown = python_examples()[0]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=home.parent,
        env=_env(home),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert shown is not None, "the README shows no output after its first Python example"
    assert done.stdout == shown
    return home


def test_the_readme_has_a_python_example_with_its_output() -> None:
    examples = python_examples()
    assert examples and all(shown is not None for _, shown in examples)
    imports = "\n".join(code for code, _ in examples)
    for module in ("checkpoint", "runtime", "catalog", "state", "serde"):
        assert f"from state_engine.{module} import" in imports, module


def test_every_import_of_the_documented_examples_resolves() -> None:
    """The docs' examples that need a real Flink snapshot are not run, but what they import
    must still be there: public import paths keep working when modules move."""
    statements = doc_imports()
    assert any("state_engine.checkpoint" in st for st in statements)
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(statements)],
        env=_env(ROOT / ".statekeeper"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_python_example_prints_what_the_readme_shows(example_home: Path) -> None:
    assert (example_home / "catalog.db").is_file()


@pytest.mark.parametrize("argv", tour_commands(), ids=lambda argv: " ".join(argv[1:3]))
def test_each_statectl_command_of_the_tour_answers(example_home: Path, argv: list[str]) -> None:
    statectl = Path(sys.executable).with_name("statectl")
    done = subprocess.run(
        [str(statectl), *argv[1:]],
        cwd=example_home.parent,
        env=_env(example_home),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and not done.stderr.strip(), (done.stdout, done.stderr)
