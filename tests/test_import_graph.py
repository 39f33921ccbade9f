"""Imports in ``state_engine`` go one way: no cycle, and each package only uses those below it.

The graph is built from the source with ``ast``: every ``import`` and ``from ... import``, also
those inside functions (a cycle hidden in a function is still a cycle in the design); only
``if TYPE_CHECKING:`` blocks are skipped, since they never run. A lazy re-export counts as an
import of the module that defines the name: a module's ``_EXPORTS`` mapping (name -> module) and
what its PEP 562 ``__getattr__`` hook imports (it runs on attribute access, but it is the package's
dependency all the same). Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so
those packages count as imported too (except the importer's own packages, which are already
running when it is imported).

The package rule: :data:`ALLOWED` names, once, what each unit (a package of ``state_engine``, or
a top-level module) may import; every unit must have a line there, and the lines themselves must
form layers (no cycle among the rules).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "state_engine"

#: Used by every layer: the standard library only, or (config, faults) errors alone.
_LEAVES = {
    "checkpoint_dirs", "collector", "errors", "ids", "lazy", "names", "parallelism_limits",
    "snapshot_enums",
}  # fmt: skip
#: Keys, hashing, serializers and the state API: what every state-handling layer may use.
_FOUNDATION = _LEAVES | {"config", "faults", "formatting", "hashing", "keygroups", "serde", "state"}
#: The maintenance framework and what it builds on (no Spark, no runtime).
_BELOW_MAINTENANCE = _FOUNDATION | {"backends", "catalog", "checkpoint", "snapshot"}

#: What each unit may import.
ALLOWED: dict[str, set[str]] = {
    "state_engine": set(),  # the package's own __init__
    "collector": set(),
    "errors": set(),
    "lazy": set(),
    "checkpoint_dirs": set(),
    "parallelism_limits": set(),
    "snapshot_enums": set(),
    # the rules for names and ids from users
    "names": {"errors"},
    "ids": {"errors"},
    "config": {"errors"},
    "faults": {"errors"},
    "hashing": {"errors"},
    "serde": {"errors"},
    "formatting": {"snapshot_enums"},
    "keygroups": {"errors", "hashing", "parallelism_limits"},
    "state": {"errors", "serde"},
    # what a snapshot is on storage: below the backends and the checkpoint orchestration
    "snapshot": _FOUNDATION - {"config", "formatting"},
    # the only package that speaks SQL: nothing of the state layer
    "catalog": {"config", "errors", "ids", "names", "parallelism_limits", "snapshot_enums"},
    "health": _LEAVES | {"catalog", "config", "formatting"},
    # keyed and operator state backends: they write through snapshot/, never checkpoint/
    "backends": (_FOUNDATION - {"config", "formatting"}) | {"snapshot"},
    # taking, committing and restoring snapshots
    "checkpoint": _FOUNDATION | {"backends", "catalog", "snapshot"},
    "runtime": _FOUNDATION | {"backends", "catalog", "checkpoint", "snapshot"},
    # the maintenance framework (no pyspark): never jobs, flink, cli or runtime
    "maintenance": _BELOW_MAINTENANCE,
    # Apache Flink's formats, import, retention and savepoint writing: never jobs
    "flink": _BELOW_MAINTENANCE | {"maintenance"},
    # the Spark jobs and what runs in their tasks (the Flink ones too)
    "jobs": _BELOW_MAINTENANCE | {"maintenance", "flink"},
    "examples": _FOUNDATION | {"runtime"},
    "verify": _BELOW_MAINTENANCE | {"flink"},
    # statectl: the top
    "cli": _BELOW_MAINTENANCE | {"flink", "jobs", "maintenance", "verify"},
}

#: Edges the rule forbids that other branches of issue 34 remove, with what removes them. Once
#: an edge is gone its line must go too (a test fails until it is).
PENDING: dict[tuple[str, str], str] = {}


def module_names() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    visit(tree)
    return found


def _strings(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def _lazy_imports(tree: ast.Module) -> list[str]:
    """The modules a lazy re-export loads by name: the values of a module-level ``_EXPORTS``
    mapping, and the string arguments of ``import_module`` calls in ``__getattr__``."""
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets)
            if named and isinstance(node.value, ast.Dict):
                found += [s for v in node.value.values if v is not None for s in _strings(v)]
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name | ast.Attribute)
                    and (getattr(call.func, "id", None) or getattr(call.func, "attr", None))
                    == "import_module"
                ):
                    found += [s for a in call.args for s in _strings(a)]
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _with_packages(target: str, importer: str, known: dict[str, Path]) -> set[str]:
    """``target`` and the packages whose ``__init__`` importing it runs."""
    parts = target.split(".")
    out = set()
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in known and not (importer == name or importer.startswith(name + ".")):
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    known = module_names()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        targets: list[str] = _lazy_imports(tree)
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            else:
                base = _absolute(module, is_package, node)
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets += [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
        edges: set[str] = set()
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                edges |= _with_packages(target, module, known)
        edges.discard(module)
        graph[module] = edges
    return graph


def unit_of(module: str) -> str:
    """The unit a module belongs to: its package of ``state_engine``, or itself at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def unit_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Per (unit, unit it imports): the module edges behind it, as ``a -> b``."""
    out: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            pair = (unit_of(module), unit_of(target))
            if pair[0] != pair[1]:
                out.setdefault(pair, []).append(f"{module} -> {target}")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt, BLACK) == GREY:
                return [*stack[stack.index(nxt) :], nxt]
            if colour.get(nxt) == WHITE:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_imports_in_functions_and_lazy_exports_and_skips_type_checking() -> None:
    source = """
