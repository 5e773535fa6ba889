"""The command line against a scripted client: arguments, output formats, exit codes.

Everything goes through dlm.cli.main.run, as `dlm ARGS...` would, and checks
what a script would see: the exit code, stdout and the one line on stderr.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from dlm.cli.main import run, wants_json
from dlm.client.core import ReleaseOutcome
from dlm.client.errors import (
    BadRequest,
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    ServerError,
)
from dlm.views import LockState
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]


def one_json(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dlm: ")
    assert "Traceback" not in err
    return lines[0]


# --- help and usage ------------------------------------------------------------


def test_help_lists_the_exit_codes_and_every_subcommand(capsys: Capture) -> None:
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    for code in ("69", "75", "77", "128+N"):
        assert code in out
    for command in ("acquire", "renew", "release", "exec", "status", "locks", "node", "store"):
        assert command in out
    assert "DLM_CLUSTER" in out


@pytest.mark.parametrize(
    "args",
    [
        ["acquire"],
        ["acquire", "k", "--bogus"],
        ["acquire", "k", "--ttl", "soon"],
        ["acquire", "k", "--wait", "-1s"],
        ["acquire", "k", "--ttl", "0s"],
        ["acquire", "k", "--limit", "0"],
        ["acquire", "k", "--limit", "many"],
        ["acquire", "k", "--meta", "novalue"],
        ["acquire", "k", "--format", "yaml"],
        ["release", "k"],
        ["renew"],
        ["exec", "--lock", "k"],
        ["exec", "--", "true"],
        ["exec", "--lock", "k", "--kill-grace", "later", "--", "true"],
        ["exec", "--lock", "k", "--conflict-exit-code", "256", "--", "true"],
        ["--timeout", "0s", "status"],
        ["status", "--timeout", "never"],
        ["--cluster", "host:notaport", "status"],
        ["frobnicate"],
        # Checked against dlm.limits before connecting, naming the option:
        ["acquire", ""],
        ["acquire", "k", "--ttl", "500ms"],
        ["acquire", "k", "--ttl", "25h"],
        ["acquire", "k", "--limit", "5000"],
        ["acquire", "k", "--lease", "not a lease"],
        ["acquire", "k", "--meta", "bad\x01name=v"],
        ["acquire", "k", "--meta", f"big={'v' * 257}"],
        ["release", "", "--lease", "abc"],
        ["release", "k", "--lease", "a/b"],
        ["renew", "a/b"],
        ["exec", "--lock", "", "--", "true"],
        ["exec", "--lock", "k", "--ttl", "25h", "--", "true"],
        ["exec", "--lock", "k", "--limit", "2000", "--", "true"],
        ["status", "x" * 513],
        ["--cluster", "http://10.0.0.1:7700", "status"],
        ["acquire", "k", "--cluster", "10.0.0.1:7700,https://10.0.0.2"],
        ["--dial-timeout", "0s", "status"],
        ["acquire", "k", "--dial-timeout", "soon"],
        ["release", "k", "--lease", "abc", "--token", "0"],
        ["release", "k", "--lease", "abc", "--token", "seven"],
        ["release", "k", "--lease", "abc", "--token", "9223372036854775808"],
        ["release", "k", "--lease", "abc", "--keep-lease=yes"],
        ["exec", "--lock", "k", "--min-hold", "24h", "--", "true"],
        ["exec", "--lock", "k", "--min-hold", "soon", "--", "true"],
        ["lease", "revoke"],
        ["lease", "revoke", "a/b"],
    ],
)
def test_usage_errors_exit_2_with_one_line_or_one_json_object(
    args: list[str], capsys: Capture, fake_cluster: type[FakeClient]
) -> None:
    assert run(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    one_error_line(captured.err)

    cut = args.index("--") if "--" in args else len(args)
    assert run([*args[:cut], "--json", *args[cut:]]) == 2
    error = one_json(capsys.readouterr().out)["error"]
    assert error["code"] == "USAGE"
    assert error["message"]
    assert not any(c for c in FakeClient.instances if c.calls), "no request on a usage error"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["acquire", ""], "bad KEY: a lock key must not be empty"),
        (
            ["acquire", "k", "--ttl", "48h"],
            "bad --ttl: a lease TTL must be between 1s and 24h (got 48h)",
        ),
        (
            ["exec", "--lock", "k", "--ttl", "500ms", "--", "true"],
            "bad --ttl: a lease TTL must be between 1s and 24h (got 500ms)",
        ),
        (["acquire", "k", "--ttl", "1d"], "bad --ttl: '1d' is not a duration"),
        (["exec", "--lock", "", "--", "true"], "bad --lock: a lock key must not be empty"),
        (["acquire", "k", "--limit", "5000"], "bad --limit: a limit must be between 1"),
        (["renew", "a/b"], "bad LEASE: a lease id is 1 to 64 characters"),
        (
            ["--cluster", "http://10.0.0.1:7700", "locks"],
            "--cluster takes HOST:PORT[,HOST:PORT...], not a URL",
        ),
        (["--dial-timeout", "0s", "locks"], "--dial-timeout must be more than 0"),
        (
            ["exec", "--lock", "k", "--min-hold", "24h", "--", "true"],
            "bad --min-hold: a minimum hold must be shorter than 24h (got 24h)",
        ),
        (["lease", "revoke", "a/b"], "bad ID: a lease id is 1 to 64 characters"),
    ],
)
def test_bad_values_name_their_option(
    args: list[str], message: str, capsys: Capture, fake_cluster: type[FakeClient]
) -> None:
    assert run(args) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_a_url_in_dlm_cluster_names_the_variable(
    capsys: Capture, fake_cluster: type[FakeClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLM_CLUSTER", "http://10.0.0.1:7700")
    assert run(["locks"]) == 2
    assert "DLM_CLUSTER takes HOST:PORT" in one_error_line(capsys.readouterr().err)


def test_dial_timeout_reaches_the_client(capsys: Capture, fake_cluster: type[FakeClient]) -> None:
    assert run(["locks", "--json"]) == 0
    assert FakeClient.instances[-1].dial_timeout == 2.0
    assert run(["--dial-timeout", "300ms", "locks", "--json"]) == 0
    assert FakeClient.instances[-1].dial_timeout == 0.3
    capsys.readouterr()


def test_no_arguments_prints_help_and_exits_2(capsys: Capture) -> None:
    assert run([]) == 2
    assert "Usage:" in capsys.readouterr().err


def test_json_is_detected_before_parsing_but_not_inside_cmd() -> None:
    assert wants_json(["acquire", "--json"])
    assert wants_json(["--json", "status"])
    assert wants_json(["acquire", "k", "--format", "json"])
    assert not wants_json(["exec", "--lock", "k", "--", "tool", "--json"])
    assert not wants_json(["status"])


# --- global options --------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--json", "--cluster", "10.0.0.1:7000,10.0.0.2", "--timeout", "3s", "locks"],
        ["locks", "--json", "--cluster", "10.0.0.1:7000,10.0.0.2", "--timeout", "3s"],
        ["--cluster", "10.0.0.9:1", "locks", "--json", "--cluster", "10.0.0.1:7000,10.0.0.2",
         "--timeout", "3s"],
    ],
)  # fmt: skip
def test_global_options_before_or_after_the_subcommand(
    args: list[str], capsys: Capture, fake_cluster: type[FakeClient]
) -> None:
    assert run(args) == 0
    assert one_json(capsys.readouterr().out) == {"prefix": "", "locks": []}
    (client,) = FakeClient.instances
    assert client.members == ["10.0.0.1:7000", "10.0.0.2:7700"]
    assert client.timeout == 3.0


def test_cluster_comes_from_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: Capture, fake_cluster: type[FakeClient]
) -> None:
    assert run(["locks"]) == 0
    assert FakeClient.instances[-1].members == ["127.0.0.1:7700"]
    assert FakeClient.instances[-1].timeout == 10.0
    monkeypatch.setenv("DLM_CLUSTER", "a:1,b:2")
    assert run(["locks"]) == 0
    assert FakeClient.instances[-1].members == ["a:1", "b:2"]
    assert run(["--cluster", "c:3", "locks"]) == 0
    assert FakeClient.instances[-1].members == ["c:3"]
    capsys.readouterr()


# --- acquire ------------------------------------------------------------------------


def test_acquire_json_has_the_contract_fields(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["acquire", "deploy", "--ttl", "45s", "--json"]) == 0
    obj = one_json(capsys.readouterr().out)
    assert obj == {"key": "deploy", "token": 4242, "lease": "fakelease0000001", "ttl_ms": 45000}
    (client,) = FakeClient.instances
    assert [c[0] for c in client.calls] == ["open_lease", "acquire"]
    assert client.calls[0][1] == (45000,)


def test_acquire_opens_an_ephemeral_lease_that_names_its_owner(
    capsys: Capture, fake_cluster: Any
) -> None:
    assert run(["acquire", "deploy", "--meta", "job=ci"]) == 0
    (client,) = FakeClient.instances
    opened = client.options["open_lease"]
    assert opened["ephemeral"] is True
    assert opened["meta"]["job"] == "ci"
    assert {"host", "user", "pid"} <= set(opened["meta"])
    assert opened["meta"] == client.calls[1][1][4]  # the lock's owner is the lease's
    capsys.readouterr()


def test_acquire_format_env_can_be_evaluated(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["acquire", "it's a key", "--format", "env"]) == 0
    out = capsys.readouterr().out
    values = dict(shlex.split(line)[0].split("=", 1) for line in out.splitlines())
    assert values == {
        "DLM_LOCK_KEY": "it's a key",
        "DLM_FENCING_TOKEN": "4242",
        "DLM_LEASE_ID": "fakelease0000001",
    }


def test_acquire_text_and_defaults(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["acquire", "k", "--meta", "job=nightly", "--meta", "host=override"]) == 0
    assert capsys.readouterr().out.startswith("acquired k: token 4242, lease fakelease0000001")
    (client,) = FakeClient.instances
    assert client.calls[0][1] == (None,)  # no --ttl: the cluster's default-ttl
    _, (_lease, key, wait, limit, meta) = client.calls[1]
    assert (key, wait, limit) == ("k", None, 1)
    assert meta["job"] == "nightly"
    assert meta["host"] == "override"
    assert {"user", "pid"} <= set(meta)


def test_acquire_with_an_existing_lease_and_wait(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["acquire", "k", "--lease", "mylease", "--wait", "1m30s", "--limit", "3"]) == 0
    (client,) = FakeClient.instances
    assert [c[0] for c in client.calls] == ["acquire"]
    _, (lease, _key, wait, limit, _meta) = client.calls[0]
    assert (lease, wait, limit) == ("mylease", 90.0, 3)
    capsys.readouterr()


@pytest.mark.parametrize(
    ("error", "code", "exit_code"),
    [
        (ClusterUnavailable("no member answered"), "UNAVAILABLE", 69),
        (ClusterUnavailable("no quorum", code="NO_QUORUM"), "NO_QUORUM", 69),
        (LockHeld("held by lease x", holders=[{"lease": "x", "token": 7}]), "LOCKED", 75),
        (LeaseLost("lease gone"), "SESSION_EXPIRED", 77),
        (NotHolder("not yours", holders=[]), "NOT_HOLDER", 77),
        (BadRequest("key too long"), "BAD_REQUEST", 2),
        (ServerError("WEIRD", "the cluster answered WEIRD"), "WEIRD", 70),
    ],
)
def test_client_errors_keep_their_exit_code_and_code(  # noqa: PLR0917 - fixtures
    error: DlmError,
    code: str,
    exit_code: int,
    capsys: Capture,
    fake_cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing_acquire(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(FakeClient, "acquire", failing_acquire)
    message = error.message
    if isinstance(error, LockHeld):  # worded from its holders, as a person would say it
        message = "'k' is held by lease x (token 7): try again later, or wait for it (--wait)"
    assert run(["acquire", "k"]) == exit_code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in one_error_line(captured.err)

    assert run(["acquire", "k", "--json"]) == exit_code
    obj = one_json(capsys.readouterr().out)
    assert obj["error"]["code"] == code
    assert obj["error"]["message"] == message
    if isinstance(error, LockHeld):
        assert obj["error"]["holders"] == [{"lease": "x", "token": 7}]


def test_an_acquire_conflict_names_the_holder_as_a_person_would(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = {
        "lease": "x",
        "token": 7,
        "held_ms": 133_000,
        "meta": {"host": "web-3", "user": "deploy", "pid": "4121", "cmd": "backup.sh --full"},
    }

    def held(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        raise LockHeld("held by lease x", holders=[holder, {**holder, "meta": {"host": "b\x1b"}}])

    monkeypatch.setattr(FakeClient, "acquire", held)
    assert run(["acquire", "backup"]) == 75
    assert one_error_line(capsys.readouterr().err) == (
        "dlm: 'backup' is held by deploy@web-3 (pid 4121, backup.sh --full) for 2m13s, "
        "b? for 2m13s: try again later, or wait for it (--wait)"
    )


def test_a_refused_acquire_gives_its_new_lease_back(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def held(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LockHeld("held")

    monkeypatch.setattr(FakeClient, "acquire", held)
    assert run(["acquire", "k"]) == 75
    (client,) = FakeClient.instances
    # Then, as the error named nobody, who holds it now.
    assert [c[0] for c in client.calls] == ["open_lease", "acquire", "close_lease", "get"]
    assert client.closed
    capsys.readouterr()


def test_unexpected_exceptions_are_one_line_exit_70(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(FakeClient, "acquire", broken)
    monkeypatch.delenv("DLM_DEBUG", raising=False)
    assert run(["acquire", "k"]) == 70
    line = one_error_line(capsys.readouterr().err)
    assert "ZeroDivisionError" in line
    assert "report" in line
    assert run(["acquire", "k", "--json"]) == 70
    assert one_json(capsys.readouterr().out)["error"]["code"] == "INTERNAL"


# --- renew, release --------------------------------------------------------------


def test_renew_once(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["renew", "abc", "--json"]) == 0
    assert one_json(capsys.readouterr().out) == {"lease": "abc", "ttl_ms": 30000}


def test_renew_of_a_lost_lease_exits_77(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lost(self: FakeClient, lease: str) -> int:
        raise LeaseLost(f"lease {lease} has expired")

    monkeypatch.setattr(FakeClient, "keepalive", lost)
    assert run(["renew", "abc"]) == 77
    assert "expired" in one_error_line(capsys.readouterr().err)


def test_release(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["release", "k", "--lease", "abc", "--json"]) == 0
    assert one_json(capsys.readouterr().out) == {
        "key": "k",
        "lease": "abc",
        "released": True,
        "token": 4242,
        "lease_ended": True,
    }
    (client,) = FakeClient.instances
    assert client.calls == [("release", ("abc", "k"))]
    # No token: the lease's current grant; the lease may end with it.
    assert client.options["release"] == {"token": None, "keep_lease": False}
    assert run(["release", "k", "--lease", "abc"]) == 0
    assert capsys.readouterr().out == (
        "released k (lease abc, token 4242); lease abc ended with it, as it held nothing else\n"
    )


def test_release_of_one_grant_keeping_the_lease(capsys: Capture, fake_cluster: Any) -> None:
    args = ["release", "k", "--lease", "abc", "--token", "17", "--keep-lease", "--json"]
    assert run(args) == 0
    assert one_json(capsys.readouterr().out) == {
        "key": "k",
        "lease": "abc",
        "released": True,
        "token": 17,
        "lease_ended": False,
    }
    assert FakeClient.instances[0].options["release"] == {"token": 17, "keep_lease": True}


def test_a_release_of_a_queue_place_has_no_token(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def left_queue(self: FakeClient, lease: str, key: str, **options: Any) -> ReleaseOutcome:
        return ReleaseOutcome(key, False, None, False)

    monkeypatch.setattr(FakeClient, "release", left_queue)
    assert run(["release", "k", "--lease", "abc", "--json"]) == 0
    assert one_json(capsys.readouterr().out)["token"] is None
    assert run(["release", "k", "--lease", "abc"]) == 0
    assert capsys.readouterr().out == "left the queue for k (lease abc)\n"


def test_a_release_of_a_grant_the_lease_holds_no_more_exits_77(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = [{"lease": "abc", "token": 21}]

    def refused(self: FakeClient, lease: str, key: str, **options: Any) -> None:
        raise NotHolder("lease abc does not hold lock 'k'", holders=newer)

    monkeypatch.setattr(FakeClient, "release", refused)
    assert run(["release", "k", "--lease", "abc", "--token", "17"]) == 77
    assert one_error_line(capsys.readouterr().err) == (
        "dlm: lease abc now holds 'k' under another grant (token 21), not token 17: "
        "nothing was released"
    )
    error = one_json_error(["release", "k", "--lease", "abc", "--token", "17", "--json"], capsys)
    assert error["code"] == "NOT_HOLDER"
    assert error["holders"] == newer


def one_json_error(args: list[str], capsys: Capture, exit_code: int = 77) -> dict[str, Any]:
    assert run(args) == exit_code
    error = one_json(capsys.readouterr().out)["error"]
    assert isinstance(error, dict)
    return error


def test_release_by_an_expired_lease_says_who_holds_it_now(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def expired(self: FakeClient, lease: str, key: str, **options: Any) -> None:
        raise LeaseLost("lease abc has expired")

    def get(self: FakeClient, key: str) -> LockState:
        answer = {"key": key, "holders": [{"lease": "other", "token": 99}], "waiters": []}
        return LockState.from_wire(answer)

    monkeypatch.setattr(FakeClient, "release", expired)
    monkeypatch.setattr(FakeClient, "get", get)
    assert run(["release", "k", "--lease", "abc"]) == 77
    line = one_error_line(capsys.readouterr().err)
    assert "lease other (token 99)" in line
    assert run(["release", "k", "--lease", "abc", "--json"]) == 77
    error = one_json(capsys.readouterr().out)["error"]
    assert error["holders"] == [{"lease": "other", "token": 99}]


# --- lease revoke -------------------------------------------------------------------


def test_lease_revoke(capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def close(
        self: FakeClient, lease: str, *, must_exist: bool = False, revoke: bool = False
    ) -> list[str]:
        self._call("close_lease", lease, must_exist=must_exist, revoke=revoke)
        return ["a", "b\tc"]

    monkeypatch.setattr(FakeClient, "close_lease", close)
    assert run(["lease", "revoke", "abc", "--json"]) == 0
    assert one_json(capsys.readouterr().out) == {
        "lease": "abc",
        "revoked": True,
        "released": ["a", "b\tc"],
    }
    (client,) = FakeClient.instances
    assert client.calls == [("close_lease", ("abc",))]
    # A revocation: the lease's lock-delay, if it has one, applies (a release's would not).
    assert client.options["close_lease"] == {"must_exist": True, "revoke": True}
    assert run(["--json", "lease", "revoke", "abc"]) == 0
    capsys.readouterr()
    assert run(["lease", "revoke", "abc"]) == 0
    assert capsys.readouterr().out == "revoked lease abc; released a, b\\tc\n"


@pytest.mark.parametrize(
    ("ended", "says"),
    [
        ("unknown", "there is no lease abc (no such lease: never opened, or ended more "),
        ("expired", "there is no lease abc (it has expired): nothing to revoke"),
        ("closed", "there is no lease abc (it was closed already: released or revoked)"),
        (None, "there is no lease abc (it ended, or was never opened): nothing to revoke"),
    ],
)
def test_revoking_a_lease_that_is_gone_exits_77(
    ended: str | None,
    says: str,
    capsys: Capture,
    fake_cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def gone(self: FakeClient, lease: str, *, must_exist: bool = False, **_: Any) -> list[str]:
        assert must_exist
        raise LeaseLost("lease abc is gone", ended)

    monkeypatch.setattr(FakeClient, "close_lease", gone)
    assert run(["lease", "revoke", "abc"]) == 77
    line = one_error_line(capsys.readouterr().err)
    assert says in line
    assert ("expired" in line) == (ended == "expired")
    error = one_json_error(["lease", "revoke", "abc", "--json"], capsys)
    assert (error["code"], error["lease"]) == ("SESSION_EXPIRED", "abc")


# --- status and locks --------------------------------------------------------------


def test_status_json_merges_every_members_own_view(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["status", "--json"]) == 0
    obj = one_json(capsys.readouterr().out)
    assert obj["leader"] == "n1"
    assert obj["term"] == 3
    assert (obj["sessions"], obj["locks"], obj["waiters"]) == (2, 1, 0)
    n1, n2 = obj["members"]
    assert n1 == {
        "id": "n1",
        "address": "127.0.0.1:7700",
        "role": "leader",
        "term": 3,
        "commit": 10,
        "applied": 9,
        "lag": 1,
        "last_contact_ms": None,
        "voter": True,
        "reachable": True,
    }
    assert n2["reachable"] is False
    assert n2["role"] is None
    assert obj["health"]["state"] == "degraded"


def test_status_human_output_is_a_table(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["status", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "leader n1" in out
    assert "(unreachable)" in out
    assert "127.0.0.1:7701" in out
    assert "survives no further member failure" in out


def test_status_without_quorum_still_shows_the_members_and_exits_69(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_quorum(self: FakeClient) -> None:
        raise ClusterUnavailable("no quorum", code="NO_QUORUM")

    monkeypatch.setattr(FakeClient, "status", no_quorum)
    assert run(["status", "--json", "--cluster", "127.0.0.1:7700,127.0.0.1:7701"]) == 69
    obj = one_json(capsys.readouterr().out)
    assert obj["error"]["code"] == "NO_QUORUM"
    assert [m["reachable"] for m in obj["members"]] == [True, False]


def test_key_status_and_locks(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["status", "k", "--json"]) == 0
    assert one_json(capsys.readouterr().out) == {
        "key": "k",
        "limit": 1,
        "holders": [],
        "waiters": [],
        "command_finished": False,
        "hold_until": None,
        "delayed": False,
    }
    assert run(["status", "k", "--format", "table"]) == 0
    assert capsys.readouterr().out == "k is free\n"
    assert run(["locks", "--prefix", "job/", "--format", "table"]) == 0
    assert "no locks held" in capsys.readouterr().out
    assert FakeClient.instances[-1].calls == [("list_locks", ("job/",))]


def test_store_inspect_exits_1_on_a_bad_directory(capsys: Capture, tmp_path: Any) -> None:
    missing = str(tmp_path / "missing")
    assert run(["store", "inspect", missing, "--json"]) == 1
    report = one_json(capsys.readouterr().out)
    assert report["ok"] is False
    assert run(["store", "inspect", missing]) == 1
    captured = capsys.readouterr()
    assert "is not a directory" in one_error_line(captured.err)


def test_the_lock_commands_are_traced_under_their_own_span_names(
    capsys: Capture, fake_cluster: Any
) -> None:
    # Issue 30: each makes its client through Settings.connect(traced_as=...), which starts
    # the command's span (dlm/tracing.py) and makes its requests carry TRACEPARENT.
    assert run(["acquire", "deploy", "--json"]) == 0
    assert run(["renew", "fakelease0000001"]) == 0
    assert run(["release", "deploy", "--lease", "fakelease0000001"]) == 0
    assert [c.traced_as for c in FakeClient.instances] == [
        "dlm.acquire",
        "dlm.renew",
        "dlm.release",
    ]
    capsys.readouterr()
