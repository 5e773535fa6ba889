"""The node machine and what it is built of must not do IO, read a clock or draw randomness.

That is the Raft core, the lock state machine, the leader's lease tracker, the
node machine that owns them (machine.py), the protocol rules they use
(wire.py, limits.py), and `dlm exec`'s decisions (cli/exec_rules.py: its
guard's and its supervisor's): the simulator drives exactly these.

We check every import statement of those modules against an allow-list, so a
stray `import time` or `from socket import ...` fails here rather than as a
heisenbug in the simulator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "dlm"

PURE_FILES = (
    ROOT / "node" / "machine.py",
    ROOT / "node" / "leases.py",
    ROOT / "node" / "stats.py",
    ROOT / "wire.py",
    ROOT / "limits.py",
    ROOT / "cli" / "exec_rules.py",
)
PURE_MODULES = sorted(
    [
        *ROOT.joinpath("node", "raft").glob("*.py"),
        *ROOT.joinpath("node", "locks").glob("*.py"),
        *PURE_FILES,
    ]
)
PURE_PACKAGES = (
    "dlm.node.raft",
    "dlm.node.locks",
    "dlm.node.machine",
    "dlm.node.leases",
    "dlm.node.stats",
    "dlm.wire",
    "dlm.limits",
    "dlm.cli.exec_rules",
)

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
    "cbor2",
    "dlm",
}

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
    assert any(p.name == "types.py" for p in PURE_MODULES)
    assert all(p.exists() for p in PURE_FILES)


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_only_pure_modules(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for name in _imports(tree):
        top = name.split(".")[0]
        assert top in ALLOWED, f"{path.name} imports {name!r}, which may do IO or read a clock"
        if top == "dlm":
            assert name.startswith(PURE_PACKAGES), (
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
