"""`dlm members list|add|remove|promote` on canned cluster replies: the three formats, roles as
people read them, escaping, what is checked before connecting, and the exit code of each refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dlm.cli.main import run
from dlm.client.errors import BadRequest, ChangeInProgress, ClusterUnavailable, UnsafeChange
from dlm.views import MembersView, StatusView
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]

ADDRS = {"n1": "127.0.0.1:7701", "n2": "127.0.0.1:7702", "n3": "127.0.0.1:7703"}


def listed(node: str, role: str, *, match: int = 500, lag: int | None = 0) -> dict[str, Any]:
    return {
        "id": node,
        "address": ADDRS.get(node, f"127.0.0.1:77{node[1:]:>02}"),
        "role": role,
        "match": match,
        "lag": lag,
        "reachable": lag is not None,
        "last_contact_ms": 0 if lag is not None else None,
    }


class Canned:
    """The leader's membership view, each member's own answer, and what a change does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.view: dict[str, Any] = {
            "members": [
                listed("n1", "leader"),
                listed("n2", "follower"),
                listed("n3", "follower", lag=3),
            ],
            "leader": "n1",
            "bootstrap": dict(ADDRS),
        }
        self.roles: dict[str, str | None] = {"n1": "leader", "n2": "follower", "n3": "follower"}
        self.error: Exception | None = None
        """What a change raises."""
        self.list_error: Exception | None = None
        """What reading the membership raises."""
        canned = self

        def members_view(self: FakeClient) -> MembersView:
            self._call("members_view")
            if canned.list_error is not None:
                raise canned.list_error
            return MembersView.from_wire(canned.view)

        def change(name: str) -> Any:
            def call(self: FakeClient, *args: Any, **options: Any) -> MembersView:
                self._call(name, *args, **options)
                if canned.error is not None:
                    raise canned.error
                return MembersView.from_wire(canned.view)

            return call

        def member_status(self: FakeClient, addr: str, timeout: float = 2.0) -> Any:
            for member in canned.view["members"]:
                role = canned.roles.get(member["id"])
                if member["address"] == addr and role is not None:
                    return StatusView.from_wire({"node": member["id"], "role": role, "term": 4})
            return None

        monkeypatch.setattr(FakeClient, "members_view", members_view, raising=False)
        for name in ("add_member", "remove_member", "promote_member"):
            monkeypatch.setattr(FakeClient, name, change(name), raising=False)
        monkeypatch.setattr(FakeClient, "member_status", member_status)


@pytest.fixture
def canned(fake_cluster: type[FakeClient], monkeypatch: pytest.MonkeyPatch) -> Canned:
    monkeypatch.setenv("DLM_CLUSTER", ",".join(ADDRS.values()))
    return Canned(monkeypatch)


def one_json(out: str) -> dict[str, Any]:
    lines = out.splitlines()
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def calls(name: str) -> list[Any]:
    return [args for client in FakeClient.instances for n, args in client.calls if n == name]


# ---------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------


def test_list_json_has_every_member_with_role_reachable_and_lag(
    canned: Canned, capsys: Capture
) -> None:
    canned.view["members"].append(listed("n4", "learner", match=120, lag=380))
    canned.roles["n4"] = "learner"
    assert run(["members", "list", "--json"]) == 0
    obj = one_json(capsys.readouterr().out)
    assert obj["leader"] == "n1"
    assert [(m["id"], m["role"], m["voter"], m["reachable"], m["lag"]) for m in obj["members"]] == [
        ("n1", "leader", True, True, 0),
        ("n2", "follower", True, True, 0),
        ("n3", "follower", True, True, 3),
        ("n4", "learner", False, True, 380),
    ]
    assert obj["members"][3]["match"] == 120
    assert obj["members"][0]["address"] == ADDRS["n1"]


