"""NodeMachine, one rule per test: the whole member's decisions, driven by hand (machine_driver.py).

No sockets, threads or sleeping: time, the network and the disk move only when
a test says so, so each test can stop the world exactly where a rule applies.
"""

from __future__ import annotations

import itertools
from typing import Any

import cbor2
import pytest

from dlm.node import locks
from dlm.node.machine import (
    MAX_BAD_REQUESTS,
    CloseConnection,
    Instant,
    NodeMachine,
    Persist,
    Quotas,
    SendFrame,
    Timing,
)
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    ReadIndexRequest,
    Ready,
    Role,
    VoteResponse,
)
from dlm.node.read_rounds import KEEPALIVE_ROUND_GAP_S
from dlm.wire import BadFrame

from .machine_driver import Client, Cluster, address

# Requests time out well before a leader that hears nobody steps down (0.5 s), so the
# timeout tests see TIMEOUT and NO_QUORUM rather than NOT_LEADER.
SHORT_REQUESTS = Timing(tick_s=0.05, election_ticks=10, heartbeat_ticks=1, request_timeout_s=0.2)


def appends_with_entries(msg: Message) -> bool:
    return isinstance(msg, AppendEntries) and bool(msg.entries)


def started(size: int = 1, **options: Any) -> Cluster:
    cluster = Cluster(size, **options)
    cluster.elect("n1")
    return cluster


# ---------------------------------------------------------------------------
# Proposals and answers
# ---------------------------------------------------------------------------


def test_a_change_is_answered_only_once_its_entry_is_applied() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    rid = client.send("open_lease", lease="L", ttl_ms=5_000)
    index = leader.machine.raft.last_index
    assert client.reply(rid) is None
    assert leader.machine.locks.lease("L") is None
    steps = 0
    while cluster.in_flight:
        cluster.deliver_one(cluster.in_flight.pop(0))
        steps += 1
        if client.reply(rid) is not None:
            assert leader.machine.locks.applied_index >= index
    assert steps > 0
    reply = client.reply(rid)
    assert reply == {"t": "ok", "lease": "L", "ttl_ms": 5_000, "incarnation": index, "id": rid}
    assert leader.machine.locks.lease("L") is not None


@pytest.mark.parametrize(
    "request_fields",
    [
        {"t": "acquire", "lease": "L", "key": "k"},
        {"t": "keepalive", "lease": "L"},
        {"t": "get", "key": "k"},
    ],
)
def test_a_follower_answers_not_leader_with_the_leaders_address(
    request_fields: dict[str, Any],
) -> None:
    cluster = started(3)
    follower = cluster["n2"]
    last = follower.machine.raft.last_index
    client = cluster.connect("n2")
    rid = client.send(**request_fields)
    assert client.reply(rid) == {
        "t": "error",
        "code": "NOT_LEADER",
        "message": "not the leader; try n1",
        "id": rid,
        "leader": "n1",
        "leader_address": address("n1"),
    }
    assert follower.machine.raft.last_index == last
    assert cluster.in_flight == []


# ---------------------------------------------------------------------------
# Bad requests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "rid"),
    [
        ({"t": "warp", "id": 5}, 5),
        ({"t": "acquire", "id": 6, "lease": "L", "key": "k", "seq": "one"}, 6),
        ([1, 2], None),
        ({"t": "ping", "id": 2**63}, None),
        ({"t": "ping", "id": True}, None),
    ],
)
def test_a_bad_request_is_answered_bad_request_with_its_id_when_it_has_one(
    frame: Any, rid: int | None
) -> None:
    cluster = started()
    client = cluster.connect("n1")
    client.send_raw(frame)
    [answer] = client.frames
    assert answer["code"] == "BAD_REQUEST"
    assert answer.get("id") == rid
    assert not client.closed


def test_a_frame_that_is_not_cbor_counts_as_a_bad_request() -> None:
    cluster = started()
    client = cluster.connect("n1")
    for _ in range(MAX_BAD_REQUESTS):
        client.send_raw(BadFrame("frame is not valid CBOR"))
    assert [a["code"] for a in client.frames] == ["BAD_REQUEST"] * MAX_BAD_REQUESTS
    assert not client.closed
    client.send_raw(BadFrame("frame is not valid CBOR"))
    assert client.closed


def test_a_connection_is_closed_after_max_bad_requests() -> None:
    cluster = started()
    member = cluster["n1"]
    client = cluster.connect("n1")
    for i in range(MAX_BAD_REQUESTS):
        client.send_raw({"t": "warp", "id": 1000 + i})
    # Read from the member: mypy would keep client.closed narrowed past the send below.
    assert client.conn not in member.closed
    assert client.call("ping")["t"] == "ok"
    client.send_raw({"t": "warp", "id": 99})
    assert client.closed
    # The refusal of the last one is written before the connection is closed.
    answer = next(a for a in member.order if isinstance(a, SendFrame) and a.frame.get("id") == 99)
    close = next(a for a in member.order if isinstance(a, CloseConnection))
    assert member.order.index(answer) < member.order.index(close)
    # Other connections are not affected.
    assert cluster.connect("n1").call("ping")["t"] == "ok"


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("open_lease", {"lease": "L", "ttl_ms": 999}),
        ("open_lease", {"lease": "L", "ttl_ms": 86_400_001}),
        ("lease_update", {"lease": "L", "ttl_ms": 0}),
    ],
)
def test_a_ttl_outside_the_limits_is_refused_before_it_is_proposed(
    kind: str, fields: dict[str, Any]
) -> None:
    cluster = started()
    member = cluster["n1"]
    last = member.machine.raft.last_index
    client = cluster.connect("n1")
    answer = client.call(kind, **fields)
    assert answer["code"] == "BAD_REQUEST"
    assert "between" in answer["message"]
    assert member.machine.raft.last_index == last


