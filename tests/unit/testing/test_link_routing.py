"""dlm.testing without members: a link's client never steps around the link, loading the
package or the pytest plugin starts nothing and loads nothing heavy, bad references say so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dlm.client import core
from dlm.testing.processes import Cluster, Member, _LinkRouter, _route_through

MEMBERS = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
THROUGH = {m: f"127.0.0.1:{9000 + i}" for i, m in enumerate(MEMBERS)}


def test_a_redirect_to_a_member_goes_through_its_link_proxy() -> None:
    base = core.Router(list(THROUGH.values()), 1)
    router = _LinkRouter(base, THROUGH)
    assert router.target() == "127.0.0.1:9001"  # the turn carries over
    router.redirect("127.0.0.1:7003", source="127.0.0.1:9001")
    assert router.target() == "127.0.0.1:9002"
    # An address the link does not know (a member added later) is left as it is.
    router.redirect("127.0.0.1:7777")
    assert router.target() == "127.0.0.1:7777"


def test_a_spawned_client_stays_inside_the_link_too() -> None:
    from dlm.client.sync import Client

    client = Client(list(THROUGH.values()))
    _route_through(client, THROUGH)
    child = client.spawn()
    grandchild = child.spawn()
    for made in (client, child, grandchild):
        router = made._ctx.router
        assert isinstance(router, _LinkRouter)
        router.redirect("127.0.0.1:7002")
        assert router.target() == "127.0.0.1:9001"


def test_the_async_client_stays_inside_the_link_too() -> None:
    from dlm.client.aio import AsyncClient

    client = AsyncClient(list(THROUGH.values()))
    _route_through(client, THROUGH)
    router = client.spawn()._ctx.router
    router.redirect("127.0.0.1:7001")
    assert router.target() == "127.0.0.1:9000"


def test_loading_the_package_and_the_plugin_starts_nothing_and_stays_light() -> None:
    probe = (
        "import sys, threading, dlm.testing, dlm.testing.pytest_plugin\n"
        "heavy = [m for m in ('dlm.testing.processes', 'dlm.client.sync',"
        " 'dlm.devcluster', 'dlm.testing.proxy') if m in sys.modules]\n"
        "print(heavy, threading.active_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.split() == ["[]", "1"]


def test_an_unknown_member_is_named_with_the_members_there_are(tmp_path: object) -> None:
    c = Cluster(2)
    try:
        c.members = [Member("n1", 7001, c.base), Member("n2", 7002, c.base)]
        assert c.member("127.0.0.1:7002").name == "n2"
        with pytest.raises(KeyError, match=r"no member 'n9': the members are \['n1', 'n2'\]"):
            c.member("n9")
    finally:
        c.close()
    assert not c.base.exists()


def test_a_cluster_of_no_members_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        Cluster(0)
