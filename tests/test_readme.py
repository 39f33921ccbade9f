"""The README's code runs as shown: its Python example prints the output the README shows, and the
``statectl`` commands of its tour answer on the catalog that example leaves. What the Python
examples of docs/ import resolves.

They run in subprocesses with this checkout first on the path and a fresh ``STATEKEEPER_HOME``;
``statectl maintain`` lines start Spark and are left to tests/jobs.
"""

from __future__ import annotations

import ast
import json
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


TOUR_DRIVER = """
import contextlib, io, json, sys
from importlib import import_module

module, name = sys.argv[1].split(":")
main = getattr(import_module(module), name)
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv[1:])
        except SystemExit as exc:
            code = exc.code
    results.append([argv[1:], code or 0, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


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


def _anchors(doc: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub spells them."""
    titles = re.findall(r"^#+\s+(.*)$", doc.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", t.strip().lower()).replace(" ", "-") for t in titles}


def test_every_relative_link_of_the_docs_reaches_a_file_and_heading() -> None:
    docs = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for doc in docs:
        prose = FENCE.sub("", doc.read_text())
        for link in re.findall(r"\]\(([^)\s]+)\)", prose):
            if "://" in link:
                continue
            path, _, anchor = link.partition("#")
            target = (doc.parent / path).resolve() if path else doc
            if not target.is_file() or (anchor and anchor not in _anchors(target)):
                broken.append(f"{doc.relative_to(ROOT)}: {link}")
    assert broken == []


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


@pytest.fixture(scope="module")
def tour(example_home: Path) -> dict[str, tuple[int, str, str]]:
    """Every tour command's (exit code, stdout, stderr), run through statectl's entry point in one
    process (a process per command would start Python, SQLAlchemy and pyarrow seven times)."""
    [entry] = [
        line.split("=", 1)[1].strip().strip('"')
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.startswith("statectl =")
    ]
    done = subprocess.run(
        [sys.executable, "-c", TOUR_DRIVER, entry, json.dumps(tour_commands())],
        cwd=example_home.parent,
        env=_env(example_home),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {" ".join(argv): (code, out, err) for argv, code, out, err in json.loads(done.stdout)}


@pytest.mark.parametrize("argv", tour_commands(), ids=lambda argv: " ".join(argv[1:3]))
def test_each_statectl_command_of_the_tour_answers(
    tour: dict[str, tuple[int, str, str]], argv: list[str]
) -> None:
    code, out, err = tour[" ".join(argv[1:])]
    assert code == 0, err
    assert out.strip() and not err.strip(), (out, err)
