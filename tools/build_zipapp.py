"""Builds dist/dlm.pyz: dlm and its runtime dependencies in one file that python3 runs.

    python tools/build_zipapp.py [--output dist/dlm.pyz] [--work build/zipapp]

1. pip installs the runtime dependencies of pyproject.toml into a build
   directory (``pip install --target``), constrained to the versions installed
   in the Python running this script, so the file ships what the tests ran.
2. Copies the ``dlm`` package from the source tree beside them.
3. Drops compiled extensions (``*.so``): zipimport cannot load them, and
   without them the file is the same on any CPU. cbor2 5.x then uses its
   pure-Python codec (measured by ``python -m bench.startup``).
4. Byte-compiles everything next to its source (``foo.pyc`` beside
   ``foo.py``, where zipimport looks) as unchecked-hash pycs: zip timestamps
   have a 2 s resolution, so timestamp pycs would often be judged stale and
   every run would recompile from source. The sources stay in the archive,
   so a python3 of another version still runs the file, only more slowly.
5. Writes the archive with a ``__main__`` that runs ``dlm.cli.main:main``.

The result needs only python3 >= 3.11: ``python3 -I dlm.pyz --help``.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.metadata
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tomllib
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN = """\
# The entry point of dlm.pyz (written by tools/build_zipapp.py).
from dlm.cli.main import main

main()
"""
DROP_DIRS = {"__pycache__", "bin", "tests"}
DROP_SUFFIXES = (".so", ".pyd", ".dylib", ".dll", ".exe", ".c", ".h", ".pyi")


def runtime_requirements() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return list(project["dependencies"])


def installed_pins() -> list[str]:
    """name==version of every distribution this interpreter has, as pip constraints."""
    pins = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version and name.lower() != "dlm":
            pins[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def pip_install(target: Path, requirements: list[str], constraints: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(target), "--constraint", str(constraints),
        *requirements,
    ]  # fmt: skip
    subprocess.run(command, check=True)


def prune(tree: Path) -> list[str]:
    dropped = []
    for path in sorted(tree.rglob("*"), reverse=True):
        if path.is_dir() and path.name in DROP_DIRS and path.parent == tree:
            shutil.rmtree(path)
            dropped.append(str(path.relative_to(tree)))
        elif path.is_dir() and path.name == "__pycache__":
            shutil.rmtree(path)
        elif path.is_file() and path.name.endswith(DROP_SUFFIXES):
            path.unlink()
            dropped.append(str(path.relative_to(tree)))
    return dropped


def copy_dlm(tree: Path) -> None:
    shutil.copytree(
        ROOT / "dlm",
        tree / "dlm",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
    )


def compile_tree(tree: Path) -> None:
    ok = compileall.compile_dir(
        str(tree),
        quiet=1,
        legacy=True,  # foo.pyc beside foo.py: the only place zipimport looks
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        workers=1,
    )
    if not ok:
        raise SystemExit("byte-compiling the bundle failed (see above)")


def build(output: Path, work: Path) -> Path:
    if work.exists():
        shutil.rmtree(work)
    tree = work / "app"
    tree.mkdir(parents=True)
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(installed_pins()) + "\n", encoding="utf-8")
    pip_install(tree, runtime_requirements(), constraints)
    copy_dlm(tree)
    dropped = prune(tree)
    (tree / "__main__.py").write_text(MAIN, encoding="utf-8")
    compile_tree(tree)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    zipapp.create_archive(tree, tmp, interpreter="/usr/bin/env python3", compressed=True)
    os.replace(tmp, output)
    size_kib = output.stat().st_size // 1024
    print(f"wrote {output} ({size_kib} KiB); left out: {', '.join(dropped) or 'nothing'}")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "dist" / "dlm.pyz")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "zipapp")
    args = parser.parse_args(argv)
    build(args.output.resolve(), args.work.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