# ---------------------------------------------------------------------------
# Persist before you speak
# ---------------------------------------------------------------------------


def test_a_followers_append_ack_leaves_only_after_its_persist_completes() -> None:
    cluster = started(3)
    follower = cluster["n2"]
    follower.hold_disk = True
    cluster.connect("n1").send("open_lease", lease="L", ttl_ms=5_000)
    index = cluster["n1"].machine.raft.last_index
    cluster.deliver()
    [job] = follower.disk
    assert isinstance(job, Persist) and [e.index for e in job.entries] == [index]

    def acks() -> list[Message]:
        return [
            m
            for m in follower.sent
            if isinstance(m, AppendEntriesResponse) and not m.reject and m.index >= index
        ]

    assert acks() == []
    cluster.write_disk("n2")
    assert len(acks()) == 1
    assert follower.storage.last_index() == index


def test_a_vote_leaves_only_after_the_vote_is_durable() -> None:
    cluster = Cluster(3)
    voter = cluster["n2"]
    voter.hold_disk = True
    # Only n1's timer runs: it pre-votes, then asks for real votes.
    for _ in range(100):
        if voter.disk:
            break
        cluster.advance(cluster.timing.tick_s, only=["n1"])
    job = voter.disk[0]
    assert isinstance(job, Persist) and job.hard_state is not None
    assert job.hard_state.vote == "n1"

    def votes() -> list[VoteResponse]:
        return [m for m in voter.sent if isinstance(m, VoteResponse) and not m.pre_vote]

    assert votes() == []
    cluster.write_disk("n2", 1)
    assert [m.granted for m in votes()] == [True]


def test_persist_jobs_complete_in_order() -> None:
    cluster = started(3)
    follower = cluster["n2"]
    follower.hold_disk = True
    client = cluster.connect("n1")
    client.send("open_lease", lease="A", ttl_ms=5_000)
    cluster.deliver()
    client.send("open_lease", lease="B", ttl_ms=5_000)
    cluster.deliver()
    first, second = follower.disk
    assert isinstance(first, Persist) and isinstance(second, Persist)
    cluster.write(follower, first)
    cluster.write(follower, second)
    follower.disk.clear()
    sent_before = len(follower.sent)
    follower.machine.persisted(second.job, cluster.now())
    cluster.settle(follower)
    assert follower.sent[sent_before:] == []  # job 2 waits for job 1
    follower.machine.persisted(first.job, cluster.now())
    cluster.settle(follower)
    acked = [m.index for m in follower.sent[sent_before:] if isinstance(m, AppendEntriesResponse)]
    assert acked.index(first.entries[-1].index) < acked.index(second.entries[-1].index)


def _leader_appends_before_its_persist(machine_class: type[NodeMachine]) -> tuple[bool, bool]:
    """(whether the leader's append of a new entry left while its own Persist was pending,
    whether any Ready of the leader had messages_now)."""
    readies: list[Ready] = []

    class Recording(machine_class):  # type: ignore[valid-type,misc]
        class raft_class(machine_class.raft_class):  # type: ignore[name-defined,misc]
            def ready(self) -> Ready:
                rd: Ready = super().ready()  # (Any: the base class is a parameter)
                readies.append(rd)
                return rd

    cluster = started(3, machine_class=Recording)
    leader = cluster["n1"]
    leader.hold_disk = True
    cluster.connect("n1").send("open_lease", lease="L", ttl_ms=5_000)
    index = leader.machine.raft.last_index
    assert leader.disk, "the leader's own Persist is pending"
    left = any(
        isinstance(m, AppendEntries) and any(e.index == index for e in m.entries)
        for m in cluster.in_flight
    )
    return left, any(rd.messages_now for rd in readies)


def test_the_leaders_appends_leave_before_its_own_persist_completes() -> None:
    left_early, had_now = _leader_appends_before_its_persist(NodeMachine)
    assert had_now and left_early


# ---------------------------------------------------------------------------
# Keep-alives
# ---------------------------------------------------------------------------


def test_a_keepalive_is_answered_after_a_read_round_confirms_leadership() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=10_000)
    cluster.advance(3.0)
    rid = client.send("keepalive", lease="L")
    assert client.reply(rid) is None
    confirming = [m for m in cluster.in_flight if isinstance(m, Heartbeat) and m.ctx]
    assert confirming, "a heartbeat round carries the read's context"
    cluster.deliver()
    assert client.reply(rid) == {"t": "ok", "lease": "L", "ttl_ms": 10_000, "id": rid}
    assert leader.machine.tracker.remaining_ms("L", cluster.mono) == pytest.approx(10_000, abs=1)


