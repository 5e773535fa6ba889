"""An impostor on a dead member's port: `python -m tests.cluster.impostor PORT LOG [TARGET...]`.

It binds 127.0.0.1:PORT (where a stopped member listened) and answers every
connection's first frame, whatever it is, with the refusal a removed member
gets ("member X was removed from this cluster"), before any proof. Meanwhile it
dials each TARGET (HOST:PORT of a live member) with spoofed peer hellos: one
claiming the dead member's id, one claiming an id the log does not name, both
giving the impostor's own address, asking for the handshake and never proving
anything. Each answer and each spoof is one line in LOG ("refused n1",
"spoofed 127.0.0.1:7701"), which the test waits on. It runs until killed, or
for at most RUN_FOR seconds.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time

import cbor2

RUN_FOR = 300.0
SPOOF_EVERY = 0.2


def frame(obj: object) -> bytes:
    body = cbor2.dumps(obj)
    return struct.pack(">I", len(body)) + body


def first_frame(sock: socket.socket) -> dict[str, object]:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
        if len(buf) > 65536:
            return {}
        data = sock.recv(4096)
        if not data:
            return {}
        buf += data
    (n,) = struct.unpack(">I", buf[:4])
    decoded = cbor2.loads(buf[4 : 4 + n])
    return decoded if isinstance(decoded, dict) else {}


class Impostor:
    def __init__(self, port: int, log_path: str, targets: list[str]) -> None:
        self.port = port
        self.targets = targets
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the whole run
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + RUN_FOR

    def note(self, line: str) -> None:
        with self.lock:
            self.log.write(line + "\n")

    def answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            try:
                hello = first_frame(conn)
                node = str(hello.get("node", "?"))
                refusal = {
                    "t": "error",
                    "code": "BAD_REQUEST",
                    "message": f"member {node} was removed from this cluster: remove its data "
                    "directory and join it again, with a new id",
                }
                conn.sendall(frame(refusal))
            except OSError:
                return
            self.note(f"refused {node}")

    def serve(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.5)
        while time.monotonic() < self.deadline:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def spoof(self, claimed: str, cluster: str) -> None:
        me = f"127.0.0.1:{self.port}"
        while time.monotonic() < self.deadline:
            for target in self.targets:
                host, port = target.rsplit(":", 1)
                hello = {"t": "hello", "role": "peer", "version": 1, "max_version": 2,
                         "cluster": cluster, "node": claimed, "addr": me,
                         "auth": "hmac-sha256", "auth_nonce": os.urandom(32)}  # fmt: skip
                try:
                    with socket.create_connection((host, int(port)), timeout=5.0) as conn:
                        conn.sendall(frame(hello))
                        first_frame(conn)  # the welcome (our proof never follows)
                except OSError:
                    continue
                self.note(f"spoofed {claimed} {target}")
            time.sleep(SPOOF_EVERY)


def main() -> None:
    port, log_path, *targets = sys.argv[1:]
    cluster = os.environ.get("IMPOSTOR_CLUSTER", "test")
    impostor = Impostor(int(port), log_path, targets)
    for claimed in ("n3", "n4"):
        threading.Thread(target=impostor.spoof, args=(claimed, cluster), daemon=True).start()
    impostor.serve()


if __name__ == "__main__":
    main()
