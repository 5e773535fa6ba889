"""The chaos run's network: every fault-injecting proxy of a run, in one process of its own.

``python -m tests.chaos.netproxy``: reads one JSON line ``{"links": {NAME:
[PORT, UPSTREAM]}}`` on stdin, starts a proxy (tests/cluster/proxy.py) per link
on 127.0.0.1:PORT, all on one event loop, and prints ``{"addresses": {NAME:
ADDR}}``.
Then each line is a command, answered by ``{"ok": true}`` (or an error):
``{"cmd": "cut", "links": [...], "dirs": ["up", "down"]}``,
``{"cmd": "delay", "links": [...], "seconds": S, "dirs": [...]}``,
``{"cmd": "heal", "links": [...]}``. End of input stops every proxy and exits,
so the proxies never outlive the run that started them.

A process of its own, not a thread of the runner: all the members' traffic
passes through it, and it must not wait for the runner's threads.

``Network`` is the runner's handle on it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from tests.cluster.proxy import Proxy

REPO = Path(__file__).resolve().parents[2]
CONTROL_TIMEOUT_S = 10.0


def _serve(links: dict[str, list[Any]]) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="chaos-net", daemon=True)
    thread.start()
    proxies: dict[str, Proxy] = {}
    for name, (port, upstream) in links.items():
        proxy = Proxy(upstream, port=port)
        # One loop for every proxy (each would otherwise run a thread and a loop of its
        # own): the control calls only need ``_loop`` and ``_server`` set.
        proxy._loop = loop
        proxy._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(proxy._accept, "127.0.0.1", port), loop
        ).result(CONTROL_TIMEOUT_S)
        proxies[name] = proxy
    _say({"addresses": {name: p.address for name, p in proxies.items()}})
    for line in sys.stdin:
        try:
            command = json.loads(line)
            names = command.get("links", [])
            dirs = tuple(command.get("dirs") or ("up", "down"))
            for name in names:
                proxy = proxies[name]
                if command["cmd"] == "cut":
                    proxy.cut(*dirs)
                elif command["cmd"] == "delay":
                    proxy.delay(float(command["seconds"]), *dirs)
                elif command["cmd"] == "heal":
                    proxy.heal()
                else:
                    raise ValueError(f"unknown command {command['cmd']!r}")
        except Exception as exc:
            _say({"ok": False, "error": repr(exc)})
            continue
        _say({"ok": True})
    for proxy in proxies.values():
        try:
            proxy._call(proxy._shutdown())
        except Exception:
            pass
    loop.call_soon_threadsafe(loop.stop)
    thread.join(CONTROL_TIMEOUT_S)


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Network:
    """The runner's side: start the proxy process, send it faults, stop it."""

    def __init__(self, links: dict[str, tuple[int, str]], log: Path) -> None:
        self._log = open(log, "ab")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.netproxy"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO,
            text=True,
        )
        self._lock = threading.Lock()
        reply = self._exchange({"links": links})
        self.addresses: dict[str, str] = reply["addresses"]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _exchange(self, obj: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[str] | None = self._proc.stdin
        stdout: IO[str] | None = self._proc.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            stdin.write(json.dumps(obj) + "\n")
            stdin.flush()
            line = stdout.readline()
        if not line:
            raise RuntimeError("the proxy process ended")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("ok") is False:
            raise RuntimeError(f"the proxy process refused {obj}: {reply.get('error')}")
        return reply

    def cut(self, links: Sequence[str], dirs: Sequence[str] = ("up", "down")) -> None:
        if links:
            self._exchange({"cmd": "cut", "links": list(links), "dirs": list(dirs)})

    def delay(
        self, links: Sequence[str], seconds: float, dirs: Sequence[str] = ("up", "down")
    ) -> None:
        if links:
            self._exchange(
                {"cmd": "delay", "links": list(links), "seconds": seconds, "dirs": list(dirs)}
            )

    def heal(self, links: Sequence[str]) -> None:
        if links:
            self._exchange({"cmd": "heal", "links": list(links)})

    def stop(self) -> None:
        """Closes its input (it stops every proxy and exits); kills it by PID if it lingers."""
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            self._proc.wait(CONTROL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait(CONTROL_TIMEOUT_S)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()


if __name__ == "__main__":
    _serve(json.loads(sys.stdin.readline())["links"])