def test_list_says_why_a_learner_is_not_a_voter(canned: Canned, capsys: Capture) -> None:
    stranger = listed("mallory", "learner", match=0, lag=None)
    stranger["reason"] = "never proved the peer secret"
    canned.view["members"].append(stranger)
    canned.roles["mallory"] = None
    assert run(["members", "list", "--json"]) == 0
    members = one_json(capsys.readouterr().out)["members"]
    assert [m["reason"] for m in members] == ["", "", "", "never proved the peer secret"]
    assert run(["members", "list", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[-1] == "mallory is not a voter: never proved the peer secret"


def test_a_member_that_does_not_answer_is_unknown_unreachable_and_has_no_lag(
    canned: Canned, capsys: Capture
) -> None:
    canned.view["members"][2] = listed("n3", "unknown", match=400, lag=None)
    canned.roles["n3"] = None
    assert run(["members", "list", "--json"]) == 0
    n3 = one_json(capsys.readouterr().out)["members"][2]
    assert (n3["role"], n3["reachable"], n3["lag"], n3["match"]) == ("unknown", False, None, 400)


def test_a_member_the_leader_does_not_hear_is_unreachable_in_its_own_role(
    canned: Canned, capsys: Capture
) -> None:
    canned.view["members"][2] = listed("n3", "unknown", match=400, lag=None)
    canned.roles["n3"] = "pre_candidate"  # cut off from the leader, but not from us
    assert run(["members", "list", "--json"]) == 0
    n3 = one_json(capsys.readouterr().out)["members"][2]
    assert (n3["role"], n3["reachable"], n3["lag"]) == ("candidate", False, None)


@pytest.mark.parametrize(
    ("own", "leader_says", "shown"),
    [
        ("pre_candidate", "follower", "candidate"),
        ("candidate", "unknown", "candidate"),
        ("learner", "follower", "follower"),  # promoted; it has not heard yet
        ("follower", "learner", "learner"),  # the leader's configuration decides
        ("strange", "follower", "unknown"),
    ],
)
def test_roles_are_the_members_own_words_for_people(
    canned: Canned, capsys: Capture, own: str, leader_says: str, shown: str
) -> None:
    canned.view["members"][1]["role"] = leader_says
    canned.roles["n2"] = own
    assert run(["members", "list", "--json"]) == 0
    assert one_json(capsys.readouterr().out)["members"][1]["role"] == shown


def test_list_is_tsv_when_piped_and_escapes_what_members_say(
    canned: Canned, capsys: Capture
) -> None:
    canned.view["members"][1]["id"] = "n2\tx\n"
    assert run(["members", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == [
        "id", "address", "role", "voter", "reachable", "match", "lag", "last_contact_ms",
        "reason",
    ]  # fmt: skip
    assert len(lines) == 4
    assert lines[1].split("\t") == [
        "n1", ADDRS["n1"], "leader", "yes", "yes", "500", "0", "0", "",
    ]  # fmt: skip
    assert lines[2].startswith("n2\\tx\\n\t")
    assert all(len(line.split("\t")) == 9 for line in lines)


def test_list_table_marks_the_leader(canned: Canned, capsys: Capture) -> None:
    canned.roles["n3"] = None
    assert run(["members", "list", "--format", "table"]) == 0
    out = capsys.readouterr().out
    header, _, *rows = out.splitlines()
    assert header.split() == [
        "ID",
        "ADDRESS",
        "ROLE",
        "REACHABLE",
        "MATCH",
        "LAG",
        "LAST",
        "CONTACT",
    ]
    assert rows[0].split()[:3] == ["n1", "*", ADDRS["n1"]]
    assert rows[2].split()[:4] == ["n3", ADDRS["n3"], "unknown", "no"]


def test_no_quorum_exits_69(canned: Canned, capsys: Capture) -> None:
    canned.list_error = ClusterUnavailable("the cluster found no leader with a quorum in 10s")
    assert run(["members", "list"]) == 69
    assert "no leader with a quorum" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# changes
# ---------------------------------------------------------------------------


def test_add_sends_the_id_and_address_and_prints_the_new_membership(
    canned: Canned, capsys: Capture
) -> None:
    canned.view["members"].append(listed("n4", "learner", match=0, lag=None))
    assert run(["members", "add", "n4", "127.0.0.1:7704", "--json"]) == 0
    assert calls("add_member") == [("n4", "127.0.0.1:7704")]
    obj = one_json(capsys.readouterr().out)
    assert obj["added"] == {"id": "n4", "address": "127.0.0.1:7704"}
    assert obj["members"][3]["role"] == "learner" and obj["members"][3]["reachable"] is False
    assert run(["members", "add", "n4", "127.0.0.1:7704", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("added n4 (127.0.0.1:7704) as a learner")
    assert "start it with dlm node start --id n4 --listen 127.0.0.1:7704 --join " in out


def test_remove_passes_force_and_promote_the_id(canned: Canned, capsys: Capture) -> None:
    assert run(["members", "remove", "n3", "--force", "--json"]) == 0
    assert calls("remove_member") == [("n3",)]
    assert FakeClient.instances[-1].options["remove_member"] == {"force": True}
    assert one_json(capsys.readouterr().out)["removed"] == {"id": "n3"}
    assert run(["members", "remove", "n3"]) == 0
    assert FakeClient.instances[-1].options["remove_member"] == {"force": False}
    capsys.readouterr()
    assert run(["members", "promote", "n3", "--format", "table"]) == 0
    assert calls("promote_member") == [("n3",)]
    assert capsys.readouterr().out.startswith("promoted n3: it is a voter now\n")


@pytest.mark.parametrize(
    ("error", "code", "words"),
    [
        (BadRequest("the cluster refused the request: n2 is already a member"), 2, "already"),
        (
            UnsafeChange("the cluster did not make the change: ... or insist with --force"),
            2,
            "force",
        ),
        (
            ChangeInProgress("the cluster did not make the change: ... retry in a moment"),
            75,
            "retry",
        ),
        (ClusterUnavailable("the cluster found no leader with a quorum within 10s"), 69, "quorum"),
    ],
)
def test_refusals_exit_with_their_code_and_one_line(
    canned: Canned, capsys: Capture, error: Exception, code: int, words: str
) -> None:
    canned.error = error
    assert run(["members", "remove", "n2"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and words in captured.err
    assert run(["members", "add", "n4", "127.0.0.1:7704", "--json"]) == code
    assert one_json(capsys.readouterr().out)["error"]["code"] == error.code  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "args",
    [
        ["members", "add", "n4", "127.0.0.1:99999"],
        ["members", "add", "n4", "http://127.0.0.1:7704"],
        ["members", "add", "-n4", "127.0.0.1:7704"],
        ["members", "add", "n 4", "127.0.0.1:7704"],
        ["members", "remove", "n" * 64],
        ["members", "promote", "n4/x"],
        ["members", "add", "n4"],
    ],
)
def test_bad_arguments_are_usage_errors_before_connecting(
    canned: Canned, capsys: Capture, args: list[str]
) -> None:
    assert run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlm: ") and err.count("\n") == 1
    assert FakeClient.instances == []
