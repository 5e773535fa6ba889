"""The public Python API (`import dlm`, dlm/_api/) against real member processes.

One cluster for the module; each test uses keys of its own. A client that must be cut
off from the cluster talks to the leader through a proxy (tests/cluster/proxy.py) that
drops every byte once cut, as a partition does; the other client talks to it directly.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import dlm
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, free_ports
from tests.cluster.proxy import Proxy

pytestmark = pytest.mark.cluster

WAIT_S = 15.0


@pytest.fixture
def client(shared: Cluster) -> Iterator[dlm.Client]:
    with dlm.Client(shared.members_env, timeout="5s") as made:
        yield made


@pytest.fixture
def cli(shared: Cluster, tmp_path: Path) -> Dlm:
    """The `dlm` command against the module's cluster (an operator's shell)."""
    return Dlm(shared.members_env, tmp_path)


@pytest.fixture
def cut_off(shared: Cluster) -> Iterator[tuple[Proxy, str]]:
    """A proxy to the leader (cut it to partition whoever talks through it)."""
    leader = shared.wait_for_leader(timeout=WAIT_S)
    with Proxy(leader.address) as link:
        yield link, link.address


def holders(client: dlm.Client, key: str) -> list[tuple[str | None, int | None]]:
    with client._borrow() as inner:
        return [(h.lease, h.token) for h in inner.get(key).holders]


def test_a_with_block_holds_the_key_under_its_token_and_gives_it_back(
    client: dlm.Client, cli: Dlm
) -> None:
    with client.lock("py/with", ttl="5s", meta={"job": "nightly"}) as lock:
        assert lock.owned() and lock.locked()
        assert holders(client, "py/with") == [(lock.lease, lock.token)]
        assert 0 < lock.time_left() <= 5.0
        assert lock.deadline - lock.time_left() <= dlm.now()
        shown = cli.json("status", "py/with")  # the CLI sees the lease id and the metadata
        assert lock.lease in str(shown) and "nightly" in str(shown)
    assert not lock.owned() and not lock.locked()
    assert holders(client, "py/with") == []


def test_tokens_rise_across_acquisitions(client: dlm.Client) -> None:
    lock = client.lock("py/tokens", ttl="5s")
    tokens = []
    for _ in range(3):
        assert lock.acquire()
        tokens.append(lock.token)
        lock.release()
    with client.lock("py/tokens") as other:
        tokens.append(other.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4, tokens


def test_on_lost_fires_when_an_operator_revokes_the_lease(client: dlm.Client, cli: Dlm) -> None:
    fired = threading.Event()
    seen: list[str | None] = []

    def on_lost(lock: object) -> None:
        assert isinstance(lock, type(taken))
        seen.append(lock.lost_reason)
        fired.set()

    taken = client.lock("py/revoked", ttl="3s", on_lost=on_lost)
    with pytest.raises(dlm.LockLost), taken as lock:
        revoke = cli.run("lease", "revoke", lock.lease)
        assert revoke.returncode == 0, revoke.stderr
        assert fired.wait(WAIT_S), "on_lost did not fire"
        assert lock.lost.is_set() and not lock.owned()
        with pytest.raises(dlm.LockLost, match="revoked"):
            lock.check()
    assert seen and "revoked" in str(seen[0])


def test_a_shortened_ttl_never_leaves_two_holders(
    client: dlm.Client, cut_off: tuple[Proxy, str]
) -> None:
    link, through = cut_off
    with dlm.Client(through, timeout="2s", dial_timeout="2s") as a:
        lock = a.lock("py/shortened", ttl="30s")
        assert lock.acquire()
        lock.extend(ttl="1s")
        # Lowered when the update was sent: never counted on past what the cluster allows.
        assert lock.deadline <= dlm.now() + 1.0
        link.cut()  # A's renewals vanish from here on
        b = client.lock("py/shortened", ttl="5s", wait=WAIT_S)
        assert b.acquire()
        granted_by = dlm.now()
        assert lock.deadline < granted_by, (
            f"A counted on the lock {lock.deadline - granted_by:.3f}s past B's grant"
        )
        assert not lock.owned()
        assert lock.lost.wait(WAIT_S)
        b.release()
        link.heal()
        lock.release()  # lost: given back quietly


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_async_body_is_cancelled_before_the_deadline(
    cut_off: tuple[Proxy, str], backend: str
) -> None:
    if backend == "trio":
        pytest.importorskip("trio")
    link, through = cut_off
    seen: dict[str, float] = {}

    async def main() -> None:
        async with dlm.AsyncClient(through, timeout="2s", dial_timeout="2s") as client:
            with pytest.raises(dlm.LockLost):
                async with client.lock("py/cancelled", ttl="2s") as lock:
                    assert lock.cancel_margin == pytest.approx(0.2)
                    link.cut()
                    try:
                        await anyio.sleep(WAIT_S)
                    except anyio.get_cancelled_exc_class():
                        seen["cancelled"] = dlm.now()
                        seen["deadline"] = lock.deadline
                        raise
            link.heal()

    anyio.run(main, backend=backend)
    assert seen, "the body was not cancelled"
    early = seen["deadline"] - seen["cancelled"]
    assert early > 0, f"the body ran {-early:.3f}s past the deadline"


def test_the_async_body_is_cancelled_when_the_lease_is_revoked(shared: Cluster, cli: Dlm) -> None:
    async def main() -> None:
        async with dlm.AsyncClient(shared.members_env, timeout="5s") as client:
            with pytest.raises(dlm.LockLost, match="revoked"):
                async with client.lock("py/async-revoked", ttl="3s") as lock:
                    revoke = await anyio.to_thread.run_sync(cli.run, "lease", "revoke", lock.lease)
                    assert revoke.returncode == 0, revoke.stderr
                    await anyio.sleep(WAIT_S)  # cancelled at the next renewal: 1 s
                    pytest.fail("not cancelled")

    anyio.run(main)


def test_a_forked_child_exits_without_releasing_the_parents_lock(client: dlm.Client) -> None:
    read_end, write_end = os.pipe()
    pid = -1
    said = "nothing"
    try:
        with client.lock("py/forked", ttl="5s") as lock:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:  # pragma: no cover - the child, which then leaves the with block
                try:
                    lock.release()
                    said = "released"
                except Exception as exc:
                    said = type(exc).__name__
            else:
                os.close(write_end)
                assert os.waitpid(pid, 0)[1] == 0
                with os.fdopen(read_end, "rb") as pipe:
                    assert pipe.read() == b"InertAfterFork closed nothing"
                assert holders(client, "py/forked") == [(lock.lease, lock.token)]
                assert lock.owned()
                lock.extend()  # the parent's connections are intact
        if pid == 0:  # pragma: no cover - the child, out of the block
            client.close()
            said += " closed nothing" if not client._closed else " closed"
    finally:
        if pid == 0:  # pragma: no cover - whatever happened, the child ends here
            os.write(write_end, said.encode())
            os._exit(0)
    assert holders(client, "py/forked") == []


def test_threads_share_a_client_one_holder_at_a_time(client: dlm.Client) -> None:
    inside = []
    tokens: list[int] = []
    guard = threading.Lock()
    overlaps = []

    def work() -> None:
        for _ in range(3):
            with client.lock("py/threads", ttl="5s", wait=WAIT_S) as lock:
                with guard:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(lock.token)
                    tokens.append(lock.token)
                with guard:
                    inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not overlaps
    assert len(tokens) == 12 and tokens == sorted(tokens) and len(set(tokens)) == 12


def test_a_semaphore_and_several_keys_under_one_lease(client: dlm.Client) -> None:
    first = client.semaphore("py/sem", limit=2, ttl="5s")
    second = client.semaphore("py/sem", limit=2, ttl="5s")
    third = client.semaphore("py/sem", limit=2, ttl="5s")
    assert first.acquire() and second.acquire()
    assert not third.acquire(blocking=False)
    assert first.token != second.token
    second.release()
    assert third.acquire(blocking=False)
    first.release()
    third.release()

    with client.lock(["py/b", "py/a"], ttl="5s") as both:
        assert set(both.tokens) == {"py/a", "py/b"} and both.key == "py/b"
        assert holders(client, "py/a")[0][0] == holders(client, "py/b")[0][0] == both.lease
        assert not client.lock("py/a").acquire(blocking=False)
    assert holders(client, "py/a") == holders(client, "py/b") == []


def test_min_hold_keeps_the_key_taken_after_an_early_release(client: dlm.Client) -> None:
    with client.lock("py/hold", ttl="5s", min_hold="30s") as lock:
        pass
    assert holders(client, "py/hold") == [(lock.lease, lock.token)]
    with pytest.raises(dlm.LockHeld) as held, client.lock("py/hold", wait=0):
        pass
    assert held.value.holders
    with client._borrow() as inner:
        inner.close_lease(lock.lease)  # the test's own clean-up


def test_a_cluster_that_does_not_answer_is_unavailable() -> None:
    with (
        dlm.Client(f"127.0.0.1:{free_ports(1)[0]}", dial_timeout="0.5s") as nobody,
        pytest.raises(dlm.ClusterUnavailable),
    ):
        nobody.lock("py/none").acquire()


def test_trio_too(shared: Cluster) -> None:
    pytest.importorskip("trio")

    async def main() -> int:
        async with (
            dlm.AsyncClient(shared.members_env) as client,
            client.lock("py/trio", ttl="5s") as lock,
        ):
            return lock.token

    assert anyio.run(main, backend="trio") > 0


def test_uvloop_too(shared: Cluster) -> None:
    """uvloop's transports are not asyncio.Transport by class; the client takes them."""
    pytest.importorskip("uvloop")

    async def main() -> int:
        async with (
            dlm.AsyncClient(shared.members_env) as client,
            client.lock("py/uvloop", ttl="5s") as lock,
        ):
            return lock.token

    assert anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True}) > 0


