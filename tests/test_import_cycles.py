"""No import cycle among fiberlite's modules, counting the imports inside functions
(``docs/architecture.md`` promises it)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "fiberlite")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def _imported(module: str, path: str, node: ast.AST, modules: dict[str, str]) -> list[str]:
    """The fiberlite modules an import statement names (a name imported from a package
    that is a module of it counts as that module)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            parts = module.split(".")
            if not path.endswith("__init__.py"):
                parts = parts[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                   for alias in node.names]
    found = []
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.append(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        with open(path) as source:
            tree = ast.parse(source.read())
        graph[module] = {target for node in ast.walk(tree)
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _imported(module, path, node, modules)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    assert "fiberlite.managers.stream" in graph["fiberlite.managers.calls"]  # it reads them all
    assert _cycles(graph) == []
