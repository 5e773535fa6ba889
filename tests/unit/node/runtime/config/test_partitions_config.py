"""--partitions: checked, recorded in a new data directory, kept by later starts, and a
different count refused with one line before anything listens."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from dlm.node.runtime.config.node_config import (
    ConfigError,
    NodeConfig,
    parse_partitions,
    recorded_partitions,
    settle_partitions,
    write_meta,
    write_partitions,
)
from dlm.node.runtime.main import EXIT_USAGE, start_node


def config(data: Path) -> NodeConfig:
    return NodeConfig.from_flags(
        node_id="n1", listen="127.0.0.1:7700", peers=None, data=str(data), cluster="c"
    )


def test_the_count_is_a_whole_number_from_1_to_64() -> None:
    assert parse_partitions(None) is None and parse_partitions(" ") is None
    assert parse_partitions("4") == 4 and parse_partitions("64") == 64
    for bad in ("0", "65", "-1", "four", "2.5"):
        with pytest.raises(ConfigError) as caught:
            parse_partitions(bad)
        assert "--partitions" in str(caught.value) and "\n" not in str(caught.value)


def test_a_new_directory_takes_the_flag_and_a_recorded_one_keeps_its_count(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    assert recorded_partitions(data) is None
    assert settle_partitions(None, None, data) == 1
    assert settle_partitions(4, None, data) == 4
    write_partitions(config(data), 4)
    assert json.loads((data / "partitions.json").read_text())["partitions"] == 4
    assert recorded_partitions(data) == 4
    assert settle_partitions(None, 4, data) == 4  # a later start without the flag
    assert settle_partitions(4, 4, data) == 4
    with pytest.raises(ConfigError) as caught:
        settle_partitions(2, 4, data)
    message = str(caught.value)
    assert message.startswith("this data dir was created with --partitions 4:")
    assert "to change the count restore a backup with --partitions" in message


def test_a_directory_of_one_partition_says_1(tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_meta(config(data))
    assert recorded_partitions(data) == 1
    with pytest.raises(ConfigError, match="created with --partitions 1"):
        settle_partitions(4, 1, data)


def test_a_damaged_record_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "partitions.json").write_text('{"partitions": 99}')
    with pytest.raises(ConfigError, match="damaged"):
        recorded_partitions(data)


def test_start_refuses_another_count_with_one_line_before_it_listens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "d"
    write_partitions(config(data), 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = start_node(
        {
            "node_id": "n1",
            "listen": f"127.0.0.1:{port}",
            "data": str(data),
            "cluster": "c",
            "partitions": "2",
        }
    )
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE
    assert err.splitlines() == [err]
    assert "this data dir was created with --partitions 4" in err
    assert not (data / "p0").exists()