def test_async_acquire_and_release_without_a_block(shared: Cluster) -> None:
    async def main() -> None:
        async with dlm.AsyncClient(shared.members_env) as client:
            lock = client.lock("py/async-bare", ttl="3s")
            assert await lock.acquire()
            other = client.lock("py/async-bare")
            assert not await other.acquire(blocking=False)
            renewed_from = lock.deadline
            for _ in range(100):  # a renewal comes a third of the TTL after the grant
                if lock.deadline > renewed_from:
                    break
                await anyio.sleep(0.05)
            assert lock.deadline > renewed_from, "not renewed in the background"
            await lock.extend()
            assert lock.owned() and await other.locked()
            await lock.release()
            assert await other.acquire(blocking=False) and other.token > lock.token
            await other.release()

    anyio.run(main)


def test_closing_the_client_gives_back_what_it_holds(shared: Cluster, client: dlm.Client) -> None:
    other = dlm.Client(shared.members_env, timeout="5s")
    held = other.lock("py/closed", ttl="30s")
    assert held.acquire()
    other.close()
    assert holders(client, "py/closed") == []
    assert not held.owned()


def test_a_program_that_forgets_to_close_its_client_still_exits(shared: Cluster) -> None:
    code = (
        "import dlm\n"
        "lock = dlm.Client().lock('py/forgotten', ttl='30s')\n"
        "assert lock.acquire()\n"
        "print(lock.lease, flush=True)\n"
    )
    env = {**os.environ, "DLM_CLUSTER": shared.members_env}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,  # the renewals run on daemon threads: nothing keeps it alive
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with dlm.Client(shared.members_env) as client, client._borrow() as inner:
        inner.close_lease(result.stdout.strip())  # the test's own clean-up


