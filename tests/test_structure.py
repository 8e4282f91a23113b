"""The shape of the code, read with ``ast`` from ``fiberlite/``: no import cycle (imports
inside functions count), imports that point down (the low modules and the wire import
nothing above them; a backend only ``backends/base``, its own subpackage and what is
below), no module over 500 lines (the C files of its extension too), and no socket
opened outside the wire (``fiberlite/wire/``; the stdlib-API ``Listener``/``Client`` of
``fiberlite/connection/`` are the exception).

What is wrong today is listed in ALLOWED_* below, each entry to be removed by the change
that fixes it: an entry that no longer applies fails the test, so the lists only shrink.
"""
from __future__ import annotations

import ast
import os
from typing import Iterator

from paths import ROOT

PACKAGE = "fiberlite"
MAX_LINES = 500
LOW = {"fiberlite.errors", "fiberlite.units", "fiberlite.config", "fiberlite.plugins"}  # used by every layer

# -- known offenders: remove an entry with the change that fixes it ----------------------------
ALLOWED_LONG: set[str] = set()
ALLOWED_CYCLES: list[set[str]] = []
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def modules() -> dict[str, str]:
    """Every module of the package: dotted name -> path."""
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:`` (never executed)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(n for body in node.body for n in ast.walk(body))
    return skipped


def imports_of(name: str, path: str, known: dict[str, str]) -> Iterator[str]:
    """The modules of the package that module ``name`` imports, anywhere in it."""
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from . import hub`` imports the module hub; ``from .hub import X``, hub
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports_of(name, path, known)) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(group)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def allowed_targets(name: str) -> set[str] | None:
    """What ``name`` may import, if a rule limits it: the low modules only the low ones;
    the wire only itself and them; a backend its own subpackage, ``backends`` and
    ``backends.base``, the wire and the low modules."""
    if name in LOW:
        return set(LOW)
    if name.startswith("fiberlite.wire"):
        return {"fiberlite.wire*"} | LOW
    parts = name.split(".")
    if len(parts) >= 3 and parts[1] == "backends" and parts[2] != "base":
        return {".".join(parts[:3]) + "*", "fiberlite.backends", "fiberlite.backends.base",
                "fiberlite.wire*"} | LOW
    return None


def _matches(target: str, allowed: set[str]) -> bool:
    return any(target == a or (a.endswith("*") and (target == a[:-1] or target.startswith(a[:-1] + ".")))
               for a in allowed)


def test_no_import_cycle():
    found = cycles(import_graph())
    unexpected = [sorted(group) for group in found if group not in ALLOWED_CYCLES]
    assert not unexpected, f"import cycles (imports inside functions count): {unexpected}"
    fixed = [sorted(group) for group in ALLOWED_CYCLES if group not in found]
    assert not fixed, f"no longer a cycle: remove it from ALLOWED_CYCLES: {fixed}"


def test_imports_point_down():
    graph = import_graph()
    upward = set()
    for name, targets in graph.items():
        allowed = allowed_targets(name)
        if allowed is not None:
            upward.update((name, t) for t in targets if not _matches(t, allowed))
    assert upward <= ALLOWED_UPWARD, f"imports that point up: {sorted(upward - ALLOWED_UPWARD)}"
    fixed = ALLOWED_UPWARD - upward
    assert not fixed, f"no longer there: remove it from ALLOWED_UPWARD: {sorted(fixed)}"


def c_sources() -> list[str]:
    """The C files of the package's extensions."""
    return [os.path.join(folder, name) for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE))
            for name in files if name.endswith((".c", ".h"))]


def test_no_module_over_500_lines():
    lengths = {}
    for path in [*modules().values(), *c_sources()]:
        with open(path, encoding="utf-8") as file:
            lengths[os.path.relpath(path, ROOT)] = sum(1 for _ in file)
    long = {path for path, count in lengths.items() if count > MAX_LINES}
    assert long <= ALLOWED_LONG, "modules over %d lines: %s" % (
        MAX_LINES, {path: lengths[path] for path in sorted(long - ALLOWED_LONG)})
    fixed = ALLOWED_LONG - long
    assert not fixed, f"{MAX_LINES} lines or fewer now: remove them from ALLOWED_LONG: {sorted(fixed)}"


