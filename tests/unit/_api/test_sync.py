"""The public lock object's TTL (dlm/_api/sync.py): without ``ttl`` its lease gets the
cluster's default-ttl, and the TTL the member answers is the one it counts with."""

from __future__ import annotations

from typing import Any

import pytest

import dlm
from dlm.wire import ok
from tests.unit.client.doubles import scripted_member


def _member_with_a_45s_default(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Opens a lease naming no TTL with 45 s; grants every lock; answers the rest."""
    rid, kind = request["id"], request["t"]
    if kind == "open_lease":
        ttl_ms = request.get("ttl_ms", 45_000)
        return [ok(rid, lease=request["lease"], ttl_ms=ttl_ms, incarnation=1)]
    if kind == "acquire":
        return [ok(rid, result="granted", key=request["key"], token=7, lease=request["lease"],
                   ttl_ms=45_000)]  # fmt: skip
    if kind == "keepalive":
        return [ok(rid, lease=request["lease"], ttl_ms=45_000)]
    if kind == "release":
        return [ok(rid, key=request["key"], released="lease", token=7)]
    return [ok(rid, lease=request.get("lease", ""), released=[])]


@pytest.mark.parametrize(("ttl", "sent"), [(None, None), ("10s", 10_000)])
def test_a_lock_without_a_ttl_counts_with_the_ttl_the_member_gave(
    ttl: str | None, sent: int | None
) -> None:
    with scripted_member(_member_with_a_45s_default) as double:
        client = dlm.Client(double.addr, timeout=3.0)
        try:
            lock = client.lock("k", ttl=ttl, wait=0)
            with lock:
                left = lock.time_left()
            [opened] = double.of_type("open_lease")
            assert opened.get("ttl_ms") == sent and ("ttl_ms" in opened) == (sent is not None)
            granted_s = (sent or 45_000) / 1000
            # The deadline is the TTL after the open was sent, less its margins (a loose
            # lower bound, yet above what a 30 s lease could leave).
            assert granted_s * 2 / 3 < left <= granted_s
        finally:
            client.close()
