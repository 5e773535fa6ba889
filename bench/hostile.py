"""What authentication and TLS cost a connection, and what idle connections cost a member.

    python -m bench.hostile [--connects 400] [--idle 10000]

Not a test. Starts one-member clusters on free 127.0.0.1 ports (fsync off;
stopped by PID at the end) and prints:

- the time for the blocking client to connect and complete its hello (plain,
  with a client secret, with TLS, with both), median and 90th percentile of
  ``--connects`` connections, each closed before the next;
- the member's resident memory before and after ``--idle`` idle connections,
  each past its hello (and its handshake, with a secret), and per connection.
  The bench raises its own open-files limit to the hard limit for that; the
  member raises its own at start-up.

The flood figures (worst acquire latency during a tag-bomb flood and during an
idle flood under 256 descriptors) come from tests/cluster/test_floods.py, which
prints them (``pytest -s``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cbor2

from dlm import auth, tls
from dlm.client.sync import _Connection

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Member:
    def __init__(self, base: Path, name: str, args: list[str]) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = base / f"{name}.log"
        env = {**os.environ, "DLM_NO_FSYNC": "1", "DLM_LOG_LEVEL": "warning"}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        command = [sys.executable, "-m", "dlm", "node", "start", "--listen", self.address,
                   "--data", str(base / name), *args]  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=out, env=env)

    def wait_serving(self, secret: bytes | None, context: Any) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                conn, _ = _Connection.open(self.address, time.monotonic() + 1, secret, context)
                conn.close()
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit(f"member did not start: {self.log.read_text()[-2000:]}")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def make_pki(d: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise SystemExit("the openssl command is needed for the TLS figures")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    run("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=bench-ca", "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    run("req", *curve, "-keyout", "n1.key", "-out", "n1.csr", "-subj", "/CN=n1")
    (d / "n1.ext").write_text("subjectAltName=DNS:n1,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "n1.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "n1.crt", "-days", "1", "-extfile", "n1.ext")  # fmt: skip


def connect_times(address: str, secret: bytes | None, context: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        conn, greeting = _Connection.open(address, time.monotonic() + 5, secret, context)
        times.append(time.perf_counter() - started)
        assert greeting.get("t") == "welcome", greeting
        conn.close()
    return times


def idle_connections(member: Member, secret: bytes | None, count: int) -> tuple[int, int]:
    """(RSS before, RSS with ``count`` idle connections past their hello), in KiB."""
    before = member.rss_kib()
    hello = {"t": "hello", "role": "client", "version": 1}
    held: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", member.port), timeout=10)
            initiator = None
            frame = dict(hello)
            if secret is not None:
                initiator = auth.Initiator(secret, auth.new_nonce(), role="client", cluster="",
                                           node="")  # fmt: skip
                frame.update(initiator.hello_fields())
            body = cbor2.dumps(frame)
            sock.sendall(struct.pack(">I", len(body)) + body)
            welcome = read_frame(sock)
            if welcome.get("t") != "welcome":
                raise SystemExit(f"connection {i} refused: {welcome}")
            if initiator is not None:
                body = cbor2.dumps(initiator.check_welcome(welcome))
                sock.sendall(struct.pack(">I", len(body)) + body)
            held.append(sock)
        time.sleep(1.0)  # let the member finish admitting the last ones
        return before, member.rss_kib()
    finally:
        for sock in held:
            sock.close()


def read_frame(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("closed by the member")
        buf += chunk
    (n,) = struct.unpack(">I", buf[:4])
    obj: dict[str, Any] = cbor2.loads(buf[4 : 4 + n])
    return obj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connects", type=int, default=400)
    parser.add_argument("--idle", type=int, default=10_000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="dlm-bench-hostile-") as tmp:
        base = Path(tmp)
        make_pki(base)
        auth.write_secret_file(str(base / "client.secret"))
        secret = auth.load_secret(str(base / "client.secret"))
        context = tls.client_context(str(base / "ca.crt"))
        secret_args = ["--client-secret-file", str(base / "client.secret")]
        tls_args = ["--tls-cert", str(base / "n1.crt"), "--tls-key", str(base / "n1.key"),
                    "--tls-ca", str(base / "ca.crt")]  # fmt: skip
        cases = [
            ("plain", [], None, None),
            ("secret", secret_args, secret, None),
            ("tls", tls_args, None, context),
            ("tls+secret", [*tls_args, *secret_args], secret, context),
        ]
        members: list[Member] = []
        try:
            print(f"connect + hello, {args.connects} connections each (median / p90):")
            for name, flags, case_secret, case_tls in cases:
                member = Member(base, f"m-{name}", flags)
                members.append(member)
                member.wait_serving(case_secret, case_tls)
                connect_times(member.address, case_secret, case_tls, 20)  # warm-up
                times = sorted(connect_times(member.address, case_secret, case_tls, args.connects))
                p90 = times[int(len(times) * 0.9)]
                print(f"  {name:<11} {statistics.median(times) * 1e3:7.3f} ms  {p90 * 1e3:7.3f} ms")
                member.stop()
            print(f"member RSS with {args.idle} idle connections:")
            limit = str(args.idle + 2000)
            for name, flags, case_secret in (("plain", [], None),
                                             ("secret", secret_args, secret)):  # fmt: skip
                member = Member(base, f"idle-{name}", [*flags, "--max-connections", limit])
                members.append(member)
                member.wait_serving(case_secret, None)
                before, after = idle_connections(member, case_secret, args.idle)
                per = (after - before) * 1024 / args.idle
                print(f"  {name:<7} {before / 1024:6.1f} MiB -> {after / 1024:6.1f} MiB "
                      f"({per / 1024:.1f} KiB per connection)")  # fmt: skip
                member.stop()
        finally:
            for member in members:
                member.stop()


if __name__ == "__main__":
    main()
