"""The identity table and the permission rule (dlm/node/locks/identities.py), on their own."""

from __future__ import annotations

import pytest

from dlm.node.locks import identities as ids
from dlm.node.locks.identities import ADMIN_ONLY, KEY, LEASE, LOCK, READ, IdentityTable, Verifier
from dlm.node.locks.machine import COMMAND_PERMISSIONS
from dlm.wire import REQUESTS


def key(n: int) -> Verifier:
    return Verifier(bytes([n]) * 8, bytes([n]) * 32, bytes([n + 1]) * 32)


def table() -> IdentityTable:
    t = IdentityTable()
    assert t.add("ci", "client", ("ci/",), key(1)) is None
    assert t.add("ops", "admin", (), key(3)) is None
    return t


def test_the_rule_names_the_identity_the_action_and_what_it_lacks() -> None:
    t = table()
    assert ids.refusal(t, "ci", "acquire", LOCK, key="ci/build", owner="ci") is None
    assert ids.refusal(t, "ci", "acquire", LOCK, key="prod/x", owner="ci") == (
        "identity 'ci' may not acquire 'prod/x': it lacks a prefix for it (its prefixes: 'ci/')"
    )
    assert ids.refusal(t, "ci", "release", LEASE, owner="admin") == (
        "identity 'ci' may not release on a lease opened by identity 'admin': "
        "it lacks the admin role"
    )
    assert ids.refusal(t, "ci", "member_remove", ADMIN_ONLY) == (
        "identity 'ci' may not member_remove: it lacks the admin role"
    )
    assert (
        ids.refusal(t, "gone", "list", READ) == "identity 'gone' may not list: it no longer exists"
    )
    for who in ("admin", "ops"):
        assert ids.refusal(t, who, "member_remove", ADMIN_ONLY) is None
        assert ids.refusal(t, who, "release", LEASE, owner="ci") is None
    assert ids.refusal(t, "ci", "get", KEY, key="cia") is not None


def test_rotation_keeps_the_old_key_for_a_day_or_until_finish() -> None:
    t = table()
    assert t.rotate("ci", key(5), at_ms=1_000) is None
    assert t.verifier("ci", key(5).key_id, 2_000) == key(5)
    assert t.verifier("ci", key(1).key_id, 1_000 + ids.ROTATION_GRACE_MS - 1) is not None
    assert t.verifier("ci", key(1).key_id, 1_000 + ids.ROTATION_GRACE_MS) is None
    assert t.rows(2_000)[0]["rotating"] is True
    assert t.finish("ci") is None
    assert t.verifier("ci", key(1).key_id, 2_000) is None
    assert t.rows(2_000)[0]["rotating"] is False


def test_adds_are_idempotent_by_key_and_admin_is_reserved() -> None:
    t = table()
    assert t.add("ci", "client", ("ci/",), key(1)) is None  # a re-sent add
    assert t.add("ci", "client", ("x/",), key(7)) is not None
    assert t.add("admin", "admin", (), key(7)) is not None
    assert t.remove("nobody") == "no identity 'nobody'"


def test_an_image_restores_the_same_table_and_holds_no_secret_rows_in_listings() -> None:
    t = table()
    t.rotate("ci", key(5), at_ms=10)
    again = IdentityTable.restore(t.image())
    assert again.image() == t.image()
    for row in again.rows():
        assert set(row) == {"name", "role", "prefixes", "key_id", "rotating", "old_key_until_ms"}
    with pytest.raises(ValueError):
        IdentityTable.restore([["ci", "root", [], []]])


def test_each_client_command_names_the_permission_of_its_request_kind() -> None:
    for action, permission in COMMAND_PERMISSIONS.values():
        assert permission == REQUESTS[action].PERMISSION
    assert set(ids.PERMISSIONS) >= {cls.PERMISSION for cls in REQUESTS.values()}
