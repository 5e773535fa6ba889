"""The identity table and the permission rule (dlm/node/locks/identities.py), on their own."""

from __future__ import annotations

import pytest

from dlm.node.locks import identities as ids
from dlm.node.locks.identities import (
    ADMIN_ONLY,
    KEEP,
    KEY,
    LEASE,
    LOCK,
    QUOTA_KINDS,
    READ,
    IdentityTable,
    Verifier,
)
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
        assert set(row) == {
            "name",
            "role",
            "prefixes",
            "key_id",
            "rotating",
            "old_key_until_ms",
            *(f"max_{kind}" for kind in QUOTA_KINDS),
        }
    with pytest.raises(ValueError):
        IdentityTable.restore([["ci", "root", [], [], [0, 0, 0, 0]]])


def test_each_client_command_names_the_permission_of_its_request_kind() -> None:
    for action, permission in COMMAND_PERMISSIONS.values():
        assert permission == REQUESTS[action].PERMISSION
    assert set(ids.PERMISSIONS) >= {cls.PERMISSION for cls in REQUESTS.values()}


def test_an_admin_sets_some_limits_the_others_keep_theirs_and_zero_goes_back_to_default() -> None:
    t = table()
    assert t.limits_of("ci") == (0, 0, 0, 0)
    assert t.set_limits("ci", (2, KEEP, KEEP, 8)) is None
    assert t.limits_of("ci") == (2, 0, 0, 8)
    assert t.set_limits("ci", (KEEP, 5, KEEP, 0)) is None
    assert t.limits_of("ci") == (2, 5, 0, 0)
    assert t.limits_of("ops") == (0, 0, 0, 0)  # other identities keep theirs
    assert t.set_limits("nobody", (1, KEEP, KEEP, KEEP)) == "no identity 'nobody'"
    row = t.rows()[0]
    assert (row["max_leases"], row["max_locks"], row["max_connections"]) == (2, 5, None)
    # A rotation keeps the limits.
    t.rotate("ci", key(9), at_ms=1)
    t.finish("ci")
    assert t.limits_of("ci") == (2, 5, 0, 0)


def test_a_removal_resent_with_its_own_request_id_is_done_any_other_is_refused() -> None:
    t = table()
    assert t.remove("ci", b"first", "admin") is None
    # The same request again (its answer was lost): done, not "no identity".
    assert t.remove("ci", b"first", "admin") is None
    # Another removal (another request id, or none): the name is gone, and it says who.
    assert t.remove("ci", b"other", "ops") == (
        "no identity 'ci' (identity 'admin' removed it earlier)"
    )
    assert t.remove("ci") == "no identity 'ci' (identity 'admin' removed it earlier)"
    assert t.remove("never", b"first") == "no identity 'never'"
    # Added again: the old removal no longer answers for it.
    assert t.add("ci", "client", ("ci/",), key(1)) is None
    assert t.remove("ci", b"second", "admin") is None
    assert t.remove("ci", b"first", "admin") is not None


def test_removals_kept_are_bounded() -> None:
    t = IdentityTable()
    for n in range(ids.REMOVALS_KEPT + 5):
        t.add(f"i{n}", "client", ("x",), key(1))
        t.remove(f"i{n}", b"r%d" % n, "admin")
    assert len(t.removals_image()) == ids.REMOVALS_KEPT
    assert t.remove("i0", b"r0") == "no identity 'i0'"  # forgotten: the oldest went first
    last = ids.REMOVALS_KEPT + 4
    assert t.remove(f"i{last}", b"r%d" % last) is None


def test_the_format_4_image_keeps_limits_and_removals_and_a_format_3_table_still_opens() -> None:
    t = table()
    t.set_limits("ci", (2, KEEP, KEEP, KEEP))
    t.remove("ops", b"rq", "admin")
    again = IdentityTable.restore(t.image(), t.removals_image())
    assert again.image() == t.image() and again.removals_image() == t.removals_image()
    assert again.limits_of("ci") == (2, 0, 0, 0)
    assert again.remove("ops", b"rq") is None
    # The previous release's rows (format 3) have no limits: every identity at the default.
    old = IdentityTable.restore(t.image(with_limits=False), with_limits=False)
    assert old.names() == ["ci"] and old.limits_of("ci") == (0, 0, 0, 0)
    for bad in (
        [["ci", "client", ["ci/"], t.image()[0][3], [0, 0, 0]]],  # three limits
        [["ci", "client", ["ci/"], t.image()[0][3], [-1, 0, 0, 0]]],
    ):
        with pytest.raises(ValueError):
            IdentityTable.restore(bad)
    with pytest.raises(ValueError):
        IdentityTable.restore(t.image(), [["ops", "not bytes", "admin"]])
