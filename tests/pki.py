"""A throwaway certificate authority for TLS tests, made with the ``openssl`` command.

``make_pki(dir, members)`` writes ``ca.crt``/``ca.key``, one certificate per member
naming its id and 127.0.0.1 (``DNS:n1,IP:127.0.0.1``), a client certificate
without names, and a second, unrelated CA (``rogue-ca``) with a certificate that
claims to be ``n2``. Tests that need it skip where openssl is missing. The unit tests of dlm/tls.py
(tests/unit/test_tls.py) and the real-member TLS tests (tests/cluster) share it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

OPENSSL = shutil.which("openssl")


def openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip


def make_leaf(d: Path, name: str, ca: str, sans: str | None) -> None:
    """``name.crt``/``name.key`` signed by ``ca``, for servers and clients alike."""
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip
    extensions = "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
    if sans:
        extensions += f"subjectAltName={sans}\n"
    (d / f"{name}.ext").write_text(extensions)
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


def make_pki(d: Path, members: Iterable[str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    make_ca(d, "ca")
    make_ca(d, "rogue-ca")
    for member in members:
        make_leaf(d, member, "ca", f"DNS:{member},IP:127.0.0.1")
    make_leaf(d, "client", "ca", None)
    make_leaf(d, "rogue-n2", "rogue-ca", "DNS:n2,IP:127.0.0.1")
    return d