def test_the_checks_see_what_they_look_for(tmp_path):
    """The walk finds relative imports inside a function (not those only for type
    checkers), and a cycle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    known = {"fiberlite.x": "", "fiberlite.y": "", "fiberlite.pkg": "", "fiberlite.pkg.z": ""}
    source = tmp_path / "x.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import pkg\n"
                      "def f():\n    from .pkg import z\n    from .y import thing\n")
    assert sorted(imports_of("fiberlite.x", str(source), known)) == ["fiberlite.pkg.z", "fiberlite.y"]
    assert {os.path.basename(path) for path in c_sources()} >= {"sync.h", "mutex.c"}


def _parsed(folder: str) -> Iterator[tuple[str, ast.AST]]:
    """``(path, tree)`` of every module of ``fiberlite/<folder>``."""
    for name, path in modules().items():
        if name == f"{PACKAGE}.{folder}" or name.startswith(f"{PACKAGE}.{folder}."):
            with open(path, encoding="utf-8") as file:
                yield os.path.relpath(path, ROOT), ast.parse(file.read(), path)


def backend_names_in(tree: ast.AST) -> set[str]:
    """Built-in backends' names the code uses: in a name, an attribute, an import or a
    string that is nothing else (prose, such as help text, does not count)."""
    from fiberlite.plugins import BUILTIN
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, (ast.Attribute,)):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg, ast.alias)):
            words.append(getattr(node, "name", None) or getattr(node, "arg", ""))
            words.append(getattr(node, "asname", None) or "")
        elif isinstance(node, ast.ImportFrom):
            words.append(node.module or "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BUILTIN:
            words.append(node.value)
    parts = {part for word in words for part in word.replace(".", "_").split("_")}
    return parts & set(BUILTIN)


def test_the_command_line_knows_no_backend_by_name():
    """``fiberlite run``, ``clean``... reach each backend through its ``Backend`` hooks."""
    found = {path: sorted(names) for path, tree in _parsed("cli") if (names := backend_names_in(tree))}
    assert not found, f"backends named in the command line: {found}"


def foreign_private_reads(tree: ast.AST) -> list[str]:
    """Attributes named ``_x`` (not ``__x__``) read from another object than ``self``, also
    through ``getattr``/``hasattr``/``setattr`` with a constant name."""
    private = lambda name: name.startswith("_") and not name.endswith("__")  # noqa: E731
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and private(str(node.args[1].value))):
            found.append(ast.unparse(node))
    return found


def test_the_dashboard_reads_only_public_views():
    """The run's page reads what the objects show it (their views, ``fiberlite.observe.view_of``, ``Process.launch``,
    ...), never their internals."""
    found = {path: reads for path, tree in _parsed("dashboard") if (reads := foreign_private_reads(tree))}
    assert not found, f"private attributes of other objects read by the dashboard: {found}"


def test_the_name_checks_see_what_they_look_for():
    code = ast.parse("from ..backends.local import runs\nif name == 'docker': run_slurm(pool._core)\n"
                     "getattr(p, '_popen')\nself._own\nx.__class__\nhelp = 'a local door'\n")
    assert backend_names_in(code) == {"local", "docker", "slurm"}
    assert sorted(foreign_private_reads(code)) == ["getattr(p, '_popen')", "pool._core"]


SOCKET_MAKERS = {"create_server", "create_connection", "socketpair"}  # besides socket.socket()
SOCKETS_MAY_OPEN = ("fiberlite/wire/", "fiberlite/connection/")  # the wire; the stdlib's API


def sockets_opened_in(tree: ast.AST) -> list[str]:
    """The calls in ``tree`` that open a socket: ``socket.socket(...)``, and
    ``create_server``/``create_connection``/``socketpair`` however they are reached."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        plain_socket = (isinstance(func, ast.Attribute) and func.attr == "socket"
                        and isinstance(func.value, ast.Name) and func.value.id == "socket")
        if name in SOCKET_MAKERS or plain_socket:
            found.append(f"line {node.lineno}: {ast.unparse(func)}(")
    return found


def test_only_the_wire_opens_sockets():
    """Listening, dialing and socket pairs are the wire's (``fiberlite/wire/``): one
    function per job, used everywhere else."""
    opened = {}
    for name, path in modules().items():
        relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if not relative.startswith(SOCKETS_MAY_OPEN):
            with open(path, encoding="utf-8") as file:
                if calls := sockets_opened_in(ast.parse(file.read(), path)):
                    opened[relative] = calls
    assert not opened, f"sockets opened outside fiberlite/wire/ (use fiberlite.wire.unix, tcp, link): {opened}"


def test_the_socket_check_sees_what_it_looks_for():
    code = ast.parse("import socket\nfrom socket import socketpair\n"
                     "s = socket.socket(socket.AF_UNIX)\na, b = socketpair()\n"
                     "socket.create_connection(('h', 1))\nsrv = socket.create_server(('', 0))\n"
                     "def f(sock: socket.socket) -> None:\n    isinstance(sock, socket.socket)\n"
                     "unix.pair()\n")
    assert sockets_opened_in(code) == ["line 3: socket.socket(", "line 4: socketpair(",
                                       "line 5: socket.create_connection(", "line 6: socket.create_server("]
