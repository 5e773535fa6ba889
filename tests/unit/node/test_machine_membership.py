"""NodeMachine's membership changes, one rule per test, driven by hand (machine_driver.py).

A member added later (`dlm node start --join`) must be reachable and able to
reach the leader whoever leads, across restarts; a change is answered by the
rule that refused it (retry, conflict, unsafe, bad request); and which members
answer is judged from when each was last heard, not from the core's
check-quorum flags.
"""

from __future__ import annotations

from typing import Any

from dlm.node.machine import EXIT_OLD_INCARNATION
from dlm.node.raft.types import AppendEntriesResponse, Message, Role
from dlm.wire import incarnation_mismatch

from .machine_driver import Client, Cluster, Member, address


def grown() -> Cluster:
    """Three first members, n1 leading, and n4 added through n1 and promoted; messages go
    only where the runtime would have a link."""
    cluster = Cluster(3, links_follow_peers=True)
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


def write_entries(client: Client, count: int) -> None:
    """A lease and ``count`` grants under it, through ``client``'s member."""
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
    write_entries(cluster.connect("n4"), 3)
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
    write_entries(cluster.connect(cluster.leader.id), 3)
    cluster.run_until(lambda: caught_up(cluster, "n4"), 3.0, "n4 caught up")


def test_a_member_that_missed_the_addition_of_the_leader_catches_up_from_it() -> None:
    cluster = Cluster(3, links_follow_peers=True)
    cluster.elect("n1")
    # n3 is away (cut off, its clock stopped) while n4 is added and made the leader.
    cluster.blocked = lambda msg: "n3" in (msg.src, msg.dst)
    reply = cluster.connect("n1").call("member_add", member="n4", address=address("n4"))
    assert reply["t"] == "ok", reply
    cluster.join("n4", {m["id"]: m["address"] for m in reply["members"] if m["id"] != "n4"})
    cluster.run_until(lambda: "n4" in cluster["n1"].machine.raft.voters, 3.0, "n4 a voter")
    cluster["n1"].machine.raft.transfer_leadership("n4")
    cluster.settle(cluster["n1"])
    cluster.run_until(lambda: cluster["n4"].role is Role.LEADER, 2.0, "n4 leading")
    write_entries(cluster.connect("n4"), 3)
    assert "n4" not in cluster["n3"].machine.raft.voters
    # n3 comes back: its log names n1-n3 only, and the leader is n4. It accepts n4's link
    # (n4's hello says where n4 listens) and answers it there until its log names n4.
    cluster.blocked = lambda msg: False
    cluster.run_until(lambda: caught_up(cluster, "n3"), 3.0, "n3 caught up")
    assert "n4" in cluster["n3"].machine.raft.voters
    assert cluster["n3"].peers.get("n4") == address("n4")


def test_a_stranger_that_names_no_address_is_refused_and_addresses_kept_are_capped() -> None:
    cluster = grown()
    machine = cluster["n2"].machine
    assert machine.accept_peer("n99", 2) == "'n99' is not a member of this cluster"
    for i in range(100):
        assert machine.accept_peer(f"x{i}", 2, f"10.9.0.{i}:7700") is None
    assert len(machine.membership.unlisted) <= 16
    # An address from a hello never makes a member, nor a link unless that peer leads us.
    assert not any(p.startswith("x") for p in cluster["n2"].peers)


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


def test_a_leader_elected_a_moment_ago_asks_a_change_to_wait_rather_than_refusing_it() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    # n2 wins, and its first entry cannot commit: the acknowledgements do not reach it.
    cluster.blocked = responses_to("n2")
    cluster["n1"].machine.raft.transfer_leadership("n2")
    cluster.settle(cluster["n1"])
    cluster.run_until(lambda: cluster["n2"].role is Role.LEADER, 2.0, "n2 leading")
    client = cluster.connect("n2")
    reply = client.wait(client.send("member_add", member="n4", address=address("n4")))
    assert reply["t"] == "error"
    assert reply["code"] == "UNAVAILABLE" and reply["retry_after_ms"] > 0  # the client retries
    cluster.blocked = lambda msg: False
    cluster.advance(0.2)  # its first entry commits
    reply = client.call("member_add", member="n4", address=address("n4"))
    assert reply["t"] == "ok"


