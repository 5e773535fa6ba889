"""Imports run downward only, and never in a circle (docs/ARCHITECTURE.md, section 2).

ROOMS is the rooms table of that section, top to bottom: a module may import a
module of its own room or of a room on a lower line, never one on its own line
or above. Every import counts, also those inside functions and those only for
the type checker: an upward import is a dependency whoever reads the code must
hold in mind, whenever Python resolves it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dlm"

ROOMS: tuple[tuple[str, ...], ...] = (
    ("dlm.testing",),
    ("dlm.__main__", "dlm._api"),
    ("dlm.cli", "dlm.devcluster"),
    ("dlm.gateway",),
    ("dlm.client", "dlm.node.runtime"),
    ("dlm.node",),
    ("dlm.node.raft", "dlm.node.locks", "dlm.store"),
    ("dlm.views", "dlm.tracing"),
    ("dlm.wire", "dlm.auth", "dlm.tls"),
    ("dlm.limits", "dlm.records"),
    ("dlm",),
)
"""Top to bottom. A room is a module or a package with everything under it, except
the rooms named inside it (dlm.node is the pure member; dlm.node.runtime is apart)."""


def module_paths(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports (``from a import b`` is a.b when b is
    a module, else a)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in modules
                else node.module
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            module = name
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module:
                found.add(module)
    return found


FRONT_DOOR = ("dlm", "dlm._api")
"""The one import that runs upward: the package's ``__init__`` exports the public API
(the room dlm._api, on the top line) lazily, by a module ``__getattr__`` (and the same
names for the type checker). Nothing runs it at import time, so it is left out of the
graph; every other module of the bottom room still imports nothing above it."""


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_paths(package)
    graph = {name: imports_of(path, modules) - {name} for name, path in sorted(modules.items())}
    door, api = FRONT_DOOR
    if door in graph:
        graph[door] = {m for m in graph[door] if m != api and not m.startswith(api + ".")}
    return graph


def room_of(module: str) -> str:
    rooms = [room for line in ROOMS for room in line]
    matches = [r for r in rooms if module == r or module.startswith(r + ".")]
    return max(matches, key=len)


def line_of(room: str) -> int:
    return next(i for i, line in enumerate(ROOMS) if room in line)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a room on the importer's own line or above, as "a -> b"."""
    wrong: list[str] = []
    for module, imported in graph.items():
        mine = room_of(module)
        for other in sorted(imported):
            theirs = room_of(other)
            if theirs != mine and line_of(theirs) <= line_of(mine):
                wrong.append(f"{module} -> {other}")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_import_runs_downward() -> None:
    assert upward_imports(import_graph()) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert cycles(import_graph()) == []


def test_every_room_of_the_table_exists_and_is_drawn_in_the_design() -> None:
    modules = module_paths()
    rooms_section = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## 2. Rooms")[1]
    rooms_section = rooms_section.split("\n## ")[0]
    for line in ROOMS:
        for room in line:
            assert room in modules, f"{room} is in ROOMS but not in the package"
            if room in ("dlm", "dlm.__main__"):
                continue
            path = room.replace(".", "/") + (
                "/" if (ROOT / room.replace(".", "/")).is_dir() else ".py"
            )
            assert path in rooms_section, f"{path} is not drawn in ARCHITECTURE.md section 2"


def test_the_checker_sees_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "dlm"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "store" / "__init__.py").write_text("from dlm.records import Entry\n")
    (package / "records.py").write_text(
        "def f() -> None:\n    from dlm.store import x\n    from dlm.cli import y\n"
    )
    (package / "cli.py").write_text("")
    graph = import_graph(package)
    assert upward_imports(graph) == ["dlm.records -> dlm.cli", "dlm.records -> dlm.store"]
    assert cycles(graph) == [["dlm.records", "dlm.store"]]


def test_a_module_named_like_a_room_prefix_belongs_to_its_own_room() -> None:
    assert room_of("dlm.node.runtime.server") == "dlm.node.runtime"
    assert room_of("dlm.node.machine") == "dlm.node"
    assert room_of("dlm.node.raft.core") == "dlm.node.raft"
    assert room_of("dlm.cli.app") == "dlm.cli"
    assert room_of("dlm") == "dlm"
