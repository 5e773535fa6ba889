"""A new cluster incarnation's first state (dlm/node/incarnation.py): the token jump, the
quarantine's default and warning, and the image members restore."""

from __future__ import annotations

import cbor2
import pytest

from dlm.node import locks
from dlm.node.incarnation import (
    DEFAULT_BUMP,
    INDEX_CEILING,
    MIN_QUARANTINE_MS,
    IncarnationError,
    lock_machine_of,
    new_incarnation,
    parse_bump,
)
from dlm.node.snapshots import NODE_IMAGE_FORMAT_V2

from .locks_driver import Driver


def old_cluster(*ttls: int) -> Driver:
    d = Driver(version=3)
    for n, ttl in enumerate(ttls):
        d.open(f"l{n}", ttl)
        d.acquire(f"l{n}", f"k{n}")
    return d


def image_of(d: Driver) -> bytes:
    return bytes(
        cbor2.dumps(
            {
                "format": NODE_IMAGE_FORMAT_V2,
                "locks": d.sm.snapshot(),
                "members": {},
                "removed": [],
            },
            canonical=True,
        )
    )


def test_the_new_log_starts_the_bump_above_the_old_index() -> None:
    d = old_cluster(5_000)
    new = new_incarnation(
        lock_machine_of(image_of(d)),
        last_index=d.index,
        bump=DEFAULT_BUMP,
        members={"n1": "127.0.0.1:1"},
        quarantine_ms=None,
    )
    assert new.index == d.index + 2**32
    restored = lock_machine_of(new.image)
    assert restored.applied_index == new.index and restored.version == 3
    assert cbor2.loads(new.image)["members"] == {"n1": "127.0.0.1:1"}
    assert new.counts == locks.Counts(1, 1, 0)


def test_the_default_quarantine_covers_the_longest_ttl_and_is_at_least_30s() -> None:
    short = new_incarnation(
        lock_machine_of(image_of(old_cluster(5_000))),
        last_index=10,
        bump=1,
        members={},
        quarantine_ms=None,
    )
    assert short.quarantine_ms == MIN_QUARANTINE_MS and short.warning is None
    long = new_incarnation(
        lock_machine_of(image_of(old_cluster(5_000, 120_000))),
        last_index=10,
        bump=1,
        members={},
        quarantine_ms=None,
    )
    assert long.quarantine_ms == 120_000 == long.longest_ttl_ms


def test_a_quarantine_shorter_than_the_longest_ttl_is_kept_with_a_warning_naming_it() -> None:
    new = new_incarnation(
        lock_machine_of(image_of(old_cluster(90_000))),
        last_index=10,
        bump=1,
        members={},
        quarantine_ms=10_000,
    )
    assert new.quarantine_ms == 10_000
    assert new.warning is not None and "90s" in new.warning and "10s" in new.warning
    assert lock_machine_of(new.image).quarantine == locks.Quarantine(10_000, 11)


def test_tokens_stay_below_2_to_the_53() -> None:
    with pytest.raises(IncarnationError, match="2\\*\\*52"):
        new_incarnation(
            locks.LockStateMachine(),
            last_index=INDEX_CEILING - 5,
            bump=10,
            members={},
            quarantine_ms=None,
        )


@pytest.mark.parametrize("text", ["0", "-1", "ten", str(2**52), "1.5"])
def test_a_bad_bump_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(IncarnationError, match="--bump"):
        parse_bump(text)


def test_bumps_people_write() -> None:
    assert parse_bump(None) == parse_bump("") == 2**32
    assert parse_bump("1_000_000") == 1_000_000


def test_an_image_that_is_not_one_is_refused() -> None:
    with pytest.raises(IncarnationError, match="cannot be read"):
        lock_machine_of(b"\x00garbage")


def test_a_restored_cluster_keeps_its_cluster_settings() -> None:
    # Found by the simulator's max-ttl check: a restore dropped what `dlm config set` set.
    from dlm.node.locks.settings import MAX_TTL

    d = Driver(version=5)
    d.run(locks.SettingsCommand(MAX_TTL, 10_000, "admin", d.now()))
    new = new_incarnation(
        d.sm,
        last_index=d.index,
        bump=DEFAULT_BUMP,
        members={"n1": "127.0.0.1:1"},
        quarantine_ms=None,
    )
    restored = lock_machine_of(new.image)
    assert restored.settings.get(MAX_TTL) == 10_000
