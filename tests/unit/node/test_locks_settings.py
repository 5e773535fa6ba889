"""The cluster-wide settings (`dlm config set`, cluster version 5): the pure table
(dlm/node/locks/settings.py), its log entry, and what the lock machine does with it."""

from __future__ import annotations

import pytest

from dlm.node.locks import (
    ClusterSettings,
    Invalid,
    LeaseOpened,
    LeaseUpdated,
    SettingChanged,
    SettingsCommand,
    decode_command,
    encode_command,
    validate_command,
)
from dlm.node.locks.settings import DEFAULT_TTL, LOCK_DELAY, MAX_TTL, setting_problem

from .locks_driver import Driver


def test_a_setting_is_set_unset_and_refused_out_of_its_bounds() -> None:
    table = ClusterSettings()
    assert table.set(MAX_TTL, 10_000) is None
    assert table.get(MAX_TTL) == 10_000
    assert table.rows() == {DEFAULT_TTL: None, LOCK_DELAY: None, MAX_TTL: 10_000}
    assert table.set(MAX_TTL, 0) is None
    assert table.get(MAX_TTL) == 0 and table.rows()[MAX_TTL] is None
    for key, value in ((MAX_TTL, 999), (DEFAULT_TTL, 86_400_001), (LOCK_DELAY, 60_001)):
        problem = table.set(key, value)
        assert problem is not None and "\n" not in problem and key in problem
        assert table.get(key) == 0
    assert setting_problem("max-tll", 5_000) is not None


def test_the_table_survives_its_image_and_a_malformed_image_is_refused() -> None:
    table = ClusterSettings()
    table.set(DEFAULT_TTL, 45_000)
    table.set(LOCK_DELAY, 2_000)
    assert ClusterSettings.restore(table.image()) == table
    assert ClusterSettings.restore(None) == ClusterSettings()
    for bad in ("x", [["max-ttl"]], [["max-ttl", "10s"]], [["max-ttl", 5]], [["nope", 5_000]]):
        with pytest.raises(ValueError):
            ClusterSettings.restore(bad)


def test_max_ttl_names_the_limit_on_one_line() -> None:
    table = ClusterSettings()
    assert table.ttl_problem(60_000) is None
    table.set(MAX_TTL, 10_000)
    problem = table.ttl_problem(60_000)
    assert problem is not None and "max-ttl" in problem and "10s" in problem and "60s" in problem
    assert table.ttl_problem(10_000) is None


def test_the_entry_round_trips_and_is_validated() -> None:
    cmd = SettingsCommand(MAX_TTL, 10_000, "admin", 123)
    assert decode_command(encode_command(cmd)) == cmd
    assert validate_command(cmd) is None
    assert validate_command(SettingsCommand("nope", 10_000, "admin", 1)) is not None
    assert validate_command(SettingsCommand(MAX_TTL, 5, "admin", 1)) is not None


def test_before_version_5_every_replica_refuses_the_entry_alike() -> None:
    d = Driver(version=4)
    outcome = d.run(SettingsCommand(MAX_TTL, 10_000, "admin", d.now()))
    assert isinstance(outcome.result, Invalid) and "version 5" in outcome.result.message
    assert d.sm.settings.get(MAX_TTL) == 0


def test_at_version_5_max_ttl_is_enforced_at_apply_on_opens_and_updates() -> None:
    d = Driver(version=5)
    assert isinstance(d.open("early", ttl_ms=60_000).result, LeaseOpened)
    outcome = d.run(SettingsCommand(MAX_TTL, 10_000, "admin", d.now()))
    assert outcome.result == SettingChanged(MAX_TTL, 10_000)
    refused = d.open("late", ttl_ms=60_000)
    assert isinstance(refused.result, Invalid) and "max-ttl" in refused.result.message
    assert d.sm.lease("late") is None
    assert isinstance(d.open("short", ttl_ms=5_000).result, LeaseOpened)
    assert isinstance(d.update("short", 60_000).result, Invalid)
    assert isinstance(d.update("short", 9_000).result, LeaseUpdated)
    # A lease opened before keeps its TTL (nothing is cut short under it).
    view = d.sm.lease("early")
    assert view is not None and view.ttl_ms == 60_000


def test_the_leader_fills_in_default_ttl_and_lock_delay_and_refuses_above_max_ttl() -> None:
    from dlm.node.machine_config import Quotas
    from dlm.node.outbox import Instant
    from dlm.node.proposals import DEFAULT_TTL_MS, Refusal, command_for
    from dlm.wire import OpenLease, UpdateLease

    d = Driver(version=5)
    now = Instant(1.0, 5_000)

    def build(req: OpenLease | UpdateLease) -> object:
        return command_for(req, now, d.sm, Quotas(), lambda lease: False, identity="admin")

    bare = OpenLease(id=1, lease="L", ttl_ms=None, client="c", seq=1)
    cmd = build(bare)
    assert getattr(cmd, "ttl_ms", None) == DEFAULT_TTL_MS
    assert getattr(cmd, "lock_delay_ms", None) == 0
    d.run(SettingsCommand(DEFAULT_TTL, 45_000, "admin", d.now()))
    d.run(SettingsCommand(LOCK_DELAY, 2_000, "admin", d.now()))
    cmd = build(bare)
    assert getattr(cmd, "ttl_ms", None) == 45_000
    assert getattr(cmd, "lock_delay_ms", None) == 2_000
    # A lease that names its lock-delay (0 included) keeps it.
    named = OpenLease(id=1, lease="L", ttl_ms=5_000, lock_delay_ms=0, client="c", seq=1)
    assert getattr(build(named), "lock_delay_ms", None) == 0

    d.run(SettingsCommand(MAX_TTL, 10_000, "admin", d.now()))
    for req in (
        OpenLease(id=1, lease="L", ttl_ms=60_000, client="c", seq=1),
        UpdateLease(id=1, lease="L", ttl_ms=60_000, client="c", seq=2),
        bare,  # the default-ttl of 45s is above max-ttl too
    ):
        with pytest.raises(Refusal) as refused:
            build(req)
        assert "max-ttl" in refused.value.message
        assert refused.value.extra.get("limit") == "max_ttl"


def test_before_version_5_the_leader_refuses_config_set_and_get_with_one_line() -> None:
    from dlm.node.outbox import Instant
    from dlm.node.proposals import Refusal, settings_command
    from dlm.node.settings_reply import settings_reply
    from dlm.wire import ConfigGet, ConfigSet, ErrorCode

    d = Driver(version=4)
    with pytest.raises(Refusal) as refused:
        settings_command(
            ConfigSet(id=1, setting=MAX_TTL, value_ms=10_000), "admin", Instant(1.0, 5), d.sm
        )
    assert refused.value.code is ErrorCode.UNAVAILABLE
    assert "version 5" in refused.value.message and "\n" not in refused.value.message
    reply = settings_reply(ConfigGet(id=2), d.sm)
    assert reply["t"] == "error" and reply["code"] == "UNAVAILABLE"

    d.raise_version(5)
    cmd = settings_command(
        ConfigSet(id=1, setting=MAX_TTL, value_ms=10_000), "admin", Instant(1.0, 5), d.sm
    )
    assert cmd == SettingsCommand(MAX_TTL, 10_000, "admin", 5)
    assert settings_reply(ConfigGet(id=2, setting=MAX_TTL), d.sm)["settings"] == {MAX_TTL: None}
    assert settings_reply(ConfigGet(id=3, setting="nope"), d.sm)["code"] == "BAD_REQUEST"
