"""dlm.testing against real members: a client sees a failover, a killed member comes back,
a cut link takes a client's lock away while the cluster stays healthy, and nothing the
cluster started outlives its ``with`` block, also when the block raises."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

import dlm
import dlm.testing
from dlm.testing.processes import Cluster, Member

pytestmark = pytest.mark.cluster

WAIT_S = 20.0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_client_holding_a_lock_sees_the_leader_killed_and_goes_on() -> None:
    with dlm.testing.cluster(3) as c, c.client(timeout=WAIT_S) as client:
        with client.lock("report", ttl="30s") as lock:
            first = lock.token
            old = c.kill_leader()
            assert not old.alive and old.pid is None
            new = c.wait_for_leader(WAIT_S, not_=old)
            assert new is not old
            # The grant survived the failover, under the same token.
            with c.raw_client(timeout=WAIT_S) as raw:
                holders = raw.get("report").holders
            assert [(h.lease, h.token) for h in holders] == [(lock.lease, first)]
            lock.check()
        with client.lock("report", ttl="30s") as again:
            assert again.token > first


def test_a_killed_member_restarts_on_its_address_and_rejoins() -> None:
    with dlm.testing.cluster(3) as c, c.client(timeout=WAIT_S) as client:
        leader = c.wait_for_leader(WAIT_S)
        follower = next(m for m in c.members if m is not leader)
        address, pid = follower.address, follower.pid
        c.kill(follower)
        assert pid is not None and _gone(pid)
        held = client.lock("while-down", ttl="30s")
        assert held.acquire()
        c.restart(follower)
        assert follower.alive and follower.address == address and follower.pid != pid
        # With the other follower killed, the cluster can only go on with the restarted one.
        other = next(m for m in c.members if m not in (leader, follower))
        c.kill(other)
        with client.lock("after-restart", ttl="30s") as later:
            assert later.token > held.token
        assert client.lock("while-down", ttl="30s", wait=0).acquire(blocking=False) is False
        held.release()


def test_a_paused_leader_is_replaced_and_resumes_as_a_follower() -> None:
    with dlm.testing.cluster(3) as c:
        old = c.wait_for_leader(WAIT_S)
        c.pause(old)
        new = c.wait_for_leader(WAIT_S, not_=old)
        assert new is not old
        c.resume(old)
        with c.raw_client(timeout=WAIT_S) as client:
            lease = client.open_lease(10_000)
            client.acquire(lease, "after-pause")
            new_term = client.status().term or 0

            def caught_up() -> bool:
                view = client.member_status(old.address, timeout=1.0)
                return view is not None and (view.term or 0) >= new_term

            deadline = time.monotonic() + WAIT_S
            while not caught_up():
                assert time.monotonic() < deadline, f"{old.name} never learned the new term"
                time.sleep(0.05)


def test_cutting_a_link_loses_its_clients_lock_while_the_cluster_stays_healthy() -> None:
    with dlm.testing.cluster(3) as c:
        leader = _not_the_first_member_leading(c)
        link = c.link()
        told = threading.Event()
        with link.client(timeout=5.0) as cut_off, c.client(timeout=WAIT_S) as other:
            lock = cut_off.lock("job", ttl="2s", on_lost=lambda _lock: told.set())
            assert lock.acquire()
            _renewed(lock)  # by then the renewals have been redirected to the leader
            link.cut()
            assert lock.lost.wait(WAIT_S), "the cut client never learned it lost the lock"
            assert told.wait(WAIT_S)
            with pytest.raises(dlm.LockLost):
                lock.check()
            # Another client, not behind the link, gets the lock once the lease ends.
            with other.lock("job", ttl="30s", wait=WAIT_S) as taken:
                assert taken.token > lock.token
                assert c.leader() is leader  # no election: only the link was cut
                link.restore()
                # Restored, the link's client works again and sees the lock held.
                assert cut_off.lock("job", ttl="30s").locked()
            lock.release()  # a lock already lost is given back quietly


def _renewed(lock: dlm.Lock) -> None:
    """Waits for a renewal of the lock's lease to be confirmed (its deadline moves on)."""
    first = lock.deadline
    deadline = time.monotonic() + WAIT_S
    while lock.deadline <= first:
        assert time.monotonic() < deadline, "no renewal confirmed"
        time.sleep(0.05)


