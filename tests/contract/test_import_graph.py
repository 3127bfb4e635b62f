"""No import cycle among zodbsql's modules.

The graph is read from the source with ``ast``: an edge for every ``import`` and
``from ... import`` of a zodbsql module, wherever it stands (in a function too, and
under ``if TYPE_CHECKING:``, so that even the types do not go round in a circle).  The
implicit import of a module's parent package is not an edge: a package's ``__init__``
re-exporting what its modules define is not a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import zodbsql

PACKAGE_DIR = Path(zodbsql.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The zodbsql modules ``path`` imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from zodbsql.storage import pack`` imports the module zodbsql.storage.pack
            # (and the package only as its parent); other names come from ``base``.
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return {target for target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_DIR.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph[node]):
            if target in on_path:
                return path[path.index(target):] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        on_path.discard(path.pop())
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "zodbsql.backends.base.contract" in graph["zodbsql.backends.base.locker"]
    assert "zodbsql.storage.commit" in graph["zodbsql.storage.storage"]
    assert "zodbsql.storage.pack" in graph["zodbsql.storage.storage"]   # from ... import pack


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