def test_a_keepalive_is_never_confirmed_by_a_round_that_began_before_it_arrived() -> None:
    # A round that started before the keep-alive arrived proves nothing about leadership
    # at the moment it arrived: a newer leader may already have been elected by then.
    cluster = started(3)
    first, second = cluster.connect("n1"), cluster.connect("n1")
    first.call("open_lease", lease="A", ttl_ms=10_000)
    second.call("open_lease", lease="B", ttl_ms=10_000)
    cluster.advance(1.0)
    early = first.send("keepalive", lease="A")
    round_ctx = {m.ctx for m in cluster.in_flight if isinstance(m, Heartbeat) and m.ctx}
    assert len(round_ctx) == 1, "the keep-alive starts one heartbeat round"
    late = second.send("keepalive", lease="B")
    # Only the first round's heartbeats and their answers get through.
    cluster.blocked = lambda m: (
        isinstance(m, Heartbeat | HeartbeatResponse) and (m.ctx not in (b"", *round_ctx))
    )
    cluster.deliver()
    answer = first.reply(early)
    assert answer is not None and answer["t"] == "ok"
    assert second.reply(late) is None, "answered from a round that began before it arrived"
    cluster.blocked = lambda m: False
    assert second.wait(late)["t"] == "ok"


def test_keepalives_that_arrive_during_a_round_share_the_next_one() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    clients = [cluster.connect("n1") for _ in range(10)]
    for i, client in enumerate(clients):
        client.call("open_lease", lease=f"L{i}", ttl_ms=10_000)
    cluster.advance(1.0)
    sent_before = len(leader.sent)
    rids = [client.send("keepalive", lease=f"L{i}") for i, client in enumerate(clients)]
    cluster.deliver()
    cluster.deliver()
    # The nine that came while the first one's round ran wait out the gap after it.
    cluster.advance(KEEPALIVE_ROUND_GAP_S)
    answers = [c.reply(r) for c, r in zip(clients, rids, strict=True)]
    assert all(a is not None and a["t"] == "ok" for a in answers)
    rounds = {m.ctx for m in leader.sent[sent_before:] if isinstance(m, Heartbeat) and m.ctx}
    # The first keep-alive's round, then one round for the nine that came while it ran.
    assert len(rounds) == 2


def test_keepalives_in_quick_succession_share_a_round_after_the_gap() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    clients = [cluster.connect("n1") for _ in range(5)]
    for i, client in enumerate(clients):
        client.call("open_lease", lease=f"L{i}", ttl_ms=10_000)
    cluster.advance(1.0)
    sent_before = len(leader.sent)
    first = clients[0].call("keepalive", lease="L0")  # its round: sent, confirmed, answered
    assert first["t"] == "ok"
    rids = [c.send("keepalive", lease=f"L{i + 1}") for i, c in enumerate(clients[1:])]
    cluster.deliver()
    cluster.deliver()
    assert all(c.reply(r) is None for c, r in zip(clients[1:], rids, strict=True))
    cluster.advance(KEEPALIVE_ROUND_GAP_S)  # the machine's timer comes when the gap ends
    answers = [c.reply(r) for c, r in zip(clients[1:], rids, strict=True)]
    assert all(a is not None and a["t"] == "ok" for a in answers)
    rounds = {m.ctx for m in leader.sent[sent_before:] if isinstance(m, Heartbeat) and m.ctx}
    assert len(rounds) == 2


def test_asking_whether_to_pump_after_each_frame_keeps_one_append_per_follower() -> None:
    """The runtime asks ``needs_pump`` after every client frame of a loop turn (server.py,
    client_data). Asking must not send anything: the writes of all the turn's frames
    then go to each follower in one append, as one pump of them all would send them
    (a question that flushed sent an append per frame, and as many answers back)."""
    cluster = started(3)
    leader = cluster["n1"]
    machine = leader.machine
    clients = [cluster.connect("n1") for _ in range(4)]
    cluster.advance(1.0)
    sent_before = len(leader.sent)
    for i, client in enumerate(clients):
        frame = {
            "t": "open_lease",
            "id": 1,
            "lease": f"L{i}",
            "ttl_ms": 10_000,
            "client": f"c{i}",
            "seq": 1,
        }
        machine.client_frame(client.conn, frame, cluster.now(), pump=False)
        assert machine.needs_pump(cluster.now()), "a write waits to be sent"
    machine.pump(cluster.now())
    cluster.settle(leader)
    appends = [m for m in leader.sent[sent_before:] if isinstance(m, AppendEntries)]
    assert sorted(m.dst for m in appends) == ["n2", "n3"], appends
    assert all(len(m.entries) == len(clients) for m in appends)
    cluster.deliver()
    for client in clients:
        assert client.wait(1)["t"] == "ok"