def _not_the_first_member_leading(c: Cluster) -> Member:
    """Makes a member other than n1 the leader: a client asks n1 first, which must then
    redirect it, and the redirect must keep it inside its link."""
    leader = c.wait_for_leader(WAIT_S)
    if leader is c.members[0]:
        c.kill(leader)
        leader = c.wait_for_leader(WAIT_S, not_=leader)
        c.restart(c.members[0])
    return leader


def test_an_async_client_behind_a_cut_link_loses_its_lock_and_its_body_is_cancelled() -> None:
    with dlm.testing.cluster(3) as c:
        leader = _not_the_first_member_leading(c)
        link = c.link()
        reached_the_end = False

        async def body() -> None:
            nonlocal reached_the_end
            async with link.async_client(timeout="5s") as client:
                with pytest.raises(dlm.LockLost):
                    async with client.lock("async-job", ttl="2s") as lock:
                        first = lock.deadline
                        with anyio.fail_after(WAIT_S):
                            while lock.deadline <= first:
                                await anyio.sleep(0.05)
                        link.cut()
                        await lock.lost.wait()
                        await anyio.sleep(WAIT_S)  # cancelled: the lock was lost
                        reached_the_end = True

        anyio.run(body)
        assert not reached_the_end
        assert c.leader() is leader
        with c.client(timeout=WAIT_S) as other, other.lock("async-job", wait=WAIT_S) as taken:
            assert taken.token > 0


def test_no_process_or_proxy_outlives_the_block_even_when_it_raises() -> None:
    seen: dict[str, object] = {}
    with pytest.raises(RuntimeError, match="the user's test failed"), dlm.testing.cluster(3) as c:
        link = c.link()
        c.pause(c.members[0])  # a stopped member must be stopped too
        seen["pids"] = [m.pid for m in c.members]
        seen["proxies"] = [t for t in threading.enumerate() if t.name == "test-proxy"]
        seen["base"] = c.base
        assert link.cluster
        raise RuntimeError("the user's test failed")
    pids = seen["pids"]
    assert isinstance(pids, list) and len(pids) == 3
    assert all(_gone(pid) for pid in pids), pids
    proxies = seen["proxies"]
    assert isinstance(proxies, list) and len(proxies) == 3
    assert not any(t.is_alive() for t in proxies)
    base = seen["base"]
    assert isinstance(base, Path) and not base.exists()


def test_the_pytest_fixture_in_a_users_own_test_run(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["dlm.testing.pytest_plugin"]\n')
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            f"""
            import pytest

            def test_uses_the_cluster(dlm_cluster):
                open({str(pids_file)!r}, "w").write(
                    " ".join(str(m.pid) for m in dlm_cluster.members)
                )
                with dlm_cluster.client(timeout=20) as client:
                    with client.lock("k", ttl="10s") as lock:
                        assert lock.token > 0

            @pytest.mark.dlm_cluster(size=1)
            def test_fails_with_one_member(dlm_cluster):
                assert len(dlm_cluster.members) == 1
                assert False, "the user's assertion"
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=180,
    )
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    assert "the user's assertion" in run.stdout
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 3 and all(_gone(pid) for pid in pids)


def test_a_member_that_finds_its_port_taken_makes_the_start_try_fresh_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from dlm.testing import processes

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    calls: list[int] = []
    real = processes.free_ports

    def first_one_taken(count: int) -> list[int]:
        ports = real(count)
        calls.append(count)
        if len(calls) == 1:
            ports[0] = taken.getsockname()[1]
        return ports

    monkeypatch.setattr(processes, "free_ports", first_one_taken)
    try:
        with Cluster(3) as c:
            assert len(calls) == 2
            assert all(m.alive for m in c.members)
            assert taken.getsockname()[1] not in {m.port for m in c.members}
    finally:
        taken.close()


def test_a_partitioned_cluster_elects_in_every_partition_and_survives_a_killed_member() -> None:
    with dlm.testing.cluster(3, partitions=3) as c:
        assert c.partitions == 3
        leaders = c.wait_for_leaders(WAIT_S)
        assert sorted(leaders) == [0, 1, 2]
        victim = leaders[1]
        assert victim.pid is not None
        children = [
            int(pid)
            for pid in Path(f"/proc/{victim.pid}/task/{victim.pid}/children").read_text().split()
        ]
        assert len(children) == 3
        c.kill(victim)
        assert all(_gone(pid) or _zombie(pid) for pid in children)
        after = c.wait_for_leaders(WAIT_S, not_=victim)
        assert all(member is not victim for member in after.values())
        c.restart(victim)
        c.wait_for_leaders(WAIT_S)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True
