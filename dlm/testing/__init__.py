"""dlm.testing: a real dlm cluster inside your own tests.

::

    import dlm.testing

    with dlm.testing.cluster(3) as c:          # three members, a leader elected
        client = c.client()                    # connects with the cluster's secret
        ...
        c.kill_leader()                        # kill -9; the others elect a new one
        c.restart("n1")                        # the killed member comes back
        link = c.link()                        # a client's own path to the cluster
        held = link.client()                   # ... which cut() silences, both ways
        link.cut(); link.restore()

    with dlm.testing.cluster(3, partitions=4) as c:   # a leader in each of 4 partitions
        c.wait_for_leaders()                   # {partition: Member}

The members are child processes (``python -m dlm node start``) on free 127.0.0.1 ports,
each with a data directory under one temporary directory, started with a generated peer
secret and client secret. Leaving the ``with`` block stops every process it started, by
PID (SIGTERM, then SIGKILL after a grace period), also when the block raised, and removes
the temporary directory. With ``partitions=P`` each member supervises P partition processes;
``kill``, ``pause`` and ``resume`` reach all of a member's processes.

For pytest, ``pytest_plugins = ["dlm.testing.pytest_plugin"]`` in your conftest.py gives
the ``dlm_cluster`` fixture.

Importing this package is cheap: the names load on first use.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dlm.testing.processes import Cluster, ClusterError, Link, Member, cluster
    from dlm.testing.proxy import Proxy

_LAZY = {
    "Cluster": "dlm.testing.processes",
    "ClusterError": "dlm.testing.processes",
    "Link": "dlm.testing.processes",
    "Member": "dlm.testing.processes",
    "cluster": "dlm.testing.processes",
    "Proxy": "dlm.testing.proxy",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dlm.testing' has no attribute {name!r}")
    return getattr(__import__(module, fromlist=(name,)), name)


__all__ = ["Cluster", "ClusterError", "Link", "Member", "Proxy", "cluster"]
