"""Compiles the hot pure rooms to C extensions with mypyc, next to their sources.

    python tools/build_compiled.py           # build (needs mypy, hence mypyc, and a C compiler)
    python tools/build_compiled.py --clean   # remove what a build left, back to interpreted

The rooms are the wire codec, the peer codec, the Raft core and the node machine: the
Python work of every request. Each ``foo.py`` gets a ``foo.<abi>.so`` beside it, which
Python imports in its place, and all of them share one runtime library,
``dlm_native__mypyc.<abi>.so`` at the top of the tree. The sources do not change, so a
tree without the ``.so`` files (the zipapp, a machine without a compiler) runs them
interpreted; the ``.so`` files are build output and git ignores them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUP = "dlm_native"

# Left interpreted: dlm/records.py, whose frozen dataclasses the simulator deep-copies (a
# compiled frozen dataclass cannot be restored by copy), and dlm/node/locks/, whose result
# dataclasses override a ClassVar by plain assignment, which mypyc turns into a field.
COMPILED = [
    "dlm/wire.py",
    "dlm/node/peer_codec.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dlm/node/raft").glob("*.py")),
    "dlm/node/machine.py",
]

SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="dlm-native",
    ext_modules=mypycify({paths!r}, group_name={group!r}, opt_level="3"),
    script_args=["build_ext", "--inplace", "--build-temp", {temp!r}],
)
"""


def built_files() -> list[Path]:
    found = list((ROOT / "dlm").rglob("*.so"))
    found += list(ROOT.glob(f"{GROUP}__mypyc*.so"))
    return found


def clean() -> None:
    for path in built_files():
        path.unlink()
    shutil.rmtree(ROOT / "build" / "mypyc", ignore_errors=True)


def build() -> None:
    clean()
    work = ROOT / "build" / "mypyc"
    work.mkdir(parents=True, exist_ok=True)
    script = work / "setup.py"
    script.write_text(SETUP.format(paths=COMPILED, group=GROUP, temp=str(work / "temp")))
    env = {**os.environ, "MYPYC_OPT_LEVEL": "3"}
    # mypyc writes its C sources under ./build; run from the top so paths match the modules.
    subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled build")
    args = parser.parse_args()
    if args.clean:
        clean()
    else:
        build()
    print(f"{len(built_files())} compiled files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
