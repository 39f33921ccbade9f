"""No import cycle anywhere in ``state_engine``: imports go one way.

The graph is built from the source with ``ast``: every ``import`` and ``from ... import``, also
those inside functions (a cycle hidden in a function is still a cycle in the design); only
``if TYPE_CHECKING:`` blocks are skipped, since they never run, and so is a package's lazy
re-export hook (a module-level ``__getattr__`` in an ``__init__.py``, PEP 562: it runs on attribute
access, after every import finished). Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and
``a.b``, so those packages count as imported too (except the importer's own packages, which are
already running when it is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "state_engine"


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


def _imports(tree: ast.Module, is_package: bool = False) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    lazy_hooks = {
        id(node)
        for node in tree.body
        if is_package and isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
    }

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if id(node) in lazy_hooks:
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for sub in ast.iter_child_nodes(node):
            visit(sub)

    visit(tree)
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
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)), is_package):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(module, is_package, node)
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    edges |= _with_packages(target, module, known)
        edges.discard(module)
        graph[module] = edges
    return graph


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


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking() -> None:
    source = """
from typing import TYPE_CHECKING
import a
if TYPE_CHECKING:
    import hidden
else:
    import b
def f():
    from c import x
def __getattr__(name):
    import lazy
"""
    names = {
        n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
        for n in _imports(ast.parse(source))
    }
    assert names == {"typing", "a", "b", "c", "lazy"}
    package = {
        n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
        for n in _imports(ast.parse(source), is_package=True)
    }
    assert package == {"typing", "a", "b", "c"}
    graph = import_graph()
    assert "state_engine.errors" in graph["state_engine.faults"]
    # a submodule import runs its package's __init__ too, but not the importer's own packages
    assert "state_engine.snapshot" in graph["state_engine.backends.heap.snapshot"]
    assert "state_engine.checkpoint" not in graph["state_engine.checkpoint.manager"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_state_engine() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
