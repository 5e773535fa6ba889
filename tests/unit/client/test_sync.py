"""The blocking client against a real member (real_member.py), and doubles for the rest."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import threading
from typing import Any

import pytest

from dlm.client import Client, Grant, KeepAlive, core
from dlm.client.errors import (
    BadRequest,
    ClusterUnavailable,
    LeaseLost,
    LockHeld,
    NotHolder,
    ServerError,
)
from dlm.wire import ErrorCode, error, ok

from .doubles import (
    cutting_proxy,
    redirecting_member,
    refusing_member,
    scripted_member,
    silent_member,
)
from .real_member import WAIT, RunningMember


def client(*addrs: str, timeout: float = 3.0, **options: Any) -> Client:
    return Client(list(addrs), timeout=timeout, rng=random.Random(3), **options)


def free_port_addr() -> str:
    # Bind then close: nothing listens there afterwards, so connects are refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Runs ``fn`` in a daemon thread; its result or exception lands in the list."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_each_call_against_a_member(member: RunningMember) -> None:
    with client(member.addr) as c:
        lease = c.open_lease(5000)
        assert len(lease.id) == 16 and lease.ttl_ms == 5000 and lease.incarnation > 0
        grant = c.acquire(lease, "jobs/a", meta={"host": "h1"})
        assert grant == Grant(key="jobs/a", token=grant.token, lease=lease.id, ttl_ms=5000)
        assert c.keepalive(lease) == 5000
        assert c.get("jobs/a").holders[0].lease == lease.id
        assert [lock.key for lock in c.list_locks("jobs/")] == ["jobs/a"]
        assert c.lease_info(lease).keys == ["jobs/a"]
        assert [item.id for item in c.list_leases()] == [lease.id]
        assert c.status().role == "leader"
        assert c.update_lease(lease, 4000) == 4000
        released = c.release(lease, "jobs/a", token=grant.token)
        assert (released.held, released.token) == (True, grant.token)
        assert c.get("jobs/a").holders == []
        assert c.close_lease(lease) == []
        [acquire] = member.of_type("acquire")
        assert acquire["meta"] == {"host": "h1"} and acquire["client"] == c.client_id


def test_follows_redirects_across_two_hops_and_stays_with_the_leader(
    member: RunningMember,
) -> None:
    with redirecting_member(member.addr) as f2, redirecting_member(f2.addr) as f1:
        with Client([f1.addr], timeout=3.0) as c:
            lease = c.open_lease(1000, lease="fixed")
            assert lease.id == "fixed"
            assert c.connected_to == member.addr
            c.keepalive(lease)
        assert len(f1.of_type("open_lease")) == len(f2.of_type("open_lease")) == 1
        assert f1.of_type("keepalive") == [] and f2.of_type("keepalive") == []
        [opened] = member.of_type("open_lease")
        assert opened["seq"] == f1.of_type("open_lease")[0]["seq"]


def test_an_answer_lost_with_the_connection_is_asked_again_with_the_same_seq(
    member: RunningMember,
) -> None:
    def first_acquire(frame: dict[str, Any]) -> bool:
        return frame.get("t") == "acquire"

    with cutting_proxy(member.addr, cut_after_request=first_acquire) as proxy:
        with client(proxy.addr) as c:
            lease = c.open_lease(2000)
            grant = c.acquire(lease, "k")
            # The member granted the first copy; the second got that grant back.
            first, second = member.of_type("acquire")
            assert (first["client"], first["seq"]) == (second["client"], second["seq"])
            holders = c.get("k").holders
            assert [(h.lease, h.token) for h in holders] == [(lease.id, grant.token)]
            # The next request is a new one.
            c.release(lease, "k")
            assert member.of_type("release")[0]["seq"] > first["seq"]
        assert proxy.cuts == 1


def test_a_silent_member_is_abandoned_for_the_next_one(member: RunningMember) -> None:
    with silent_member() as stopped:
        c = Client([stopped.addr, member.addr], timeout=3.0, attempt_timeout=0.2)
        with c:
            lease = c.open_lease(1000)
            assert c.connected_to == member.addr
        assert lease.ttl_ms == 1000
        assert stopped.of_type("open_lease")[0]["lease"] == lease.id


def test_an_unreachable_cluster_raises_cluster_unavailable() -> None:
    addr = free_port_addr()
    with (
        Client(addr, timeout=0.3, rng=random.Random(1)) as c,
        pytest.raises(ClusterUnavailable) as info,
    ):
        c.status()
    assert f"no member of {addr} answered" in str(info.value)
    assert info.value.exit_code == 69


def test_a_member_without_a_leader_ends_in_cluster_unavailable(
    leaderless_member: RunningMember,
) -> None:
    with (
        client(leaderless_member.addr, timeout=0.4) as c,
        pytest.raises(ClusterUnavailable, match="no leader with a quorum"),
    ):
        c.open_lease(1000)
    opens = leaderless_member.of_type("open_lease")
    assert len(opens) >= 2 and len({o["seq"] for o in opens}) == 1


def test_a_refused_hello_is_reported() -> None:
    refusal = error(None, ErrorCode.BAD_REQUEST, "unsupported protocol version")
    with (
        refusing_member(refusal) as double,
        client(double.addr) as c,
        pytest.raises(BadRequest, match="unsupported protocol version"),
    ):
        c.status()


def test_the_first_request_goes_out_behind_the_hello_without_waiting_for_the_welcome() -> None:
    def answer(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [ok(request["id"], node="double", role="leader")]

    with (
        scripted_member(answer, welcome_after_first_request=True) as double,
        client(double.addr) as c,
    ):
        assert c.status().node == "double"


def _opens_with_the_clusters_ttl(request: dict[str, Any]) -> list[dict[str, Any]]:
    """A member whose default-ttl is 45 s: an open naming no TTL gets that."""
    if request.get("t") != "open_lease":
        return [ok(request["id"], lease=request.get("lease", ""), ttl_ms=9_000)]
    ttl_ms = request.get("ttl_ms", 45_000)
    return [ok(request["id"], lease=request["lease"], ttl_ms=ttl_ms, incarnation=1)]


@pytest.mark.parametrize(
    ("version", "sent", "got"), [(5, None, 45_000), (4, 30_000, 30_000)], ids=["v5", "v4"]
)
def test_an_open_without_a_ttl_leaves_it_to_a_version_5_member_and_says_30s_to_an_older_one(
    version: int, sent: int | None, got: int
) -> None:
    # The driver sends a first request behind the hello; this one waits for the welcome,
    # whose version says whether the member takes an open without ttl_ms.
    with (
        scripted_member(_opens_with_the_clusters_ttl, version=version) as double,
        client(double.addr) as c,
    ):
        lease = c.open_lease(None)
        [opened] = double.of_type("open_lease")
        assert opened.get("ttl_ms") == sent and ("ttl_ms" in opened) == (sent is not None)
        assert lease.ttl_ms == got
        # A TTL given is sent as it is, to either.
        c.open_lease(7_000)
        assert double.of_type("open_lease")[1]["ttl_ms"] == 7_000


def test_the_ttl_the_member_gave_paces_renewals_and_sets_the_deadline() -> None:
    with (
        scripted_member(_opens_with_the_clusters_ttl) as double,
        client(double.addr) as c,
    ):
        lease = c.open_lease(None)
        keeper = KeepAlive(c, lease)
        assert keeper.ttl_ms == 45_000
        assert keeper._renewer.interval() == pytest.approx(15.0)
        assert keeper.deadline == pytest.approx(core.lease_deadline(lease.confirmed_at, 45_000))


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda c, lease, other: c.release(other, "k"), NotHolder),
        (lambda c, lease, other: c.release("no-such-lease", "k"), LeaseLost),
        (lambda c, lease, other: c.acquire(other, "k"), LockHeld),
        (lambda c, lease, other: c.update_lease(other, 86_400_001), BadRequest),
    ],
    ids=["NOT_HOLDER", "SESSION_EXPIRED", "LOCKED", "BAD_REQUEST"],
)
def test_error_replies_raise_their_exception_and_are_not_retried(
    member: RunningMember, call: Any, exc: type[Exception]
) -> None:
    with client(member.addr) as c:
        lease, other = c.open_lease(5000), c.open_lease(5000)
        c.acquire(lease, "k")
        sent = len(member.received)
        with pytest.raises(exc):
            call(c, lease, other)
        assert len(member.received) == sent + 1


def test_an_unknown_error_code_is_a_server_error() -> None:
    def odd(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"t": "error", "id": request["id"], "code": "WEIRD", "message": "?"}]

    with scripted_member(odd) as double, client(double.addr) as c, pytest.raises(ServerError):
        c.status()


def test_conflict_and_not_holder_name_the_holder(member: RunningMember) -> None:
    with client(member.addr) as c:
        a, b = c.open_lease(1000), c.open_lease(1000)
        grant = c.acquire(a, "k")
        with pytest.raises(LockHeld) as held:
            c.acquire(b, "k")
        assert held.value.holders[0]["lease"] == a.id
        assert held.value.retry_after_ms is not None and held.value.retry_after_ms > 0
        with pytest.raises(NotHolder) as not_holder:
            c.release(b, "k")
        assert not_holder.value.holders[0]["token"] == grant.token
        assert a.id in str(not_holder.value)


def test_a_waiting_acquire_receives_the_pushed_grant(member: RunningMember) -> None:
    with client(member.addr) as c, client(member.addr) as other:
        a, b = c.open_lease(1500), other.open_lease(1500)
        c.acquire(a, "k")
        waiter, result = in_thread(lambda: other.acquire(b, "k", wait=WAIT))
        member.wait_for("acquire", count=2)
        c.release(a, "k")
        waiter.join(WAIT)
        assert len(result) == 1 and isinstance(result[0], Grant)
        assert (result[0].lease, result[0].ttl_ms) == (b.id, 1500)
        # The grant came by push: the waiter sent exactly one acquire.
        assert len(member.of_type("acquire")) == 2


def test_a_push_without_a_known_ttl_resends_the_acquire_to_learn_it(member: RunningMember) -> None:
    with client(member.addr) as c, client(member.addr) as other:
        a = c.open_lease(1000)
        c.open_lease(1700, lease="theirs")
        c.acquire(a, "k")
        waiter, result = in_thread(lambda: other.acquire("theirs", "k", wait=WAIT))
        member.wait_for("acquire", count=2)
        c.release(a, "k")
        waiter.join(WAIT)
        assert isinstance(result[0], Grant) and result[0].ttl_ms == 1700
        seqs = [r["seq"] for r in member.of_type("acquire") if r["lease"] == "theirs"]
        assert len(seqs) == 2 and seqs[0] == seqs[1]


def test_a_waiting_acquire_that_times_out_leaves_the_queue(member: RunningMember) -> None:
    with client(member.addr) as c:
        a, b = c.open_lease(1000), c.open_lease(1000)
        c.acquire(a, "k")
        with pytest.raises(LockHeld, match="after waiting"):
            c.acquire(b, "k", wait=0.2)
        releases = member.of_type("release")
        assert [(r["lease"], r["key"]) for r in releases] == [(b.id, "k")]
        state = member.inspect(lambda machine: machine.locks.get("k"))
        assert state is not None and state.waiters == ()


def test_a_connection_lost_while_queued_resends_the_same_acquire(member: RunningMember) -> None:
    def queued(frame: dict[str, Any]) -> bool:
        return frame.get("result") == "queued"

    with (
        cutting_proxy(member.addr, cut_after_reply=queued) as proxy,
        client(member.addr) as holder,
        client(proxy.addr) as c,
    ):
        a, b = holder.open_lease(1000), c.open_lease(1000)
        holder.acquire(a, "k")
        waiter, result = in_thread(lambda: c.acquire(b, "k", wait=WAIT))
        member.wait_for("acquire", count=3)  # the holder's, then the waiter's twice
        holder.release(a, "k")
        waiter.join(WAIT)
        assert isinstance(result[0], Grant) and result[0].lease == b.id
        mine = [r for r in member.of_type("acquire") if r["lease"] == b.id]
        assert len(mine) == 2 and mine[0]["seq"] == mine[1]["seq"]
        assert mine[0]["wait"] is True and mine[1]["wait"] is True
        assert proxy.cuts == 1


def test_sockets_are_close_on_exec_and_nodelay(member: RunningMember) -> None:
    with client(member.addr) as c:
        c.status()
        conn = c._conn
        assert conn is not None
        fd = conn.sock.fileno()
        assert not os.get_inheritable(fd)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_member_status_asks_one_member_and_none_when_unreachable(member: RunningMember) -> None:
    with client(member.addr) as c:
        view = c.member_status(member.addr, timeout=2.0)
        assert view is not None and (view.node, view.role) == ("n1", "leader")
        assert member.of_type("status")[0]["stale"] is True
        assert c.member_status(free_port_addr(), timeout=0.5) is None


def test_close_from_another_thread_interrupts_a_blocked_call() -> None:
    with silent_member() as double:
        c = Client(double.addr, timeout=30.0, attempt_timeout=30.0)
        caller, result = in_thread(c.status)
        double.wait_for("status")
        c.close()
        caller.join(WAIT)
        assert not caller.is_alive()
        assert len(result) == 1 and isinstance(result[0], ClusterUnavailable)


def test_a_reply_is_matched_by_id_not_by_order() -> None:
    def stray_first(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [ok(request["id"] + 1000, role="wrong"), ok(request["id"], role="right")]

    with scripted_member(stray_first) as double, client(double.addr) as c:
        assert c.status().role == "right"


# --- what is not a dlm member, and the dial timeout over real sockets -------------------


class NotDlm:
    """A TCP server that answers anything with an HTTP error, as a web server would."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(100):  # bounded: a test makes a handful of connections
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2.0)
                try:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5.0)


