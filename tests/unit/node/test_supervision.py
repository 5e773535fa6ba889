"""supervision.py: when a member's supervisor starts a partition process again, and when
it gives up (time is passed in)."""

from __future__ import annotations

from dlm.node.supervision import (
    GIVE_UP_AFTER,
    HEALTHY_AFTER_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    GiveUp,
    Leave,
    Restart,
    RestartPolicy,
)


def test_a_child_that_never_serves_is_retried_with_growing_pauses_then_given_up() -> None:
    policy = RestartPolicy(4)
    now = 0.0
    delays = []
    for _ in range(GIVE_UP_AFTER - 1):
        policy.started(2, now)
        verdict = policy.exited(2, 1, now + 0.05)
        assert isinstance(verdict, Restart)
        delays.append(verdict.delay_s)
        now += 1.0
    assert delays == sorted(delays) and delays[0] == RETRY_FIRST_S and delays[-1] > delays[0]
    assert all(d <= RETRY_MAX_S for d in delays)
    policy.started(2, now)
    verdict = policy.exited(2, 1, now + 0.05)
    assert isinstance(verdict, GiveUp)
    assert verdict.exit_code == 1
    assert "partition 2 failed to start 5 times in a row" in verdict.message
    assert "\n" not in verdict.message


def test_other_partitions_keep_their_own_count() -> None:
    policy = RestartPolicy(2)
    for _ in range(GIVE_UP_AFTER - 1):
        policy.started(0, 0.0)
        assert isinstance(policy.exited(0, 1, 0.1), Restart)
    policy.started(1, 0.0)
    verdict = policy.exited(1, -9, 0.1)
    assert verdict == Restart(RETRY_FIRST_S)


def test_a_child_that_served_is_always_restarted_and_fast_after_a_healthy_spell() -> None:
    policy = RestartPolicy(1)
    now = 0.0
    for _ in range(3 * GIVE_UP_AFTER):
        policy.started(0, now)
        policy.serving(0, now + 0.5)
        verdict = policy.exited(0, -9, now + 1.0)
        assert isinstance(verdict, Restart)  # it served: never given up
        assert verdict.delay_s <= RETRY_MAX_S
        now += 2.0
    policy.started(0, now)
    policy.serving(0, now + 0.5)
    verdict = policy.exited(0, -9, now + 0.5 + HEALTHY_AFTER_S)
    assert verdict == Restart(RETRY_FIRST_S)


def test_a_clean_exit_is_left_and_settings_errors_stop_the_member_with_their_code() -> None:
    policy = RestartPolicy(3)
    policy.started(0, 0.0)
    assert policy.exited(0, 0, 1.0) == Leave()
    for code in (2, 65, 74, 78):
        policy.started(1, 0.0)
        verdict = policy.exited(1, code, 0.1)
        assert isinstance(verdict, GiveUp) and verdict.exit_code == code
