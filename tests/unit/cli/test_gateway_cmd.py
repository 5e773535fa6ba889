"""`dlm gateway`'s flags and variables: a bad one is one line and exit 2, naming its source."""

from __future__ import annotations

import pytest

from dlm.cli import gateway
from dlm.cli.exits import USAGE, CliError


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [
        ((None, "127.0.0.1:7001", None), {}, "--listen HOST:PORT"),
        (("127.0.0.1:x", "127.0.0.1:7001", None), {}, "bad --listen"),
        ((None, "127.0.0.1:7001", None), {"DLM_GATEWAY_LISTEN": "h:0"}, "bad DLM_GATEWAY_LISTEN"),
        (("127.0.0.1:7999", None, None), {}, "--cluster HOST:PORT"),
        (("127.0.0.1:7999", "http://a:1", None), {}, "not a URL"),
        (("127.0.0.1:7999", "gateway:g:1", None), {}, "names members, not gateways"),
        (("127.0.0.1:7999", "a:1", "0"), {}, "--max-clients must be"),
        (("127.0.0.1:7999", "a:1", None), {"DLM_GATEWAY_MAX_CLIENTS": "x"}, "DLM_GATEWAY_MAX"),
        (("127.0.0.1:7999", "a:1", None), {"DLM_EVENT_LOOP": "trio"}, "DLM_EVENT_LOOP must be"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    flags: tuple[str | None, str | None, str | None],
    env: dict[str, str],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("DLM_GATEWAY_LISTEN", "DLM_CLUSTER", "DLM_GATEWAY_MAX_CLIENTS", "DLM_EVENT_LOOP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CliError) as refused:
        gateway.run(*flags)
    assert refused.value.exit_code == USAGE
    assert named in refused.value.message
    assert "\n" not in refused.value.message