def test_keepalives_waiting_for_their_round_leave_the_pump_nothing_to_do() -> None:
    """The runtime skips its pump turn when ``needs_pump`` says so (server.py,
    client_data): a keep-alive inside the gap, or behind an open round, needs none (the
    timer or the round's confirmation pumps); an answer, a change or a due round does."""
    cluster = started(3)
    leader = cluster["n1"]
    machine = leader.machine
    clients = [cluster.connect("n1") for _ in range(4)]
    for i, client in enumerate(clients):
        client.call("open_lease", lease=f"L{i}", ttl_ms=10_000)
    cluster.advance(1.0)
    assert not machine.needs_pump(cluster.now())
    assert clients[0].call("keepalive", lease="L0")["t"] == "ok"  # its round: just now

    def keepalive(client: Client, rid: int) -> None:
        frame = {"t": "keepalive", "id": rid, "lease": f"L{clients.index(client)}"}
        machine.client_frame(client.conn, frame, cluster.now(), pump=False)

    keepalive(clients[1], 901)
    assert not machine.needs_pump(cluster.now()), "inside the gap: the timer starts it"
    gap_over = machine.next_timer()
    assert gap_over <= cluster.now().mono + KEEPALIVE_ROUND_GAP_S
    assert machine.needs_pump(Instant(gap_over, cluster.now().wall_ms)), "the gap is over"
    machine.client_frame(clients[2].conn, {"t": "ping", "id": 902}, cluster.now(), pump=False)
    assert machine.needs_pump(cluster.now()), "the ping's answer waits to be taken"
    cluster.settle(leader)
    assert clients[2].reply(902) is not None
    # The gap ends: the timer starts the round; its heartbeats are not delivered yet.
    cluster.mono = gap_over
    machine.timer(cluster.now())
    cluster.settle(leader)
    assert clients[1].reply(901) is None
    keepalive(clients[3], 903)
    cluster.mono += KEEPALIVE_ROUND_GAP_S * 2
    assert not machine.needs_pump(cluster.now()), "behind an open round: its answer pumps"
    machine.client_frame(
        clients[2].conn,
        {"t": "open_lease", "id": 904, "lease": "M", "ttl_ms": 10_000, "client": "c", "seq": 1},
        cluster.now(),
        pump=False,
    )
    assert machine.needs_pump(cluster.now()), "a change is proposed at once"
    cluster.settle(leader)
    assert clients[1].wait(901)["t"] == "ok"
    assert clients[3].wait(903)["t"] == "ok"


def test_a_keepalive_for_a_lease_whose_expire_is_proposed_is_refused() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=1_000)
    cluster.blocked = appends_with_entries  # the Expire cannot commit; heartbeats still flow
    cluster.advance(1.1)
    assert "lease_deadline_passed" in leader.event_names()
    assert leader.machine.locks.lease("L") is not None  # not expired yet: only proposed
    answer = client.call("keepalive", lease="L")
    assert answer["code"] == "SESSION_EXPIRED"
    assert answer["ended"] == "expired"
    # Nor may a client join it and count a fresh TTL.
    assert client.call("open_lease", lease="L", ttl_ms=1_000)["code"] == "SESSION_EXPIRED"


@pytest.mark.parametrize("finished", [False, True], ids=["update", "finished"])
def test_a_ttl_update_applied_after_the_leases_expire_is_proposed_is_refused(
    finished: bool,
) -> None:
    """The update is in the log before the Expire, so it is applied (the lease is still
    live) but cannot restart the lease's clock: confirming it would promise a TTL that
    ends when the Expire commits, right after (``dlm exec --min-hold`` would report a
    hold handed over that does not last)."""
    cluster = started(3)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=1_000)
    cluster.blocked = appends_with_entries  # nothing commits; heartbeats still flow
    cluster.advance(0.9)
    rid = client.send("lease_update", lease="L", ttl_ms=5_000, finished=finished)
    cluster.advance(0.2)
    assert "lease_deadline_passed" in leader.event_names()  # the Expire is proposed
    assert client.reply(rid) is None
    cluster.blocked = lambda m: False
    answer = client.wait(rid)
    assert answer.get("code") == "SESSION_EXPIRED", answer  # not "ok"
    assert answer["ended"] == "expired"
    cluster.run_until(lambda: leader.machine.locks.lease("L") is None, 2.0, "L expires")
    # A copy of the update sent now finds the lease gone.
    assert client.call("lease_update", lease="L", ttl_ms=5_000)["code"] == "SESSION_EXPIRED"


def test_a_ttl_update_of_a_lease_whose_expire_is_proposed_is_refused_unproposed() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=1_000)
    cluster.blocked = appends_with_entries
    cluster.advance(1.1)
    assert "lease_deadline_passed" in leader.event_names()
    last = leader.machine.raft.last_index
    for request, fields in (
        ("lease_update", {"ttl_ms": 5_000, "finished": True}),
        ("acquire", {"key": "k"}),
    ):
        answer = client.call(request, lease="L", **fields)
        assert answer.get("code") == "SESSION_EXPIRED", (request, answer)
        assert answer["ended"] == "expired"
    assert leader.machine.raft.last_index == last  # nothing proposed for a doomed lease


# ---------------------------------------------------------------------------
# The leader's lease clock
# ---------------------------------------------------------------------------


