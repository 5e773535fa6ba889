"""`dlm store inspect`: whose directory it is, what its figures mean, and where the data is when
pointed one level too high."""

from __future__ import annotations

import json
from pathlib import Path

from dlm.node.runtime.config import node_config
from dlm.records import ConfState, Entry, HardState
from dlm.store.disk import DiskStorage
from dlm.store.inspect import OWNER_FILE, inspect_store, inspect_store_json

CONF = ConfState(voters=("n1", "n2", "n3"))


def make_data_dir(path: Path, node: str = "n2", cluster: str = "prod") -> Path:
    with DiskStorage.open(path, bootstrap_conf=CONF) as store:
        store.append([Entry(index=i, term=1, data=b"x") for i in range(1, 6)])
        store.set_hard_state(HardState(1, "n1", 0))
    (path / OWNER_FILE).write_text(json.dumps({"format": 1, "node": node, "cluster": cluster}))
    return path


def test_the_owner_file_is_the_one_the_node_writes() -> None:
    assert OWNER_FILE == node_config.META_FILE


def test_names_the_member_and_cluster_and_explains_the_figures(tmp_path: Path) -> None:
    path = make_data_dir(tmp_path / "n2")
    report = inspect_store_json(path)
    assert report["ok"] is True and report["data_dir"] is True
    assert report["member"] == {"id": "n2", "cluster": "prod"}
    text = inspect_store(path)
    assert "member: n2 of cluster prod" in text
    assert "hard state: term 1, vote n1, commit 0" in text
    words = " ".join(text.split())  # the explanations are wrapped
    assert "0 after a crash is normal" in words and "relearns it from the leader" in words
    assert all(len(line) <= 100 for line in text.splitlines())


def test_a_damaged_owner_file_is_a_problem(tmp_path: Path) -> None:
    path = make_data_dir(tmp_path / "n1")
    (path / OWNER_FILE).write_text("{not json")
    report = inspect_store_json(path)
    assert report["ok"] is False
    assert any("node.json is damaged" in p for p in report["problems"])


def test_the_parent_of_a_data_directory_names_it(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "n1")
    (tmp_path / "notes").mkdir()
    report = inspect_store_json(tmp_path)
    assert report["ok"] is False and report["data_dir"] is False
    assert report["data_dirs_inside"] == [str(tmp_path / "n1")]
    assert report["problems"] == [
        f"{tmp_path} is not a data directory, but it holds one: {tmp_path / 'n1'}; "
        "inspect it with dlm store inspect"
    ]
    make_data_dir(tmp_path / "n3")
    assert "holds 2:" in inspect_store(tmp_path)


def test_an_empty_directory_is_not_a_data_directory(tmp_path: Path) -> None:
    report = inspect_store_json(tmp_path)
    assert report["ok"] is False
    assert "is not a data directory (no node.json" in report["problems"][0]
