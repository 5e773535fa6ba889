"""The entry of a partition's process, started by its member's supervisor.

(dlm.node.runtime.supervisor.)

It lives above both the runtime and the client so that a child can join a running
cluster (``--join``), which asks the cluster as a client does.
"""

from __future__ import annotations

from collections.abc import Sequence


def child_main(argv: Sequence[str]) -> int:
    from dlm.cli.node_join import join_cluster
    from dlm.node.runtime.main import child_main as run_child

    return run_child(argv, join=join_cluster)