def test_a_new_leader_gives_every_live_lease_a_full_ttl() -> None:
    cluster = started(3)
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=10_000)
    cluster.advance(6.0)
    old = cluster["n1"].machine.tracker.remaining_ms("L", cluster.mono)
    assert old is not None and old < 4_500
    assert cluster["n2"].machine.tracker.remaining_ms("L", cluster.mono) is None  # followers
    cluster["n1"].machine.raft.transfer_leadership("n2")
    cluster.settle(cluster["n1"])
    cluster.run_until(lambda: cluster["n2"].role is Role.LEADER, 2.0, "n2 takes office")
    remaining = cluster["n2"].machine.tracker.remaining_ms("L", cluster.mono)
    assert remaining is not None and remaining >= 10_000 - 1_000 * cluster.timing.tick_s - 1


def test_an_expired_lease_is_proposed_as_expire_with_its_incarnation() -> None:
    cluster = started()
    member = cluster["n1"]
    client = cluster.connect("n1")
    incarnation = client.call("open_lease", lease="L", ttl_ms=1_000)["incarnation"]
    opened = cluster.now()
    cluster.advance(0.95)
    assert "expire2" not in member.command_names()
    cluster.advance(0.1)
    [expire] = [c for c in member.commands() if c[0] == "expire2"]
    lease, proposed_incarnation, at_ms = expire[1:]
    assert (lease, proposed_incarnation) == ("L", incarnation)
    assert at_ms - opened.wall_ms >= 1_000
    assert member.machine.locks.lease("L") is None


# ---------------------------------------------------------------------------
# Grant pushes
# ---------------------------------------------------------------------------


WAITER_SEQ = 10


def _holder_and_waiter(cluster: Cluster) -> tuple[Client, Client]:
    """Lease "a" holds "k" on one connection; lease "b" waits for it on another."""
    holder, waiter = cluster.connect("n1"), cluster.connect("n1")
    holder.call("open_lease", lease="a", ttl_ms=10_000)
    waiter.call("open_lease", lease="b", ttl_ms=10_000)
    holder.call("acquire", lease="a", key="k")
    queued = waiter.call("acquire", lease="b", key="k", wait=True, seq=WAITER_SEQ)
    assert (queued["result"], queued["position"]) == ("queued", 1)
    return holder, waiter


def test_a_grant_is_pushed_to_the_waiting_connection_and_nowhere_else() -> None:
    cluster = started()
    holder, waiter = _holder_and_waiter(cluster)
    bystander = cluster.connect("n1")
    bystander.call("ping")
    released = holder.call("release", lease="a", key="k")
    token = cluster["n1"].machine.raft.last_index
    assert released["released"] == "lock"
    assert waiter.pushes == [{"t": "grant", "lease": "b", "key": "k", "token": token}]
    assert holder.pushes == [] and bystander.pushes == []


def test_no_grant_is_pushed_to_a_connection_that_closed() -> None:
    cluster = started()
    member = cluster["n1"]
    holder, waiter = _holder_and_waiter(cluster)
    waiter.close()
    frames_before = len(member.order)
    holder.call("release", lease="a", key="k")
    after = member.order[frames_before:]
    assert not [a for a in after if isinstance(a, SendFrame) and a.conn == waiter.conn]
    # The wait was replicated, not the connection: the lease got the lock, and the same
    # acquire re-sent on a new connection is answered with the grant.
    state = member.machine.locks.get("k")
    assert state is not None and [h.lease for h in state.holders] == ["b"]
    again = cluster.connect("n1")
    answer = again.call(
        "acquire", lease="b", key="k", wait=True, client=waiter.client_id, seq=WAITER_SEQ
    )
    assert (answer["result"], answer["token"]) == ("granted", state.holders[0].token)


def test_a_leader_cut_off_from_the_others_closes_its_waiters_so_they_ask_the_new_one() -> None:
    """Chaos seed 0: n1 queued a waiter, then lost the others. The new leader's commit grants
    the lock, which n1 never applies: unless n1 sends its waiter away when it steps down,
    the client waits out its whole wait while it holds the lock elsewhere."""
    cluster = started(3)
    holder, waiter = _holder_and_waiter(cluster)
    cluster.blocked = lambda msg: "n1" in (msg.src, msg.dst)
    cluster.run_until(lambda: cluster["n1"].role is not Role.LEADER, 10.0, "n1 steps down")
    assert waiter.closed and not holder.closed
    assert waiter.pushes == []
    cluster.run_until(
        lambda: any(cluster[n].role is Role.LEADER for n in ("n2", "n3")), 10.0, "a new leader"
    )
    new_leader = next(n for n in ("n2", "n3") if cluster[n].role is Role.LEADER)
    again = Client(cluster, cluster[new_leader], 99)
    answer = again.call(
        "acquire", lease="b", key="k", wait=True, client=waiter.client_id, seq=WAITER_SEQ
    )
    assert answer["result"] == "queued"  # the re-sent acquire keeps its place


# ---------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------


