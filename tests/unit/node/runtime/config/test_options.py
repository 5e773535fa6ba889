"""`dlm node start` settings: flag over DLM_NODE_* variable over --config file, from one table."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from dlm.cli.app import app
from dlm.node.runtime import main as node_main
from dlm.node.runtime.config.node_config import ConfigError, parse_metrics_listen
from dlm.node.runtime.config.options import ALL_OPTIONS, NODE_OPTIONS, OptionError, resolve

NO_FLAGS: dict[str, str | None] = {option.param: None for option in ALL_OPTIONS}


def flags(**given: str) -> dict[str, str | None]:
    return {**NO_FLAGS, **given}


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_every_option_has_a_variable_and_a_file_key_named_after_its_flag() -> None:
    names = {option.flag: (option.env, option.name) for option in NODE_OPTIONS}
    assert names["--id"] == ("DLM_NODE_ID", "id")
    assert names["--listen"] == ("DLM_NODE_LISTEN", "listen")
    assert names["--peers"] == ("DLM_NODE_PEERS", "peers")
    assert names["--data"] == ("DLM_NODE_DATA", "data")
    assert names["--cluster-id"] == ("DLM_NODE_CLUSTER_ID", "cluster-id")
    assert names["--log-level"] == ("DLM_NODE_LOG_LEVEL", "log-level")
    assert names["--log-format"] == ("DLM_NODE_LOG_FORMAT", "log-format")
    # The cluster-wide shape, named as issue 25 names it (not a DLM_NODE_ variable).
    assert names["--partitions"] == ("DLM_NODE_PARTITIONS", "partitions")


def test_the_typer_command_takes_exactly_the_table() -> None:
    group = typer.main.get_command(app)
    start = group.commands["node"].commands["start"]  # type: ignore[attr-defined]
    options = {opt: param.name for param in start.params for opt in param.opts}
    assert options == {option.flag: option.param for option in ALL_OPTIONS}
    env = {option.param: option.env for option in ALL_OPTIONS}
    for param in start.params:
        assert f"[env: {env[str(param.name)]}]" in (param.help or "")
        assert env[str(param.name)].startswith("DLM_NODE_") or param.name == "partitions"


def test_flag_beats_variable_beats_file(tmp_path: Path) -> None:
    config = write(tmp_path, 'id = "from-file"\nlisten = "10.0.0.9:7700"\ndata = "/file/data"\n')
    environ = {"DLM_NODE_LISTEN": "10.0.0.8:7700", "DLM_NODE_DATA": "/env/data"}
    resolved = resolve(flags(config=config, data="/flag/data"), environ)
    assert resolved.values["node_id"] == "from-file"
    assert resolved.values["listen"] == "10.0.0.8:7700"
    assert resolved.values["data"] == "/flag/data"
    assert resolved.values["peers"] is None
    assert resolved.sources == {
        "node_id": f"{config}: id",
        "listen": "DLM_NODE_LISTEN",
        "data": "--data",
    }


def test_the_file_may_be_named_by_its_variable_and_empty_variables_are_unset(
    tmp_path: Path,
) -> None:
    config = write(tmp_path, 'cluster-id = "prod"\n')
    resolved = resolve(NO_FLAGS, {"DLM_NODE_CONFIG": config, "DLM_NODE_ID": ""})
    assert resolved.values["cluster"] == "prod"
    assert resolved.values["node_id"] is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('listen = "a:1"\nlisen = "b:2"\nport = 1\n', "unknown keys 'lisen', 'port'"),
        ('config = "x.toml"\n', "unknown key 'config'"),
        ("listen = 7700\n", 'listen must be a string, as on the command line (listen = "...")'),
        ("listen = \n", "is not valid TOML"),
        ('log-level = "loud"\n', "log-level: 'loud' is not one of debug, info, warning, error"),
    ],
)
def test_a_bad_file_is_refused_naming_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    config = write(tmp_path, text)
    with pytest.raises(OptionError) as info:
        resolve(flags(config=config), {})
    assert needle in str(info.value)
    assert config in str(info.value)


def test_unknown_variables_and_bad_choices_are_refused() -> None:
    with pytest.raises(OptionError, match="unknown environment variable DLM_NODE_LISTN"):
        resolve(NO_FLAGS, {"DLM_NODE_LISTN": "x"})
    with pytest.raises(OptionError, match="DLM_NODE_LOG_FORMAT: 'xml' is not one of json, text"):
        resolve(NO_FLAGS, {"DLM_NODE_LOG_FORMAT": "xml"})
    with pytest.raises(OptionError, match=r"--config: /nonexistent/dlm\.toml does not exist"):
        resolve(flags(config="/nonexistent/dlm.toml"), {})


def test_a_bad_value_names_the_variable_it_came_from(capsys: pytest.CaptureFixture[str]) -> None:
    code = node_main.start_from_options(NO_FLAGS, {"DLM_NODE_PEERS": "n1=127.0.0.1:99999"})
    assert code == node_main.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dlm node: error: --peers")
    assert "(the value comes from DLM_NODE_PEERS)" in err
    assert len(err.splitlines()) == 1


def test_start_from_options_hands_the_merged_settings_to_start_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    def start_node(settings: dict[str, object], **kwargs: object) -> int:
        seen.update(settings)
        return 0

    monkeypatch.setattr(node_main, "start_node", start_node)
    config = write(tmp_path, 'log-format = "text"\npeers = "n1=127.0.0.1:1,n2=127.0.0.1:2"\n')
    environ = {"DLM_NODE_CONFIG": config, "DLM_NODE_LOG_LEVEL": "debug"}
    assert node_main.start_from_options(flags(node_id="n2"), environ) == 0
    assert seen["node_id"] == "n2"
    assert seen["peers"] == "n1=127.0.0.1:1,n2=127.0.0.1:2"
    assert (seen["log_level"], seen["log_format"]) == ("debug", "text")
    assert (seen["listen"], seen["data"], seen["cluster"]) == (None, None, None)


def test_a_switch_comes_from_its_flag_variable_or_file_key(tmp_path: Path) -> None:
    assert resolve(flags(insecure="true"), {}).values["insecure"] == "true"
    assert resolve(NO_FLAGS, {"DLM_NODE_INSECURE": "1"}).values["insecure"] == "1"
    config = write(tmp_path, "insecure = true\n")
    assert resolve(flags(config=config), {}).values["insecure"] == "true"
    config = write(tmp_path, "insecure = false\n")
    assert resolve(flags(config=config), {}).values["insecure"] == "false"


def test_typer_passes_a_switch_as_true_and_its_absence_as_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dlm.cli.main import _run_typer

    seen: list[dict[str, str | None]] = []

    def start_from_options(given: dict[str, str | None], **_: object) -> int:
        seen.append(given)
        return 0

    monkeypatch.setattr(node_main, "start_from_options", start_from_options)
    assert _run_typer(["node", "start", "--insecure", "--listen", "0.0.0.0:1"], False) == 0
    assert _run_typer(["node", "start"], False) == 0
    assert seen[0]["insecure"] == "true" and seen[0]["listen"] == "0.0.0.0:1"
    assert seen[1]["insecure"] is None


def test_a_reachable_address_without_peer_authentication_exits_78(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = node_main.start_from_options(NO_FLAGS, {"DLM_NODE_LISTEN": "0.0.0.0:7700"})
    assert code == node_main.EXIT_CONFIG == 78
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "--peer-secret-file" in err and "(the value comes from DLM_NODE_LISTEN)" in err


# ------------------------------------------------------------------ --metrics-listen


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("9464", "bare port: give HOST:PORT, e.g. 127.0.0.1:9464"),
        ("127.0.0.1", "names no port"),
        ("localhost:0", "port must be 1-65535"),
        ("127.0.0.1:http", "port must be 1-65535"),
        (":9464", "missing host"),
    ],
)
def test_a_malformed_metrics_address_is_one_line_naming_the_flag(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_metrics_listen(text)
    message = str(raised.value)
    assert message.startswith("--metrics-listen") and words in message and "\n" not in message


@pytest.mark.parametrize(
    ("text", "addr"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (" localhost:9464 ", ("localhost", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
    ],
)
def test_a_metrics_address_is_host_and_port(text: str, addr: tuple[str, int]) -> None:
    assert parse_metrics_listen(text) == addr


def test_the_partition_count_comes_from_its_flag_dlm_partitions_or_the_file(
    tmp_path: Path,
) -> None:
    assert resolve({}, {"DLM_NODE_PARTITIONS": "4"}).values["partitions"] == "4"
    assert resolve({"partitions": "2"}, {"DLM_NODE_PARTITIONS": "4"}).values["partitions"] == "2"
    config = write(tmp_path, 'partitions = "8"\n')
    assert resolve({"config": config}, {}).values["partitions"] == "8"
