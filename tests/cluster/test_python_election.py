"""``client.election(name)`` (dlm/_api/election.py, aio_election.py) against real member
processes: FIFO candidates with rising epochs, proclaim seen by ``leader()`` and
``observe()``, and an async leader's body cancelled when its lease is revoked."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import dlm
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, wait_for

pytestmark = pytest.mark.cluster

WAIT_S = 30.0


@pytest.fixture
def client(shared: Cluster) -> Iterator[dlm.Client]:
    with dlm.Client(shared.members_env, timeout="5s") as made:
        yield made


@pytest.fixture
def cli(shared: Cluster, tmp_path: Path) -> Dlm:
    return Dlm(shared.members_env, tmp_path)


def test_the_second_candidate_leads_only_after_the_first_resigns_with_a_higher_epoch(
    client: dlm.Client,
) -> None:
    first = client.election("py/elect-fifo").campaign("a", ttl="10s")
    assert first.owned()
    elected: list[dlm.Leadership] = []
    failed: list[BaseException] = []

    def second_candidate() -> None:
        try:
            elected.append(client.election("py/elect-fifo").campaign("b", ttl="10s"))
        except BaseException as exc:
            failed.append(exc)

    def queued_or_done() -> bool:
        with client._borrow() as inner:
            return inner.get("py/elect-fifo").waiting > 0 or not thread.is_alive()

    thread = threading.Thread(target=second_candidate, daemon=True)
    thread.start()
    wait_for(queued_or_done, WAIT_S, "the second candidate to queue")
    assert not failed, failed
    # The second candidate is in the queue: still the first leads.
    now = client.election("py/elect-fifo").leader()
    assert now is not None and (now.lease, now.token, now.value) == (
        first.lease,
        first.token,
        "a",
    )
    assert not elected
    first.resign()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not failed, failed
    (second,) = elected
    assert second.token > first.token and second.owned()
    led = client.election("py/elect-fifo").leader()
    assert led is not None and (led.lease, led.token, led.value) == (
        second.lease,
        second.token,
        "b",
    )
    second.resign()
    assert client.election("py/elect-fifo").leader() is None


def test_proclaim_changes_what_leader_and_observe_say_only_while_leading(
    client: dlm.Client,
) -> None:
    election = client.election("py/elect-proclaim")
    seen: queue.Queue[dlm.Leader | None] = queue.Queue()

    def follow() -> None:
        # In a thread of its own, so a change that never comes fails the test (below)
        # rather than hanging it: the four changes expected, then the watch is closed.
        changes = election.observe(timeout="10s")
        for _ in range(4):
            seen.put(next(changes))
        changes.close()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert seen.get(timeout=WAIT_S) is None
    with election.campaign("v1", ttl="10s") as leading:
        shown = seen.get(timeout=WAIT_S)
        assert shown is not None and (shown.value, shown.token) == ("v1", leading.token)
        leading.proclaim("v2")
        proclaimed = seen.get(timeout=WAIT_S)
        assert proclaimed is not None
        assert (proclaimed.value, proclaimed.token, proclaimed.lease) == (
            "v2",
            leading.token,
            leading.lease,
        )
        assert proclaimed.since == shown.since  # the same election: since stays
        assert proclaimed.index > shown.index
        now = election.leader()
        assert now is not None and (now.value, now.token) == ("v2", leading.token)
        with pytest.raises(dlm.NotHolder):
            client.election("py/elect-proclaim").proclaim("usurper")
    assert seen.get(timeout=WAIT_S) is None  # resigned at the end of the block
    follower.join(WAIT_S)
    assert not follower.is_alive()
    with pytest.raises(dlm.NotHolder):
        leading.proclaim("v3")
    with pytest.raises(dlm.NotHolder):
        election.proclaim("v3")
    assert election.leader() is None


def test_an_async_leaders_body_is_cancelled_when_its_lease_is_revoked(
    shared: Cluster, cli: Dlm
) -> None:
    reached_the_end = []

    async def main() -> None:
        async with dlm.AsyncClient(shared.members_env, timeout="5s") as client:
            election = client.election("py/elect-async")
            with pytest.raises(dlm.LockLost, match="revoked"):
                async with election.campaign("x", ttl="3s") as leading:
                    now = await election.leader()
                    assert now is not None and now.lease == leading.lease
                    assert now.value == "x" and now.token == leading.token
                    revoke = await anyio.to_thread.run_sync(
                        cli.run, "lease", "revoke", leading.lease
                    )
                    assert revoke.returncode == 0, revoke.stderr
                    await anyio.sleep(WAIT_S)  # cancelled once the renewal hears of it
                    reached_the_end.append(True)
            assert leading.lost.is_set()
            with pytest.raises(dlm.NotHolder):
                await leading.proclaim("y")
            async for leader in election.observe(timeout="10s"):
                assert leader is None
                break

    anyio.run(main)
    assert not reached_the_end
