"""`dlm node start` refuses bad flags and unusable data dirs with one line and an exit code."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dlm.node.config import ConfigError, NodeConfig, check_data_dir, parse_peers, write_meta
from dlm.node.main import EXIT_FAILURE, EXIT_USAGE, start_node
from dlm.node.raft.types import ConfState, Entry
from dlm.store.disk import DiskStorage


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def start(capsys: pytest.CaptureFixture[str], **flags: str | None) -> tuple[int, str]:
    args: dict[str, str | None] = dict.fromkeys(("node_id", "listen", "peers", "data", "cluster"))
    args.update(flags)
    code = start_node(**args)  # type: ignore[arg-type]
    err = capsys.readouterr().err.strip()
    return code, err


def test_defaults_are_a_single_member_on_7700_in_dlm_data() -> None:
    config = NodeConfig.from_flags(node_id=None, listen=None, peers=None, data=None, cluster=None)
    assert (config.node_id, config.listen, config.voters) == ("n1", ("127.0.0.1", 7700), ("n1",))
    assert config.data_dir == Path("dlm-data")


def test_listen_defaults_to_our_entry_in_peers() -> None:
    config = NodeConfig.from_flags(
        node_id="b", listen=None, peers="a=127.0.0.1:1,b=127.0.0.1:2", data="d", cluster="c"
    )
    assert config.listen == ("127.0.0.1", 2)
    assert config.address_of("a") == "127.0.0.1:1"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("n1", "malformed"),
        ("n1=", "malformed"),
        ("n1=127.0.0.1:99999", "port"),
        ("n1=127.0.0.1:1,n1=127.0.0.1:2", "twice"),
        ("n1=127.0.0.1:1,n2=127.0.0.1:1", "same address"),
        ("bad id=127.0.0.1:1", "not a valid name"),
        (",", "empty"),
    ],
)
def test_malformed_peers_are_explained(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_peers(text)


def test_bad_flags_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = start(
        capsys, node_id="n4", peers="n1=127.0.0.1:1,n2=127.0.0.1:2", data=str(tmp_path)
    )
    assert code == EXIT_USAGE
    assert err.count("\n") == 0 and "does not include this node 'n4'" in err
    code, err = start(capsys, peers="garbage")
    assert (code, err.count("\n")) == (EXIT_USAGE, 0)
    code, err = start(capsys, listen="127.0.0.1:http")
    assert code == EXIT_USAGE and "--listen" in err


def test_a_busy_port_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = start(capsys, listen=f"127.0.0.1:{port}", data=str(tmp_path))
    assert code == EXIT_FAILURE
    assert err == (
        f"dlm node: error: 127.0.0.1:{port} is already in use: "
        "stop the other process or choose --listen"
    )


def test_a_data_dir_of_another_member_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    owner = NodeConfig.from_flags(
        node_id="n1", listen=None, peers=None, data=str(tmp_path), cluster="prod"
    )
    write_meta(owner)
    assert check_data_dir(owner) is False
    code, err = start(capsys, node_id="n2", listen=free_addr(), data=str(tmp_path), cluster="prod")
    assert code == EXIT_FAILURE
    assert "belongs to node 'n1' of cluster 'prod'" in err
    code, err = start(capsys, node_id="n1", listen=free_addr(), data=str(tmp_path))
    assert code == EXIT_FAILURE and "cluster 'prod'" in err


def test_a_damaged_meta_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "node.json").write_text("{not json")
    code, err = start(capsys, listen=free_addr(), data=str(tmp_path))
    assert code == EXIT_FAILURE and "damaged" in err


def test_a_data_dir_that_is_a_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    code, err = start(capsys, listen=free_addr(), data=str(target))
    assert code == EXIT_FAILURE
    assert err.startswith("dlm node: error: ") and err.count("\n") == 0


def test_a_corrupt_store_is_refused_naming_file_and_offset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = NodeConfig.from_flags(
        node_id=None, listen=None, peers=None, data=str(tmp_path), cluster=None
    )
    write_meta(config)
    with DiskStorage.open(tmp_path, bootstrap_conf=ConfState(voters=("n1",))) as store:
        for index in range(1, 4):
            store.append([Entry(index, 1, b"payload-%d" % index)])
    segment = sorted((tmp_path / "wal").iterdir())[0]
    raw = bytearray(segment.read_bytes())
    at = raw.index(b"payload-1")
    raw[at] ^= 0xFF  # rot in the middle of the log, before valid records
    segment.write_bytes(bytes(raw))
    code, err = start(capsys, listen=free_addr(), data=str(tmp_path))
    assert code == EXIT_FAILURE
    assert "corrupt" in err and segment.name in err and "byte" in err
    assert err.count("\n") == 0
