"""``client.election(name)``'s pure parts (dlm/_api/election.py): who leads, read from a
key's state or from a watched change, and the campaign's terms."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import dlm
from dlm._api import options
from dlm._api.election import (
    CAMPAIGN_WAIT_S,
    campaign_meta,
    campaign_wait,
    leader_from_state,
    leader_from_watch,
)
from dlm.client.watching import Leadership as Watched
from dlm.views import LockState

GRANTED_MS = 1_764_000_000_123


def state(*holders: dict[str, object]) -> LockState:
    return LockState.from_wire({"key": "svc", "limit": 1, "holders": list(holders), "waiters": []})


def holder(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "lease": "L1",
        "token": 42,
        "granted_at_ms": GRANTED_MS,
        "held_ms": 5,
        "meta": {"value": "host-a:8080", "host": "a"},
    }
    return {**base, **changes}


def test_the_leader_is_the_first_holder_with_its_value_token_and_the_clusters_grant_time() -> None:
    found = leader_from_state("svc", state(holder()))
    assert found == dlm.Leader(
        name="svc",
        value="host-a:8080",
        token=42,
        since=datetime.fromtimestamp(GRANTED_MS / 1000, tz=UTC),
        lease="L1",
        index=42,
    )


def test_nobody_leads_a_free_key_and_a_holder_without_a_value_leads_with_the_empty_one() -> None:
    assert leader_from_state("svc", state()) is None
    assert leader_from_state("svc", state(holder(meta={"host": "a"}))).value == ""  # type: ignore[union-attr]


def test_a_holder_without_lease_or_token_is_an_answer_not_understood() -> None:
    with pytest.raises(dlm.ServerError):
        leader_from_state("svc", state(holder(token=None)))


def test_a_watched_change_says_the_leader_or_none() -> None:
    led = Watched("svc", "L2", "v", 50, GRANTED_MS, 51)
    assert leader_from_watch(led) == dlm.Leader(
        "svc", "v", 50, datetime.fromtimestamp(GRANTED_MS / 1000, tz=UTC), "L2", 51
    )
    assert leader_from_watch(Watched("svc", None, None, None, None, 60)) is None


def test_a_campaign_records_its_value_and_waits_as_long_as_it_takes_by_default() -> None:
    assert campaign_meta("x") == {"value": "x"}
    with pytest.raises(TypeError):
        campaign_meta(3)  # type: ignore[arg-type]
    assert campaign_wait(None) == CAMPAIGN_WAIT_S
    assert campaign_wait("2s") == 2.0
    with pytest.raises(ValueError, match="wait"):
        campaign_wait(0)


def test_a_lock_delay_is_zero_up_to_a_minute() -> None:
    assert options.lock_delay_ms(None) == 0
    assert options.lock_delay_ms("15s") == 15_000
    assert options.lock_delay_ms(0.5) == 500
    with pytest.raises(ValueError, match="lock_delay"):
        options.lock_delay_ms("61s")


def test_election_names_are_checked_as_lock_keys_before_any_request() -> None:
    client = dlm.Client("127.0.0.1:1")
    with pytest.raises(ValueError):
        client.election("")
    election = client.election("svc")
    assert election.name == "svc"
    with pytest.raises(dlm.NotHolder):
        election.proclaim("v")  # never campaigned: not the leader, and nothing was sent
    client.close()