def test_a_stale_status_read_on_a_follower_is_answered_from_its_own_state() -> None:
    cluster = started(3)
    behind = cluster["n2"]
    cluster.blocked = lambda m: m.dst == "n2" and isinstance(m, AppendEntries)
    cluster.connect("n1").call("open_lease", lease="L", ttl_ms=5_000)
    assert cluster["n1"].machine.locks.applied_index > behind.machine.locks.applied_index
    client = cluster.connect("n2")
    rid = client.send("status", stale=True)
    answer = client.reply(rid)
    assert answer is not None
    assert (answer["node"], answer["role"], answer["leader"]) == ("n2", "follower", "n1")
    assert answer["applied"] == behind.machine.locks.applied_index
    assert answer["sessions"] == 0
    assert not [m for m in cluster.in_flight if m.src == "n2"]


def test_a_linearizable_status_read_on_a_follower_waits_until_it_applied_the_read_index() -> None:
    cluster = started(3)
    behind = cluster["n2"]
    cluster.blocked = lambda m: m.dst == "n2" and isinstance(m, AppendEntries)
    cluster.connect("n1").call("open_lease", lease="L", ttl_ms=5_000)
    commit = cluster["n1"].machine.raft.commit_index
    assert behind.machine.locks.applied_index < commit
    client = cluster.connect("n2")
    rid = client.send("status")
    assert any(isinstance(m, ReadIndexRequest) for m in cluster.in_flight)
    cluster.deliver()  # the leader confirms the read point; n2 still lacks the entries
    assert client.reply(rid) is None
    cluster.blocked = lambda m: False
    answer = client.wait(rid)
    assert answer["applied"] >= commit
    assert answer["sessions"] == 1


# ---------------------------------------------------------------------------
# Requests that take too long
# ---------------------------------------------------------------------------


def test_a_proposal_not_committed_in_time_gets_timeout() -> None:
    cluster = started(3, timing=SHORT_REQUESTS)
    cluster.blocked = appends_with_entries
    client = cluster.connect("n1")
    rid = client.send("open_lease", lease="L", ttl_ms=5_000)
    cluster.advance(0.25)
    assert cluster["n1"].role is Role.LEADER
    answer = client.reply(rid)
    assert answer is not None and answer["code"] == "TIMEOUT"


def test_a_leaders_read_not_confirmed_in_time_gets_no_quorum() -> None:
    cluster = started(3, timing=SHORT_REQUESTS)
    cluster.blocked = lambda m: m.src == "n1"
    client = cluster.connect("n1")
    rid = client.send("status")
    cluster.advance(0.25)
    assert cluster["n1"].role is Role.LEADER
    answer = client.reply(rid)
    assert answer is not None and answer["code"] == "NO_QUORUM"
    assert answer["retry_after_ms"] > 0


def test_a_followers_read_not_confirmed_in_time_gets_timeout() -> None:
    cluster = started(3, timing=SHORT_REQUESTS)
    cluster.blocked = lambda m: isinstance(m, ReadIndexRequest)
    client = cluster.connect("n2")
    rid = client.send("status")
    cluster.advance(0.25)
    answer = client.reply(rid)
    assert answer is not None and answer["code"] == "TIMEOUT"


# ---------------------------------------------------------------------------
# Quotas
# ---------------------------------------------------------------------------


def test_leases_beyond_the_quota_are_refused_quota_exceeded() -> None:
    cluster = started(quotas=Quotas(max_leases=1))
    client = cluster.connect("n1")
    client.call("open_lease", lease="A", ttl_ms=5_000)
    refused = client.call("open_lease", lease="B", ttl_ms=5_000)
    assert (refused["code"], refused["limit"]) == ("QUOTA_EXCEEDED", "max_leases")
    assert "--max-leases" in refused["message"]
    # Joining a lease that exists adds nothing.
    assert client.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"


def test_locks_and_waiters_beyond_the_quota_are_refused_quota_exceeded() -> None:
    cluster = started(quotas=Quotas(max_locks=2))
    client = cluster.connect("n1")
    for lease in ("A", "B", "C"):
        client.call("open_lease", lease=lease, ttl_ms=5_000)
    client.call("acquire", lease="A", key="k")
    assert client.call("acquire", lease="B", key="k", wait=True)["result"] == "queued"
    refused = client.call("acquire", lease="C", key="other")
    assert (refused["code"], refused["limit"]) == ("QUOTA_EXCEEDED", "max_locks")


@pytest.mark.parametrize("kind", ["open_lease", "acquire"])
def test_owner_metadata_beyond_the_quota_is_refused_quota_exceeded(kind: str) -> None:
    cluster = started(quotas=Quotas(max_meta_bytes=8))
    client = cluster.connect("n1")
    client.call("open_lease", lease="A", ttl_ms=5_000, meta={"h": "1234567"})  # 8 bytes: fine
    fields: dict[str, Any] = {"lease": "B", "ttl_ms": 5_000}
    if kind == "acquire":
        fields = {"lease": "A", "key": "k"}
    refused = client.call(kind, meta={"host": "abcde"}, **fields)
    assert (refused["code"], refused["limit"]) == ("QUOTA_EXCEEDED", "max_meta_bytes")


