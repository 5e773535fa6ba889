"""A small seeded fault run of the core alone, as a smoke test before the full simulator.

Messages are delayed, reordered, duplicated and dropped; members are cut off,
restarted and compact their logs into snapshots. After every step we check
election safety and that every member applies the same entry at each index;
after the faults stop, a leader must appear and commit a fresh proposal.
"""

from __future__ import annotations

import random

import pytest

from dlm.node.raft.types import Message, Role
from dlm.records import ConfState, Entry

from .harness import Net


def run(
    seed: int,
    members: int = 5,
    ticks: int = 400,
    *,
    pre_vote: bool = True,
    check_quorum: bool = True,
) -> None:
    rng = random.Random(seed)
    net = Net(
        members,
        seed=seed,
        max_inflight=4,
        snapshot_chunk_bytes=7,
        max_entries_bytes=64,
        pre_vote=pre_vote,
        check_quorum=check_quorum,
    )
    in_flight: list[tuple[int, int, Message]] = []  # (deliver_at, tie-break, msg)
    applied: dict[int, Entry] = {}
    leaders: dict[int, str] = {}
    seq = 0
    proposals = 0

    def check() -> None:
        for n, node in net.nodes.items():
            if node.role is Role.LEADER:
                assert leaders.setdefault(node.term, n) == n, f"two leaders in term {node.term}"
            for e in net.applied[n]:
                assert applied.setdefault(e.index, e) == e, f"{n} applied a different entry"
            net.applied[n].clear()

    def pump(now: int, faulty: bool) -> None:
        nonlocal seq
        net.persist_all()
        while net.queue:
            m = net.queue.popleft()
            if (m.src, m.dst) in net.cut:
                continue
            copies = 1
            if faulty:
                if rng.random() < 0.1:
                    continue
                if rng.random() < 0.05:
                    copies = 2
            for _ in range(copies):
                delay = rng.randint(0, 3) if faulty else 0
                seq += 1
                in_flight.append((now + delay, seq, m))

    def deliver(now: int) -> None:
        due = sorted(x for x in in_flight if x[0] <= now)
        in_flight[:] = [x for x in in_flight if x[0] > now]
        for _, _, m in due:
            if m.dst in net.nodes and (m.src, m.dst) not in net.cut:
                net.nodes[m.dst].step(m)
                net.persist(m.dst)
                check()

    for now in range(ticks):
        faulty = now < ticks - 100
        if faulty:
            roll = rng.random()
            victim = rng.choice(net.voters)
            if roll < 0.02:
                net.isolate(net.leader() or victim)
            elif roll < 0.03:
                net.isolate(victim)
            elif roll < 0.05:
                net.cut.clear()
            elif roll < 0.07:
                net.restart(victim)
                in_flight[:] = [x for x in in_flight if victim not in (x[2].src, x[2].dst)]
            elif roll < 0.10:
                node = net.nodes[victim]
                storage = net.storages[victim]
                index = node.applied_index
                snap = storage.snapshot()
                if index > (snap.meta.index if snap else 0) + 3:
                    storage.create_snapshot(index, ConfState(net.voters), b"image@%d" % index)
                    storage.compact(index - 1)
        else:
            net.cut.clear()
        for node in net.nodes.values():
            node.tick()
            if node.role is Role.LEADER and rng.random() < 0.5:
                for _ in range(rng.randint(1, 3)):
                    proposals += 1
                    node.propose(b"p%d" % proposals)
        pump(now, faulty)
        deliver(now)
        pump(now, faulty)
        check()

    leader = net.leader()
    assert leader is not None, f"seed {seed}: no leader after faults healed"
    final_index = net.nodes[leader].propose(b"final")
    assert isinstance(final_index, int)
    for now in range(ticks, ticks + 60):
        for node in net.nodes.values():
            node.tick()
        pump(now, False)
        deliver(now)
        check()
        if final_index in applied and all(
            n.commit_index >= final_index for n in net.nodes.values()
        ):
            break
    final = applied.get(final_index)
    assert final is not None and final.data == b"final", f"seed {seed}"


@pytest.mark.parametrize("seed", range(12))
def test_random_faults_keep_safety_and_recover(seed: int) -> None:
    run(seed)


def test_random_faults_three_members() -> None:
    for seed in range(100, 106):
        run(seed, members=3)


def test_random_faults_plain_raft_without_pre_vote_or_check_quorum() -> None:
    for seed in range(200, 206):
        run(seed, members=3, pre_vote=False, check_quorum=False)
