"""A supervisor's /metrics: every partition's samples, each labelled ``partition="i"``.

Each partition process of a member serves its own metrics on 127.0.0.1, on a port
the kernel picks, which it tells its supervisor (seat.py); it demands a bearer
token the supervisor drew for it and handed over in its environment, so another
local user cannot read them. The supervisor serves --metrics-listen with the
member's token and TLS (metrics.py's listener) and, on each scrape, fetches every
partition's exposition (bounded: ``FETCH_TIMEOUT_S``, ``FETCH_LIMIT`` bytes),
adds the ``partition`` label to every sample and merges the families, so each
family's HELP and TYPE appear once. Two families of its own say which partition
processes answered (``dlm_partition_up``) and how often each was started again
(``dlm_partition_restarts_total``). A member of one partition has no supervisor:
its metrics are as they always were.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

FETCH_TIMEOUT_S = 2.0
FETCH_LIMIT = 64 * 1024 * 1024
TOKEN_ENV = "DLM_PARTITION_METRICS_TOKEN"
"""The variable through which a supervisor hands a partition process its metrics token."""


class PartitionSeat(Protocol):
    @property
    def partition(self) -> int: ...

    @property
    def metrics_port(self) -> int | None: ...

    @property
    def metrics_token(self) -> str: ...

    @property
    def restarts(self) -> int: ...


async def fetch(port: int, token: str) -> bytes | None:
    """One partition's exposition, or None if it does not answer in time."""
    writer = None
    try:
        async with asyncio.timeout(FETCH_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + token.encode("ascii")
                + b"\r\nConnection: close\r\n\r\n"
            )
            response = await reader.read(FETCH_LIMIT)
    except (OSError, TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 200"):
        return None
    return body


def labelled(line: str, partition: int) -> str:
    """A sample line with ``partition="i"`` as its first label."""
    label = f'partition="{partition}"'
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1 :]
        return f"{line[: brace + 1]}{label}{'' if rest.startswith('}') else ','}{rest}"
    if space == -1:
        return line
    return f"{line[:space]}{{{label}}}{line[space:]}"


def merge(expositions: Sequence[tuple[int, bytes]]) -> list[str]:
    """The families of every partition's exposition, each once, samples labelled."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for partition, body in expositions:
        family = ""
        for raw in body.decode("utf-8", "replace").splitlines():
            if not raw.strip():
                continue
            if raw.startswith("#"):
                parts = raw.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    known = headers.setdefault(family, [])
                    samples.setdefault(family, [])
                    if len(known) < 2 and raw not in known:
                        known.append(raw)
                continue
            samples.setdefault(family, []).append(labelled(raw, partition))
            headers.setdefault(family, [])
    lines: list[str] = []
    for family, header in headers.items():
        lines.extend(header)
        lines.extend(samples.get(family, []))
    return lines


async def exposition(seats: Sequence[PartitionSeat]) -> bytes:
    """What the supervisor answers a scrape with."""
    ports = [(seat, seat.metrics_port) for seat in seats]
    fetched = await asyncio.gather(
        *(fetch(port, seat.metrics_token) if port is not None else _none() for seat, port in ports)
    )
    bodies = [(seat.partition, body) for (seat, _), body in zip(ports, fetched, strict=True)]
    lines = [
        "# HELP dlm_partition_up Whether the partition's process answered this scrape.",
        "# TYPE dlm_partition_up gauge",
        *(f'dlm_partition_up{{partition="{p}"}} {int(b is not None)}' for p, b in bodies),
        "# HELP dlm_partition_restarts_total Times the supervisor started the partition's "
        "process again.",
        "# TYPE dlm_partition_restarts_total counter",
        *(
            f'dlm_partition_restarts_total{{partition="{seat.partition}"}} {seat.restarts}'
            for seat in seats
        ),
    ]
    lines.extend(merge([(p, b) for p, b in bodies if b is not None]))
    return ("\n".join(lines) + "\n").encode("utf-8")


async def _none() -> None:
    return None