import importlib
from typing import TYPE_CHECKING
import a
if TYPE_CHECKING:
    import hidden
else:
    import b
def f():
    from c import x
_EXPORTS = {"Name": "exported.module", "Other": "exported.other"}
def __getattr__(name):
    import lazy
    return importlib.import_module("loaded.by.name")
"""
    tree = ast.parse(source)
    names = {n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in _imports(tree)}
    assert names == {"importlib", "typing", "a", "b", "c", "lazy"}
    assert _lazy_imports(tree) == ["exported.module", "exported.other", "loaded.by.name"]
    graph = import_graph()
    assert "state_engine.errors" in graph["state_engine.faults"]
    # a submodule import runs its package's __init__ too, but not the importer's own packages
    assert "state_engine.snapshot" in graph["state_engine.backends.heap.snapshot"]
    assert "state_engine.checkpoint" not in graph["state_engine.checkpoint.manager"]
    # the checkpoint package re-exports the backend factories lazily: that is an import
    assert "state_engine.backends.heap" in graph["state_engine.checkpoint"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert unit_edges({"state_engine.a.x": {"state_engine.a.y", "state_engine.b"}}) == {
        ("a", "b"): ["state_engine.a.x -> state_engine.b"]
    }


def test_no_import_cycle_in_state_engine() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_rules_name_every_unit_and_form_layers() -> None:
    units = {unit_of(m) for m in module_names()}
    assert units - set(ALLOWED) == set(), "give each new package its line in ALLOWED"
    named = {u for allowed in ALLOWED.values() for u in allowed}
    assert named - set(ALLOWED) == set(), "ALLOWED names a unit it has no line for"
    cycle = find_cycle({unit: set(allowed) for unit, allowed in ALLOWED.items()})
    assert cycle is None, "the rules allow a cycle: " + " -> ".join(cycle or [])


def test_each_package_imports_only_what_its_rule_allows() -> None:
    edges = unit_edges(import_graph())
    broken = [
        f"{unit} may not import {target}: " + "; ".join(sorted(via)[:3])
        for (unit, target), via in sorted(edges.items())
        if target not in ALLOWED.get(unit, set()) and (unit, target) not in PENDING
    ]
    assert broken == [], "\n".join(broken)


def test_every_pending_exception_is_still_needed() -> None:
    edges = unit_edges(import_graph())
    gone = [f"{unit} -> {target}" for unit, target in PENDING if (unit, target) not in edges]
    assert gone == [], f"no longer imported, delete from PENDING: {gone}"
    allowed_anyway = [pair for pair in PENDING if pair[1] in ALLOWED[pair[0]]]
    assert allowed_anyway == []
