"""The checks a SIGHUP makes before it applies anything (dlm/node/runtime/reload.py)."""

from __future__ import annotations

from pathlib import Path

from dlm.node.runtime.reload import Plan, prepare, security_after
from dlm.node.runtime.security import NodeSecurity

LISTEN = ("127.0.0.1", 7700)


def _base(tmp_path: Path) -> dict[str, str | None]:
    return {"node_id": "n1", "listen": "127.0.0.1:7700", "data": str(tmp_path / "d")}


def test_a_reload_that_changes_only_live_settings_is_planned(tmp_path: Path) -> None:
    current = _base(tmp_path)
    plan = prepare(current, lambda: {**current, "log_level": "debug", "max_leases": "5"}, LISTEN)
    assert isinstance(plan, Plan)
    assert plan.diff.changes == ("log_level", "max_leases")
    assert plan.config.quotas.max_leases == 5


def test_a_bad_value_or_a_restart_only_setting_refuses_the_whole_reload(tmp_path: Path) -> None:
    current = _base(tmp_path)
    for new in (
        {**current, "max_leases": "many"},
        {**current, "log_level": "loud"},
        {**current, "listen": "127.0.0.1:7800", "log_level": "debug"},
        {**current, "peer_secret_file": str(tmp_path / "peer.secret")},
        {**current, "tls_cert": "a", "tls_key": "b", "tls_ca": "c"},
    ):
        refused = prepare(current, lambda new=new: new, LISTEN)  # type: ignore[misc]
        assert isinstance(refused, str) and "\n" not in refused, new


def test_a_replaced_secret_is_kept_as_the_previous_until_the_next_reload() -> None:
    first = NodeSecurity(peer_secret=b"a" * 32, client_secret=b"c" * 32)
    second = security_after(first, NodeSecurity(peer_secret=b"b" * 32, client_secret=b"c" * 32))
    assert second.previous_peer_secret == b"a" * 32 and second.previous_client_secret is None
    third = security_after(second, NodeSecurity(peer_secret=b"b" * 32, client_secret=b"c" * 32))
    assert third.previous_peer_secret is None
