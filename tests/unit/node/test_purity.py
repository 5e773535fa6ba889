"""The pure side of the member must not do IO, read a clock or draw randomness.

The rule is per folder, so a new room is checked the day it is added: every
module directly in dlm/node/ (the node machine, admission, leases, stats,
linkwatch, the peer codec, and whatever joins them), everything in
dlm/node/raft/ and dlm/node/locks/, and the leaves they stand on (dlm/wire.py,
dlm/limits.py, dlm/records.py). The runtime, which does the IO, lives apart in
dlm/node/runtime/. The simulator drives exactly the pure side.

We check every import statement of those modules against an allow-list, so a
stray `import time` or `from socket import ...` fails here rather than as a
heisenbug in the simulator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "dlm"

PURE_FOLDERS = (ROOT / "node", ROOT / "node" / "raft", ROOT / "node" / "locks")
"""Every module directly in these folders is pure (dlm/node/runtime/ is not one of them)."""
PURE_LEAVES = (
    ROOT / "wire.py",
    ROOT / "views.py",
    ROOT / "limits.py",
    ROOT / "records.py",
    ROOT / "compiled.py",
    ROOT / "frame_protocols.py",
    ROOT / "cli" / "exec_rules.py",
    ROOT / "client" / "renewal.py",
    ROOT / "client" / "fanout.py",
    ROOT / "cbor_codec.py",
    ROOT / "partitioning.py",
    ROOT / "gateway" / "routing.py",
)
"""The leaves the pure side stands on, `dlm exec`'s decisions (its guard's and its
supervisor's) and a kept-alive lease's (client/renewal.py), which the simulator drives too."""
PURE_MODULES = sorted([*(p for folder in PURE_FOLDERS for p in folder.glob("*.py")), *PURE_LEAVES])


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PURE_PACKAGES = frozenset(_module_name(p) for p in PURE_MODULES)

# Standard-library modules that compute without touching the outside world.
# `random` is allowed only for the type of an injected, seeded generator.
ALLOWED = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "operator",
    "random",
    "struct",
    "typing",
    # Only while type checking (dlm/compiled.py): mypyc's class options.
    "mypy_extensions",
    "cbor2",
    "dlm",
}

ALSO_ALLOWED = {"cbor_codec.py": {"sys", "_cbor2"}, "partitioning.py": {"hashlib"}}
"""Per module: the codec reads and restores sys.modules while it sets up cbor2's C module;
the partition function hashes a key (hashlib computes, nothing more)."""

FORBIDDEN_CALLS = {
    ("random", "random"),
    ("random", "randint"),
    ("random", "choice"),
    ("random", "shuffle"),
    ("random", "uniform"),
    ("random", "seed"),
    ("random", "randrange"),
}


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("dlm", "dlm.node"):
                # `from dlm.node import locks` imports the module dlm.node.locks.
                names.extend(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                names.append(node.module)
    return names


def test_there_are_modules_to_check() -> None:
    names = {_module_name(p) for p in PURE_MODULES}
    assert {"dlm.node.machine", "dlm.node.raft.core", "dlm.node.locks.machine"} <= names
    assert "dlm.records" in names and all(p.exists() for p in PURE_LEAVES)
    assert not any(name.startswith("dlm.node.runtime") for name in names)


def _pure_module(name: str) -> bool:
    # _imports names modules (`from dlm.node import locks` gives dlm.node.locks), so an
    # exact match: dlm.node.runtime.server is not pure because dlm.node is.
    return name in PURE_PACKAGES


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_only_pure_modules(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for name in _imports(tree):
        top = name.split(".")[0]
        allowed = ALLOWED | ALSO_ALLOWED.get(path.name, set())
        assert top in allowed, f"{path.name} imports {name!r}, which may do IO or read a clock"
        if top == "dlm":
            assert _pure_module(name), (
                f"{path.name} imports {name!r}: a pure module may only import other pure modules"
            )


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_draws_no_global_randomness(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
        ):
            pair = (node.func.value.id, node.func.attr)
            assert pair not in FORBIDDEN_CALLS, (
                f"{path.name}:{node.lineno} calls {pair[0]}.{pair[1]}: use the injected rng"
            )


def test_checker_catches_a_clock_import(tmp_path: Path) -> None:
    bad = ast.parse("import time\nfrom socket import socket\n")
    tops = {n.split(".")[0] for n in _imports(bad)}
    assert not tops <= ALLOWED


def test_the_span_recorder_is_one_of_the_pure_rooms() -> None:
    # Issue 30: the spans of traced requests are recorded from the Instants given, never a
    # clock's reading, and leave as plain data; OpenTelemetry stays in the runtime's reach.
    assert ROOT / "node" / "spans.py" in PURE_MODULES
