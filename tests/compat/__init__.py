"""The previous release of dlm, for the tests that check this one against it.

``dlm-0.1.0.tar.gz`` is the ``dlm/`` package of release 0.1.0 exactly as it
shipped (``git archive e62e477 dlm``), kept here so that the upgrade tests
need neither git history nor the network. ``extract(where)`` unpacks it and
returns the directory to put first on PYTHONPATH (or ``sys.path``) to run
that release's members and modules with this checkout's dependencies.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

ARCHIVE = Path(__file__).with_name("dlm-0.1.0.tar.gz")
VERSION = "0.1.0"
COMMIT = "e62e477"


def extract(where: Path) -> Path:
    """Unpacks the previous release's ``dlm`` package under ``where``; returns ``where``."""
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(where, filter="data")
    if not (where / "dlm" / "__init__.py").exists():
        raise RuntimeError(f"{ARCHIVE} does not hold the dlm package")
    return where
