"""The pure comparison behind SIGHUP (dlm/node/settings_diff.py): what changes live, what
is refused, and that every setting of `dlm node start` is one or the other."""

from __future__ import annotations

from dlm.node.runtime.config.options import NODE_OPTIONS
from dlm.node.settings_diff import LIVE, RESTART_ONLY, SettingsDiff, diff_settings, flag_of


def test_every_setting_of_node_start_is_either_live_or_restart_only() -> None:
    params = {option.param for option in NODE_OPTIONS}
    assert params == set(LIVE) | set(RESTART_ONLY)
    assert not set(LIVE) & set(RESTART_ONLY)


def test_flag_of_names_each_setting_as_the_user_gives_it() -> None:
    flags = {option.param: option.flag for option in NODE_OPTIONS}
    for param, flag in flags.items():
        assert flag_of(param) == flag


def test_nothing_changed_is_an_empty_diff() -> None:
    settings = {"listen": "127.0.0.1:7700", "log_level": "info", "max_leases": None}
    assert diff_settings(settings, dict(settings)) == SettingsDiff()


def test_live_settings_are_changes_and_restart_only_ones_refusals() -> None:
    old = {"log_level": "info", "max_leases": "10", "listen": "127.0.0.1:7700", "node_id": "n1"}
    new = {"log_level": "debug", "max_leases": "5", "listen": "127.0.0.1:7800", "node_id": "n1"}
    diff = diff_settings(old, new)
    assert diff.changes == ("log_level", "max_leases")
    assert diff.refusals == ("listen",)
    assert diff.refused


def test_a_setting_added_or_removed_counts_as_changed_and_an_empty_value_as_unset() -> None:
    diff = diff_settings({"metrics_listen": None}, {"metrics_listen": "127.0.0.1:9100"})
    assert diff.changes == ("metrics_listen",)
    assert diff_settings({"log_level": None}, {"log_level": " "}) == SettingsDiff()
    assert diff_settings({}, {"partitions": "2"}).refusals == ("partitions",)


def test_a_setting_nobody_declared_live_is_refused() -> None:
    diff = diff_settings({"future_knob": "1"}, {"future_knob": "2"})
    assert diff.refusals == ("future_knob",)


def test_the_refusal_line_names_every_flag_on_one_line() -> None:
    diff = diff_settings(
        {"listen": "a:1", "data": "x", "log_level": "info"},
        {"listen": "a:2", "data": "y", "log_level": "debug"},
    )
    line = diff.refusal_line()
    assert "\n" not in line
    assert "--listen" in line and "--data" in line
    assert "--log-level" not in line
    assert "restart" in line