def test_a_held_lock_dropped_unreleased_stops_renewing(client: dlm.Client) -> None:
    lock = client.lock("py/dropped", ttl="30s")
    assert lock.acquire()
    lease = lock.lease
    renewing = f"dlm-keepalive-{lease}"
    assert any(t.name == renewing for t in threading.enumerate())
    del lock
    gc.collect()
    for thread in threading.enumerate():
        if thread.name == renewing:
            thread.join(5.0)
    assert not any(t.name == renewing for t in threading.enumerate())
    with client._borrow() as inner:
        inner.close_lease(lease)  # the test's own clean-up


def test_async_blocks_raise_plain_exceptions(shared: Cluster) -> None:
    """LockHeld from `async with lock`, and the body's own error through `async with
    client`, come out as themselves, not wrapped in an ExceptionGroup by a task group."""

    async def main() -> None:
        with pytest.raises(ValueError, match="the body's"):
            async with (
                dlm.AsyncClient(shared.members_env) as client,
                client.lock("py/async-held", ttl="5s") as first,
            ):
                with pytest.raises(dlm.LockHeld) as held:
                    async with client.lock("py/async-held", wait=0):
                        pytest.fail("taken twice")
                assert held.value.holders[0]["lease"] == first.lease
                raise ValueError("the body's own error")

    anyio.run(main)