def test_a_server_that_is_not_a_member_is_named_as_such() -> None:
    other = NotDlm()
    try:
        with (
            Client(other.addr, timeout=5.0, dial_timeout=0.5) as c,
            pytest.raises(ClusterUnavailable) as info,
        ):
            c.status()
        assert str(info.value) == (
            f"{other.addr} did not answer as a dlm member within 0.5s (it answered "
            "something else): check --cluster (or DLM_CLUSTER)"
        )
        assert "1213486160" not in str(info.value)
    finally:
        other.close()


def test_a_server_that_takes_the_connection_and_says_nothing_did_not_answer_as_a_member() -> None:
    """`python3 -m http.server` waits for a request line that a dlm hello never ends."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel accepts; nobody ever reads or writes
        addr = f"127.0.0.1:{listener.getsockname()[1]}"
        with (
            Client(addr, timeout=5.0, dial_timeout=0.5) as c,
            pytest.raises(ClusterUnavailable) as info,
        ):
            c.status()
        assert str(info.value) == (
            f"{addr} did not answer as a dlm member within 0.5s: check --cluster (or DLM_CLUSTER)"
        )
    finally:
        listener.close()


def test_a_closed_port_gives_up_after_the_dial_timeout_not_the_timeout() -> None:
    import time

    addr = free_port_addr()
    started = time.monotonic()
    with (
        Client(addr, timeout=10.0, dial_timeout=0.4, rng=random.Random(5)) as c,
        pytest.raises(ClusterUnavailable, match="no member answered within the dial timeout"),
    ):
        c.status()
    # The message says which deadline ended it; the time is printed, not asserted.
    print(f"gave up after {time.monotonic() - started:.2f} s")
