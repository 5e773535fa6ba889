"""The compiled build's contract (`make compiled`, tools/build_compiled.py): interpreted
runs need nothing from mypyc, the modules it compiles are pure ones, and the zipapp never
ships what it builds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dlm.compiled import mypyc_attr

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_decorator_changes_nothing_when_interpreted() -> None:
    class Room:
        pass

    assert mypyc_attr(allow_interpreted_subclasses=True)(Room) is Room
    assert mypyc_attr(native_class=False)(Room) is Room


def test_only_pure_modules_are_compiled() -> None:
    from tests.unit.node.test_purity import PURE_MODULES

    compiled = [ROOT / path for path in _tool("build_compiled").COMPILED]  # type: ignore[attr-defined]
    assert compiled and all(path.exists() for path in compiled)
    assert set(compiled) <= set(PURE_MODULES)


def test_the_zipapp_drops_compiled_extensions() -> None:
    assert ".so" in _tool("build_zipapp").DROP_SUFFIXES  # type: ignore[attr-defined]
