"""The blocking client against in-process fake members."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import threading
from typing import Any

import pytest

from dlm.client import Client, Grant
from dlm.client.errors import (
    BadRequest,
    ClusterUnavailable,
    LeaseLost,
    LockHeld,
    NotHolder,
    ServerError,
)
from dlm.wire import ErrorCode, error, ok

from .fake_server import FakeConn, FakeServer, LockModel, redirect_to


def client(*servers: FakeServer, timeout: float = 3.0) -> Client:
    return Client([s.addr for s in servers], timeout=timeout, rng=random.Random(3))


def free_port_addr() -> str:
    # Bind then close: nothing listens there afterwards, so connects are refused.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return addr


def test_basic_flow() -> None:
    with FakeServer() as server, client(server) as c:
        lease = c.open_lease(5000)
        assert len(lease.id) == 16 and lease.ttl_ms == 5000
        grant = c.acquire(lease, "jobs/a", meta={"host": "h1"})
        assert grant == Grant(key="jobs/a", token=grant.token, lease=lease.id, ttl_ms=5000)
        assert c.keepalive(lease) == 5000
        assert c.get("jobs/a")["holders"][0]["lease"] == lease.id
        assert [lock["key"] for lock in c.list_locks("jobs/")] == ["jobs/a"]
        assert c.lease_info(lease)["keys"] == ["jobs/a"]
        assert c.status()["role"] == "leader"
        c.release(lease, "jobs/a")
        assert c.get("jobs/a")["holders"] == []
        c.close_lease(lease)
        assert server.of_type("acquire")[0]["meta"] == {"host": "h1"}


def test_follows_redirects_across_two_hops_and_stays_with_the_leader() -> None:
    with (
        FakeServer(name="leader") as leader,
        FakeServer(redirect_to(leader.addr), name="f2") as f2,
        FakeServer(redirect_to(f2.addr), name="f1") as f1,
    ):
        with Client([f1.addr], timeout=3.0) as c:
            lease = c.open_lease(1000, lease="fixed")
            assert lease.id == "fixed"
            assert c.connected_to == leader.addr
            c.keepalive(lease)
        assert len(f1.of_type("open_lease")) == 1
        assert len(f2.of_type("open_lease")) == 1
        assert f1.of_type("keepalive") == [] and f2.of_type("keepalive") == []


def test_dropped_connection_is_retried_with_the_same_seq() -> None:
    model = LockModel()
    dropped: list[int] = []

    def flaky(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        if req["t"] == "acquire" and not dropped:
            dropped.append(req["seq"])
            conn.drop()
            return None
        return model(conn, req)

    with FakeServer(flaky) as server, client(server) as c:
        lease = c.open_lease(2000)
        grant = c.acquire(lease, "k")
        acquires = server.of_type("acquire")
        assert len(acquires) == 2
        assert acquires[0]["seq"] == acquires[1]["seq"] == dropped[0]
        assert grant.token > 0
        # Each state-changing request gets its own seq.
        c.release(lease, "k")
        assert server.of_type("release")[0]["seq"] != dropped[0]


def test_silent_member_is_abandoned_for_the_next_one() -> None:
    def silent(conn: FakeConn, req: dict[str, Any]) -> None:
        return None

    with FakeServer(silent, name="stopped") as stopped, FakeServer() as live:
        c = Client([stopped.addr, live.addr], timeout=3.0, attempt_timeout=0.2)
        with c:
            lease = c.open_lease(1000)
        assert lease.ttl_ms == 1000
        assert stopped.of_type("open_lease")[0]["lease"] == lease.id


def test_unreachable_cluster_raises_cluster_unavailable() -> None:
    addr = free_port_addr()
    with (
        Client(addr, timeout=0.3, rng=random.Random(1)) as c,
        pytest.raises(ClusterUnavailable) as info,
    ):
        c.status()
    assert f"no member of {addr} answered" in str(info.value)
    assert info.value.exit_code == 69


def test_no_quorum_until_timeout_raises_cluster_unavailable() -> None:
    def no_quorum(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any]:
        return error(req["id"], ErrorCode.NO_QUORUM, "no quorum", retry_after_ms=20)

    with FakeServer(no_quorum) as server, client(server, timeout=0.4) as c:
        with pytest.raises(ClusterUnavailable, match="no leader with a quorum"):
            c.status()
        assert len(server.of_type("status")) >= 2


def test_refused_hello_is_reported() -> None:
    greeting = error(None, ErrorCode.BAD_REQUEST, "unsupported protocol version")
    with (
        FakeServer(greeting=greeting) as server,
        client(server) as c,
        pytest.raises(BadRequest, match="unsupported protocol version"),
    ):
        c.status()


def test_first_request_goes_out_behind_the_hello_without_waiting_for_the_welcome() -> None:
    with FakeServer(welcome_after_request=True) as server, client(server) as c:
        lease = c.open_lease(5000)
        assert c.acquire(lease, "k").key == "k"


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (ErrorCode.NOT_HOLDER, NotHolder),
        (ErrorCode.SESSION_EXPIRED, LeaseLost),
        (ErrorCode.BAD_REQUEST, BadRequest),
        (ErrorCode.LOCKED, LockHeld),
    ],
)
def test_error_replies_raise_their_exception(code: ErrorCode, exc: type[Exception]) -> None:
    def refuse(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any]:
        return error(req["id"], code, "refused", holders=[{"lease": "x", "token": 3}])

    with FakeServer(refuse) as server, client(server) as c:
        with pytest.raises(exc):
            c.release("mylease", "k")
        assert len(server.of_type("release")) == 1  # not retried


def test_unknown_error_code_is_a_server_error() -> None:
    def odd(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any]:
        return {"t": "error", "id": req["id"], "code": "WEIRD", "message": "?"}

    with FakeServer(odd) as server, client(server) as c, pytest.raises(ServerError):
        c.status()


def test_conflict_and_not_holder_name_the_holder() -> None:
    with FakeServer() as server, client(server) as c:
        a, b = c.open_lease(1000), c.open_lease(1000)
        grant = c.acquire(a, "k")
        with pytest.raises(LockHeld) as held:
            c.acquire(b, "k")
        assert held.value.holders[0]["lease"] == a.id
        assert held.value.retry_after_ms == 100
        with pytest.raises(NotHolder) as not_holder:
            c.release(b, "k")
        assert not_holder.value.holders[0]["token"] == grant.token
        assert a.id in str(not_holder.value)


def test_waiting_acquire_receives_the_pushed_grant() -> None:
    with FakeServer() as server, client(server) as c, client(server) as other:
        a, b = c.open_lease(1000), other.open_lease(1000)
        c.acquire(a, "k")
        result: list[Grant | BaseException] = []

        def wait() -> None:
            try:
                result.append(other.acquire(b, "k", wait=5.0))
            except BaseException as exc:
                result.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        server.wait_for("acquire", count=2)
        c.release(a, "k")
        waiter.join(10.0)
        assert len(result) == 1 and isinstance(result[0], Grant)
        assert result[0].lease == b.id and result[0].ttl_ms == 1000
        assert result[0].token > 0
        # The grant came by push: the waiter sent exactly one acquire.
        assert len(server.of_type("acquire")) == 2


def test_push_without_known_ttl_resends_acquire_to_learn_it() -> None:
    with FakeServer() as server, client(server) as c, client(server) as other:
        a = c.open_lease(1000)
        c.open_lease(700, lease="theirs")
        c.acquire(a, "k")
        done = threading.Event()
        grants: list[Grant] = []

        def wait() -> None:
            grants.append(other.acquire("theirs", "k", wait=5.0))
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        server.wait_for("acquire", count=2)
        model = server.handler
        assert isinstance(model, LockModel)
        c.release(a, "k")
        assert done.wait(10.0)
        assert grants[0].ttl_ms == 700
        seqs = [r["seq"] for r in server.of_type("acquire") if r["lease"] == "theirs"]
        assert len(seqs) == 2 and seqs[0] == seqs[1]


def test_waiting_acquire_times_out_and_leaves_the_queue() -> None:
    with FakeServer() as server, client(server) as c:
        a, b = c.open_lease(1000), c.open_lease(1000)
        c.acquire(a, "k")
        with pytest.raises(LockHeld, match="after waiting"):
            c.acquire(b, "k", wait=0.2)
        releases = server.of_type("release")
        assert [(r["lease"], r["key"]) for r in releases] == [(b.id, "k")]
        model = server.handler
        assert isinstance(model, LockModel)
        assert model.waiters["k"] == []


def test_connection_drop_while_queued_resends_the_same_acquire() -> None:
    model = LockModel()
    state = {"queued": 0}

    def drop_after_queue(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        reply = model(conn, req)
        if req["t"] == "acquire" and reply is not None and reply.get("result") == "queued":
            state["queued"] += 1
            if state["queued"] == 1:
                conn.send(reply)
                conn.drop()
                return None
            # On the re-sent acquire, the holder has gone meanwhile.
            model.holders["k"] = []
            model.waiters["k"] = []
            return model(conn, req)
        return reply

    with FakeServer(drop_after_queue) as server, client(server) as c:
        a, b = c.open_lease(1000), c.open_lease(1000)
        c.acquire(a, "k")
        grant = c.acquire(b, "k", wait=5.0)
        assert grant.lease == b.id
        mine = [r for r in server.of_type("acquire") if r["lease"] == b.id]
        assert len(mine) == 2 and mine[0]["seq"] == mine[1]["seq"]
        assert mine[0]["wait"] is True and mine[1]["wait"] is True


def test_sockets_are_close_on_exec_and_nodelay() -> None:
    with FakeServer() as server, client(server) as c:
        c.status()
        conn = c._conn
        assert conn is not None
        fd = conn.sock.fileno()
        assert not os.get_inheritable(fd)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_member_status_asks_one_member_and_none_when_unreachable() -> None:
    with FakeServer(LockModel("n7"), name="n7") as server, client(server) as c:
        view = c.member_status(server.addr, timeout=2.0)
        assert view is not None and view["node"] == "n7"
        assert server.of_type("status")[0]["stale"] is True
        assert c.member_status(free_port_addr(), timeout=0.5) is None


def test_close_from_another_thread_interrupts_a_blocked_call() -> None:
    def silent(conn: FakeConn, req: dict[str, Any]) -> None:
        return None

    with FakeServer(silent) as server:
        c = Client(server.addr, timeout=30.0, attempt_timeout=30.0)
        failed = threading.Event()

        def call() -> None:
            try:
                c.status()
            except ClusterUnavailable:
                failed.set()

        t = threading.Thread(target=call, daemon=True)
        t.start()
        server.wait_for("status")
        c.close()
        assert failed.wait(5.0)
        t.join(5.0)


def test_ok_reply_is_matched_by_id_not_order() -> None:
    def stale_first(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any]:
        conn.send(ok(req["id"] + 1000, role="wrong"))
        return ok(req["id"], role="right")

    with FakeServer(stale_first) as server, client(server) as c:
        assert c.status()["role"] == "right"


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
        expected = f"{other.addr} is not a dlm member (it answered something else); check --cluster"
        assert expected in str(info.value)
        assert "1213486160" not in str(info.value)
    finally:
        other.close()


def test_a_closed_port_gives_up_after_the_dial_timeout_not_the_timeout() -> None:
    import time

    addr = free_port_addr()
    started = time.monotonic()
    with (
        Client(addr, timeout=10.0, dial_timeout=0.4, rng=random.Random(5)) as c,
        pytest.raises(ClusterUnavailable, match="no member answered within the dial timeout"),
    ):
        c.status()
    assert time.monotonic() - started < 2.0