@pytest.mark.parametrize("second_seq", [50, 51], ids=["re-sent", "re-entrant"])
def test_an_acquire_of_a_key_the_lease_holds_is_answered_granted_even_at_the_lock_quota(
    second_seq: int,
) -> None:
    # A re-sent acquire (its answer was lost) and a second acquire of the same key under
    # the same lease add nothing: both get the grant and its token (PROTOCOL.md).
    cluster = started(quotas=Quotas(max_locks=1))
    client = cluster.connect("n1")
    client.call("open_lease", lease="A", ttl_ms=5_000)
    granted = client.call("acquire", lease="A", key="k", seq=50)
    assert granted["result"] == "granted"
    again = client.call("acquire", lease="A", key="k", seq=second_seq)
    assert (again.get("result"), again.get("token")) == ("granted", granted["token"])


# ---------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------


def test_the_cluster_version_rises_only_after_every_member_reported_version_2() -> None:
    cluster = started(3, peer_version=None)
    leader = cluster["n1"]
    cluster.advance(5.0)
    assert leader.machine.locks.version == 1
    leader.machine.peer_version("n2", 2)
    cluster.advance(5.0)
    assert leader.machine.locks.version == 1
    assert "version" not in leader.command_names()
    leader.machine.peer_version("n3", 2)
    cluster.advance(cluster.timing.tick_s * 3)
    assert leader.command_names().count("version") == 1
    assert [m.machine.locks.version for m in cluster.members.values()] == [2, 2, 2]


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("release", {"lease": "L", "key": "k", "token": 3}),
        ("lease_update", {"lease": "L", "ttl_ms": 5_000}),
    ],
)
def test_before_version_2_requests_that_need_it_are_refused_unavailable(
    kind: str, fields: dict[str, Any]
) -> None:
    cluster = started(3, peer_version=None)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=5_000)
    client.call("acquire", lease="L", key="k")
    last = leader.machine.raft.last_index
    refused = client.call(kind, **fields)
    assert refused["code"] == "UNAVAILABLE"
    assert "upgrade" in refused["message"] and refused["retry_after_ms"] > 0
    assert leader.machine.raft.last_index == last


def test_before_version_2_commands_are_written_in_their_version_1_form() -> None:
    cluster = started(3, peer_version=None)
    leader = cluster["n1"]
    client = cluster.connect("n1")
    at = cluster.now().wall_ms
    client.call("open_lease", lease="L", ttl_ms=5_000, ephemeral=True, meta={"host": "h"})
    client.call("acquire", lease="L", key="k", seq=77)
    client.call("release", lease="L", key="k", seq=78)
    assert leader.commands() == [
        ["open", "L", 5_000, at],
        ["acquire", "L", 77, "k", False, 1, {}, at],
        ["release", "L", 78, "k", at],
    ]
    # Byte for byte what the previous release writes (it decodes nothing else).
    first = leader.storage.entries(leader.storage.first_index(), leader.storage.last_index() + 1)
    datas = [e.data for e in first if e.data]
    assert datas[0] == cbor2.dumps(["open", "L", 5_000, at], canonical=True)
    for member in cluster.members.values():
        member.machine.peer_version("n2", 2)
        member.machine.peer_version("n3", 2)
    cluster.advance(cluster.timing.tick_s * 3)
    client.call("acquire", lease="L", key="k2")
    assert leader.command_names()[-2:] == ["version", "acquire2"]


# ---------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------


def _fill(cluster: Cluster, count: int) -> None:
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=60_000, meta={"host": "h"})
    for i in range(count):
        client.call("acquire", lease="L", key=f"k{i}")


def test_a_snapshot_is_taken_every_snapshot_every_applied_entries() -> None:
    cluster = started(snapshot_every=5, snapshot_keep=2)
    member = cluster["n1"]
    _fill(cluster, 12)
    indexes = [s.index for s in member.snapshots]
    assert len(indexes) >= 2
    assert all(later - earlier >= 5 for earlier, later in itertools.pairwise(indexes))
    assert member.machine.locks.applied_index - indexes[-1] < 5
    assert all(s.compact_to == s.index - 2 for s in member.snapshots)
    assert member.storage.first_index() == indexes[-1] - 2 + 1


def test_a_version_2_snapshot_wraps_the_lock_image_with_the_members_and_restores() -> None:
    cluster = started(snapshot_every=5)
    _fill(cluster, 6)
    before = cluster["n1"]
    [snap, *_] = before.snapshots
    image = cbor2.loads(snap.data)
    assert image["format"] == 2 and image["members"] == {"n1": address("n1")}
    assert isinstance(image["locks"], bytes)
    # Addresses come from the image, not the flags of the restarted process.
    after = cluster.restart("n1", {"n1": "elsewhere:1"})
    assert after.machine.address_of("n1") == address("n1")
    assert after.machine.locks.applied_index == before.machine.locks.applied_index
    assert after.machine.locks.snapshot() == before.machine.locks.snapshot()