def test_a_change_while_another_is_uncommitted_is_a_conflict() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.blocked = responses_to("n1")
    client = cluster.connect("n1")
    first = client.send("member_add", member="n4", address=address("n4"))
    second = client.wait(client.send("member_add", member="n5", address=address("n5")))
    assert second["code"] == "CONFLICT" and "retry" in second["message"]
    assert cluster["n1"].machine.address_of("n5") is None  # n5 is no member of anything
    cluster.blocked = lambda msg: False
    assert client.wait(first)["t"] == "ok"


def test_a_change_whose_leader_steps_down_first_is_answered_not_leader_at_once() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.blocked = lambda msg: "n1" in (msg.src, msg.dst)
    client = cluster.connect("n1")
    rid = client.send("member_add", member="n4", address=address("n4"))
    cluster.run_until(lambda: client.reply(rid) is not None, 2.0, "an answer")
    assert cluster["n1"].role is not Role.LEADER
    assert (client.reply(rid) or {}).get("code") == "NOT_LEADER"  # the client re-sends


def test_refusals_say_what_is_wrong() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    client = cluster.connect("n1")
    exists = client.call("member_add", member="n2", address="elsewhere:1")
    assert exists["code"] == "BAD_REQUEST"
    assert "n2 is already a member: pick an id not in use" in exists["message"]
    taken = client.call("member_add", member="n9", address=address("n2"))
    assert taken["code"] == "BAD_REQUEST"
    assert "is already n2's address: give the new member an address" in taken["message"]
    unknown = client.call("member_remove", member="n9")
    assert unknown["code"] == "BAD_REQUEST"
    assert "n9 is not a member: nothing to remove" in unknown["message"]
    stranger = client.call("member_promote", member="n9")
    assert "n9 is not a member: add it first" in stranger["message"]
    voter = client.call("member_promote", member="n2")
    assert voter["code"] == "BAD_REQUEST" and "n2 is already a voter" in voter["message"]
    # None of these reached the log, and the address of a refused add is not kept.
    assert cluster["n1"].machine.raft.voters == ("n1", "n2", "n3")
    assert cluster["n1"].machine.address_of("n9") is None
    lone = Cluster(1)
    lone.elect("n1")
    last = lone.connect("n1").call("member_remove", member="n1")
    assert last["code"] == "BAD_REQUEST"
    assert "n1 is the last voter, and a cluster needs one: add another" in last["message"]


def test_removing_a_voter_that_would_leave_no_quorum_is_unsafe_unless_forced() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.blocked = lambda msg: msg.src == "n3" or msg.dst == "n3"
    cluster.advance(2.0)  # n3 silent for longer than two election timeouts
    client = cluster.connect("n1")
    reply = client.call("member_remove", member="n2")
    assert reply["code"] == "UNSAFE" and "--force" in reply["message"]
    # The silent one itself may go: the two that answer are a quorum of what is left.
    reply = client.call("member_remove", member="n3")
    assert reply["t"] == "ok" and [m["id"] for m in reply["members"]] == ["n1", "n2"]


# ---------------------------------------------------------------------------
# Who answers
# ---------------------------------------------------------------------------


def test_members_that_answered_a_moment_ago_are_reachable_through_a_check_quorum_round() -> None:
    cluster = Cluster(3)
    leader = cluster.elect("n1")
    # Everything to the leader held back for a few ticks: its check-quorum round clears the
    # core's per-member activity flags in between, yet both followers spoke moments ago.
    cluster.blocked = lambda msg: msg.dst == "n1"
    for _ in range(cluster.timing.election_ticks):
        cluster.advance(cluster.timing.tick_s)
        assert leader.role is Role.LEADER
        view = leader.machine.members_view(cluster.now())
        assert [(m.id, m.reachable, m.role) for m in view.members] == [
            ("n1", True, "leader"),
            ("n2", True, "follower"),
            ("n3", True, "follower"),
        ]


def test_a_member_whose_link_dropped_does_not_count_for_a_removal_even_if_heard_a_moment_ago() -> (
    None
):
    cluster = Cluster(3)
    leader = cluster.elect("n1")
    cluster.blocked = lambda msg: "n3" in (msg.src, msg.dst)
    leader.machine.peer_unreachable("n3", cluster.now())  # killed: its connection closed
    cluster.settle(leader)
    view = leader.machine.members_view(cluster.now())
    assert [(m.id, m.reachable) for m in view.members][2] == ("n3", False)
    reply = cluster.connect("n1").call("member_remove", member="n2")
    assert reply["code"] == "UNSAFE" and "n3" in reply["message"]
    # Heard from again: it counts again.
    cluster.blocked = lambda msg: False
    cluster.advance(cluster.timing.tick_s * 2)
    view = leader.machine.members_view(cluster.now())
    assert all(m.reachable for m in view.members)


