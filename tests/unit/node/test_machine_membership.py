"""NodeMachine's membership changes, one rule per test, driven by hand (machine_driver.py).

A member added later (`dlm node start --join`) must be reachable and able to
reach the leader whoever leads, across restarts; a change is answered by the
rule that refused it (retry, conflict, unsafe, bad request); and which members
answer is judged from when each was last heard, not from the core's
check-quorum flags.
"""

from __future__ import annotations

from typing import Any

from dlm.node.raft.types import AppendEntriesResponse, Message, Role

from .machine_driver import Client, Cluster, Member, address


def grown(*, links_follow_peers: bool = True) -> Cluster:
    """Three first members, n1 leading, and n4 added through n1 and promoted."""
    cluster = Cluster(3, links_follow_peers=links_follow_peers)
    cluster.elect("n1")
    join(cluster, cluster.connect("n1"), "n4")
    return cluster


def join(cluster: Cluster, client: Client, node: str) -> Member:
    """Adds ``node`` through ``client``'s member, boots it as --join does, and waits until
    the leader has promoted it."""
    reply = client.call("member_add", member=node, address=address(node))
    assert reply["t"] == "ok", reply
    told = {m["id"]: m["address"] for m in reply["members"] if m["id"] != node}
    member = cluster.join(node, told)
    cluster.run_until(lambda: node in client.member.machine.raft.voters, 3.0, f"{node} a voter")
    return member


def caught_up(cluster: Cluster, node: str) -> bool:
    leader = cluster.leader.machine
    return cluster[node].machine.locks.applied_index == leader.locks.applied_index


def replies(cluster: Cluster, client: Client, count: int) -> None:
    lease = client.call("open_lease", lease="L", ttl_ms=60_000)
    assert lease["t"] == "ok", lease
    for i in range(count):
        assert client.call("acquire", lease="L", key=f"k{i}")["result"] == "granted"


# ---------------------------------------------------------------------------
# Reaching members added later
# ---------------------------------------------------------------------------


def test_a_member_joining_through_a_leader_that_joined_later_catches_up() -> None:
    cluster = grown()
    old = cluster["n1"].machine
    old.raft.transfer_leadership("n4")
    cluster.settle(cluster["n1"])
    cluster.run_until(lambda: cluster["n4"].role is Role.LEADER, 2.0, "n4 leading")
    # n5 learns of the first members from its bootstrap and of n4 only from the join's
    # answer; its empty log names neither n4 nor itself.
    n5 = join(cluster, cluster.connect("n4"), "n5")
    assert "n4" in n5.peers
    replies(cluster, cluster.connect("n4"), 3)
    cluster.run_until(lambda: caught_up(cluster, "n5"), 3.0, "n5 caught up")
    # Once its log names the configuration, it keeps links to the members only.
    assert set(n5.peers) == {"n1", "n2", "n3", "n4"}


def test_a_restarted_member_still_reaches_members_added_since_its_snapshot() -> None:
    cluster = grown()
    for node in ("n1", "n2", "n3"):
        restarted = cluster.restart(node)
        assert restarted.peers.get("n4") == address("n4"), node
    cluster.run_until(lambda: any(m.role is Role.LEADER for m in cluster.members.values()),
                      3.0, "a leader")  # fmt: skip
    replies(cluster, cluster.connect(cluster.leader.id), 3)
    cluster.run_until(lambda: caught_up(cluster, "n4"), 3.0, "n4 caught up")


def test_a_joining_member_keeps_links_to_the_members_it_was_told_of_until_its_log_names_it() -> (
    None
):
    cluster = grown()
    told = {"n1": address("n1"), "n9": "n9:7700"}
    n5 = cluster.join("n5", told)
    assert n5.machine.address_of("n9") == "n9:7700"
    assert n5.machine.accept_peer("n9", 2) is None
    assert set(n5.peers) == {"n1", "n2", "n3", "n9"}


# ---------------------------------------------------------------------------
# Answers to a change, by the rule that refused it
# ---------------------------------------------------------------------------


def responses_to(node: str) -> Any:
    def blocked(msg: Message) -> bool:
        return msg.dst == node and isinstance(msg, AppendEntriesResponse)

    return blocked