def test_a_version_1_snapshot_is_the_bare_lock_image_and_restores() -> None:
    cluster = started(snapshot_every=5, max_version=1)
    _fill(cluster, 6)
    before = cluster["n1"]
    assert before.machine.locks.version == 1
    [snap, *_] = before.snapshots
    image = cbor2.loads(snap.data)
    assert isinstance(image, list)  # what a member of the previous release restores
    assert locks.LockStateMachine.restore(snap.data).applied_index == snap.index
    after = cluster.restart("n1")
    assert after.machine.locks.applied_index == before.machine.locks.applied_index
    assert after.machine.locks.snapshot() == before.machine.locks.snapshot()


# ---------------------------------------------------------------------------
# Stopping
# ---------------------------------------------------------------------------


def test_begin_shutdown_hands_leadership_to_the_most_caught_up_voter() -> None:
    cluster = started(3)
    cluster.blocked = lambda m: m.dst == "n2" and appends_with_entries(m)
    cluster.connect("n1").call("open_lease", lease="L", ttl_ms=5_000)
    cluster.advance(cluster.timing.tick_s * 2)
    cluster.blocked = lambda m: False
    leader = cluster["n1"]
    leader.machine.begin_shutdown(cluster.now())
    cluster.settle(leader)
    assert leader.machine.raft.lead_transferee == "n3"
    assert leader.machine.transferring
    cluster.run_until(lambda: cluster["n3"].role is Role.LEADER, 2.0, "n3 takes over")
    assert leader.role is Role.FOLLOWER and not leader.machine.transferring


def test_a_stopping_member_refuses_new_requests_with_shutting_down() -> None:
    cluster = started()
    member = cluster["n1"]
    client = cluster.connect("n1")
    member.machine.begin_shutdown(cluster.now())
    cluster.settle(member)
    last = member.machine.raft.last_index
    for kind, fields in [("ping", {}), ("open_lease", {"lease": "L", "ttl_ms": 5_000})]:
        rid = client.send(kind, **fields)
        reply = client.reply(rid)
        assert reply is not None and reply["code"] == "SHUTTING_DOWN"
    assert member.machine.raft.last_index == last


def test_finish_shutdown_answers_everything_pending_with_shutting_down() -> None:
    cluster = started(3)
    leader = cluster["n1"]
    cluster.blocked = lambda m: m.src == "n1"
    client = cluster.connect("n1")
    proposal = client.send("open_lease", lease="L", ttl_ms=5_000)
    read = client.send("status")
    leader.machine.begin_shutdown(cluster.now())
    cluster.settle(leader)
    assert client.reply(proposal) is None and client.reply(read) is None
    leader.machine.finish_shutdown()
    cluster.settle(leader)
    for rid in (proposal, read):
        answer = client.reply(rid)
        assert answer is not None and answer["code"] == "SHUTTING_DOWN"
    assert not leader.machine.proposals.pending and not leader.machine.reads.rounds


# ---------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("link", "src", "dst"),
    [("n2", "n3", "n1"), ("n2", "n2", "n3"), ("n9", "n9", "n1")],
    ids=["another-sender", "another-destination", "not-a-member"],
)
def test_peer_messages_claiming_another_sender_are_refused(link: str, src: str, dst: str) -> None:
    cluster = Cluster(3)
    member = cluster["n1"]
    forged = Heartbeat(group=0, term=5, src=src, dst=dst, commit=0)
    member.machine.peer_messages(link, (forged,), cluster.now())
    cluster.settle(member)
    assert member.machine.raft.term == 0
    assert member.machine.leader is None
    assert "peer_message_refused" in member.event_names()
    assert member.machine.stats.rejected_frames == 1
    assert not any(isinstance(m, HeartbeatResponse) for m in member.sent)


def test_a_peer_hello_is_refused_for_self_strangers_and_old_members_of_a_version_2_cluster() -> (
    None
):
    cluster = started(3)
    machine = cluster["n1"].machine
    assert machine.accept_peer("n2", 2) is None
    assert machine.accept_peer("n2", 1) is not None  # the cluster already runs version 2
    assert "own id" in (machine.accept_peer("n1", 2) or "")
    assert "not a member" in (machine.accept_peer("n9", 2) or "")
    old = started(3, peer_version=None)["n1"].machine
    assert old.accept_peer("n2", 1) is None


def test_a_gone_lease_is_answered_with_how_it_ended() -> None:
    """SESSION_EXPIRED carries ``ended``: "expired" only for a lease whose TTL ran out."""
    cluster = started(3)
    client = cluster.connect("n1")
    client.call("open_lease", lease="closed", ttl_ms=10_000)
    client.call("close_lease", lease="closed")
    client.call("open_lease", lease="expired", ttl_ms=1_000)
    cluster.advance(2.0)
    assert cluster["n1"].machine.locks.lease("expired") is None
    for lease, ended in (("closed", "closed"), ("expired", "expired"), ("never", "unknown")):
        for kind, fields in (
            ("keepalive", {}),
            ("acquire", {"key": "k"}),
            ("lease_update", {"ttl_ms": 5_000}),
        ):
            answer = client.call(kind, lease=lease, **fields)
            assert answer["code"] == "SESSION_EXPIRED", (kind, answer)
            assert answer["ended"] == ended, (kind, lease, answer)
            assert ("expired" in answer["message"]) == (ended == "expired"), answer