# ---------------------------------------------------------------------------
# A removed member
# ---------------------------------------------------------------------------


def test_a_member_told_it_was_removed_stops_with_exit_0_saying_what_to_do() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    n3 = cluster["n3"]
    n3.machine.peer_refused("n1", "'n3' is not a member of this cluster")
    cluster.settle(n3)
    assert n3.stops == []  # refused for another reason: it keeps trying
    n3.machine.peer_refused("n1", "member n3 was removed from this cluster: remove its data")
    n3.machine.peer_refused("n2", "member n3 was removed from this cluster: remove its data")
    cluster.settle(n3)
    [stop] = n3.stops
    assert stop.code == 0
    assert "was removed from this cluster (told by n1)" in stop.reason
    assert "remove its data directory and start it with --join and a new --id" in stop.reason


def test_a_member_told_with_proof_it_is_of_the_old_incarnation_stops_with_65() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    n3 = cluster["n3"]
    n3.machine.peer_refused("n1", incarnation_mismatch("n1", 9, "n1", 0))  # names n1: not us
    cluster.settle(n3)
    assert n3.stops == []
    told = incarnation_mismatch("n1", 4_294_967_300, "n3", 0)
    n3.machine.peer_refused("n1", told)
    n3.machine.peer_refused("n2", told)
    cluster.settle(n3)
    [stop] = n3.stops
    assert stop.code == EXIT_OLD_INCARNATION == 65
    assert stop.reason == told


# ---------------------------------------------------------------------------
# A new member must prove itself before it counts
# ---------------------------------------------------------------------------


def _reasons(client: Client) -> dict[str, str]:
    return {m["id"]: m["reason"] for m in client.call("members")["members"]}


def test_a_member_added_at_an_address_that_never_proves_the_secret_stays_a_learner() -> None:
    # Nothing at mallory's address completes a handshake: no link is ever admitted, so
    # the leader never hears from it, and neither auto-promotion nor an operator's
    # promote makes it a voter. The members view says why.
    cluster = Cluster(3, peers_authenticated=True)
    cluster.elect("n1")
    client = cluster.connect("n1")
    assert client.call("member_add", member="mallory", address="10.9.9.9:7700")["t"] == "ok"
    cluster.advance(5.0)
    leader = cluster["n1"].machine
    assert "mallory" in leader.raft.learners and "mallory" not in leader.raft.voters
    assert _reasons(client) == {"n1": "", "n2": "", "n3": "", "mallory": (
        "never proved the peer secret"
    )}  # fmt: skip
    refused = client.call("member_promote", member="mallory")
    assert refused["code"] == "BAD_REQUEST"
    assert "mallory never proved the peer secret: it stays a learner" in refused["message"]
    assert leader.raft.voters == ("n1", "n2", "n3")


def test_without_peer_authentication_a_learner_must_at_least_have_answered() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    client = cluster.connect("n1")
    client.call("member_add", member="n4", address=address("n4"))
    assert _reasons(client)["n4"] == "never answered (peer authentication is off: nothing to prove)"
    assert client.call("member_promote", member="n4")["code"] == "BAD_REQUEST"
    # Once it runs and answers, it is promoted as before.
    cluster.join("n4", {n: address(n) for n in ("n1", "n2", "n3")})
    cluster.run_until(lambda: "n4" in cluster["n1"].machine.raft.voters, 3.0, "n4 a voter")
    assert _reasons(client)["n4"] == ""


def test_a_proved_learner_with_auto_promotion_off_says_how_to_promote_it() -> None:
    from dataclasses import replace

    cluster = Cluster(3, peers_authenticated=True)
    cluster.elect("n1")
    leader = cluster["n1"].machine
    leader.membership._config = replace(leader.membership._config, auto_promote=False)
    client = cluster.connect("n1")
    client.call("member_add", member="n4", address=address("n4"))
    cluster.join("n4", {n: address(n) for n in ("n1", "n2", "n3")})
    cluster.run_until(lambda: leader.health.proved("n4"), 3.0, "n4 heard from")
    assert _reasons(client)["n4"] == "auto-promotion is off: dlm members promote n4"
    assert client.call("member_promote", member="n4")["t"] == "ok"
