"""Starting and stopping a member: `dlm node start`'s refusals, restarts, the disk worker, draining.

The first half runs `dlm node start` (main.py) against bad flags and unusable
data dirs: one line and an exit code each. The second half runs NodeServer in
the test's event loop (server_harness.py) on a MemoryStorage the test wraps:
a restart restores what was stored, the disk worker writes in order off the
event loop, a failing disk stops the member, and ``shutdown()`` drains.
"""

from __future__ import annotations

import io
import itertools
import json
import socket
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from dlm.node.raft.memory import MemoryStorage
from dlm.node.runtime.config.node_config import (
    ConfigError,
    NodeConfig,
    check_data_dir,
    parse_peers,
    write_meta,
)
from dlm.node.runtime.log import Logger
from dlm.node.runtime.main import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_FOREIGN_DATA,
    EXIT_OK,
    EXIT_USAGE,
    _settled,
    start_node,
)
from dlm.node.runtime.server import NodeServer
from dlm.records import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    encode_conf_change,
)
from dlm.store.disk import DiskStorage

from .server_harness import WAIT, Wire, log_text, running_member


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def start(capsys: pytest.CaptureFixture[str], **flags: str | None) -> tuple[int, str]:
    args: dict[str, str | None] = dict.fromkeys(("node_id", "listen", "peers", "data", "cluster"))
    args.update(flags)
    code = start_node(args)
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
    meta = check_data_dir(owner)
    assert meta is not None and meta.node == "n1" and meta.cluster == "prod"
    # 65, not 1: a service manager restarts on 1, and no restart makes the directory ours.
    code, err = start(capsys, node_id="n2", listen=free_addr(), data=str(tmp_path), cluster="prod")
    assert code == EXIT_FOREIGN_DATA == 65
    assert "belongs to node 'n1' of cluster 'prod'" in err
    code, err = start(capsys, node_id="n1", listen=free_addr(), data=str(tmp_path))
    assert code == EXIT_FOREIGN_DATA and "cluster 'prod'" in err


def test_the_members_a_joined_member_was_told_of_are_kept_for_its_restarts(
    tmp_path: Path,
) -> None:
    first = {"n1": ("10.0.0.1", 7700), "n2": ("10.0.0.2", 7700), "n3": ("10.0.0.3", 7700)}
    told = {**first, "n4": ("10.0.0.4", 7700)}
    joined = NodeConfig.from_settings(
        {"node_id": "n5", "listen": "10.0.0.5:7700", "data": str(tmp_path), "join": "10.0.0.1"}
    )
    write_meta(replace(joined, peers=first, join_members=told))
    meta = check_data_dir(joined)
    assert meta is not None and meta.peers == first and meta.join_members == told
    settled = _settled(joined, meta, Logger("n5", stream=io.StringIO()))
    assert settled.peers == first and settled.join_members == told
    # A member that did not join records none.
    plain = NodeConfig.from_flags(
        node_id="n1", listen=None, peers=None, data=str(tmp_path / "plain"), cluster=None
    )
    write_meta(plain)
    meta = check_data_dir(plain)
    assert meta is not None and meta.join_members == {}


def test_a_removed_members_data_dir_stops_at_once_with_exit_0_and_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    peers = f"n1={free_addr()},n2={free_addr()}"
    config = NodeConfig.from_flags(
        node_id="n1", listen=None, peers=peers, data=str(tmp_path), cluster=None
    )
    write_meta(config)
    removal = encode_conf_change(ConfChange(ConfChangeKind.REMOVE, "n1"))
    with DiskStorage.open(tmp_path, bootstrap_conf=ConfState(voters=("n1", "n2"))) as store:
        store.append([Entry(1, 1, removal, EntryKind.CONF_CHANGE)])
        store.set_hard_state(HardState(term=1, vote="", commit=1))
    code, err = start(capsys, node_id="n1", peers=peers, data=str(tmp_path))
    # Not a failure: a service manager must not start it again and again.
    assert code == EXIT_OK
    [said] = [line for line in err.splitlines() if line.startswith("dlm node:")]
    assert said.startswith("dlm node: member n1 was removed")
    assert "remove its data directory" in said and "--join" in said


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
    addr = free_addr()
    config = NodeConfig.from_flags(
        node_id=None, listen=addr, peers=None, data=str(tmp_path), cluster=None
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
    code, err = start(capsys, listen=addr, data=str(tmp_path))
    assert code == EXIT_FAILURE
    assert "corrupt" in err and segment.name in err and "byte" in err
    assert err.count("\n") == 0


# ---------------------------------------------------------------------------
# The running member
# ---------------------------------------------------------------------------


class GatedStorage(MemoryStorage):
    """MemoryStorage whose appends wait for ``gate``, record who wrote what, and fail once
    ``failure`` is set."""

    def __init__(self) -> None:
        super().__init__(ConfState(voters=("n1",)))
        self.gate = threading.Event()
        self.gate.set()
        self.appended: list[tuple[str, int, int]] = []
        """(thread name, first index, last index) of each append, in the order written."""
        self.failure: BaseException | None = None

    def append(self, entries: Sequence[Entry]) -> None:
        if not self.gate.wait(WAIT):
            raise AssertionError("the test never opened the disk gate")
        if self.failure is not None:
            raise self.failure
        super().append(entries)
        self.appended.append((threading.current_thread().name, entries[0].index, entries[-1].index))


@pytest.mark.anyio
async def test_a_restarted_member_serves_what_its_snapshot_and_log_hold() -> None:
    storage = MemoryStorage(ConfState(voters=("n1",)))
    async with running_member(storage=storage, snapshot_every=20, snapshot_keep=5) as (_, port):
        c = await Wire.client(port)
        await c.request("open_lease", lease="a", ttl_ms=60_000, client="c", seq=1)
        for seq in range(2, 60, 2):
            await c.request("acquire", lease="a", key="k", client="c", seq=seq)
            await c.request("release", lease="a", key="k", client="c", seq=seq + 1)
        kept = await c.request("acquire", lease="a", key="kept", client="c", seq=999)
        # Images are built in a forked child, one at a time: wait for one past 40.
        with anyio.fail_after(WAIT):
            while (taken := storage.snapshot()) is None or taken.meta.index < 40:
                await anyio.sleep(0.01)
    snap = storage.snapshot()
    assert snap is not None and snap.meta.index >= 40
    assert storage.first_index() > 1
    async with running_member(storage=storage) as (server, port):
        assert server.machine.locks.applied_index >= storage.last_index() - 1
        got = await (await Wire.client(port)).request("get", key="kept")
        assert [(h["lease"], h["token"]) for h in got["holders"]] == [("a", kept["token"])]


def audit_lines(server: NodeServer, event: str) -> list[dict[str, Any]]:
    return [
        record
        for record in map(json.loads, log_text(server).splitlines())
        if record["event"] == event
    ]


@pytest.mark.anyio
async def test_a_restart_marks_the_events_it_applies_again_as_replayed_at_their_time() -> None:
    storage = MemoryStorage(ConfState(voters=("n1",)))
    async with running_member(storage=storage) as (first, port):
        c = await Wire.client(port)
        await c.request("open_lease", lease="a", ttl_ms=60_000, client="c", seq=1)
        await c.request("acquire", lease="a", key="k", client="c", seq=2)
        [granted] = audit_lines(first, "lock_granted")
    assert "replayed" not in granted
    async with running_member(storage=storage) as (again, port):
        c = await Wire.client(port)
        await c.request("acquire", lease="a", key="new", client="c", seq=3)
        replayed, live = audit_lines(again, "lock_granted")
        started = audit_lines(again, "node_started")
    # The grant of "k" happened before the restart: marked, and at the leader's stamp,
    # which it took before the first run applied it (and logged it).
    assert (replayed["key"], replayed["replayed"]) == ("k", True)
    assert replayed["ts"] <= granted["ts"] and replayed["time"] <= granted["time"]
    assert not started or replayed["ts"] < started[0]["ts"]
    assert live["key"] == "new" and "replayed" not in live


@pytest.mark.anyio
async def test_the_disk_worker_writes_jobs_in_the_order_they_were_handed_out() -> None:
    storage = GatedStorage()
    async with running_member(storage=storage) as (server, port):
        clients = [await Wire.client(port) for _ in range(3)]
        base = server.machine.raft.last_index
        storage.gate.clear()
        for i, c in enumerate(clients):
            for seq in range(1, 6):
                lease = f"l{i}-{seq}"
                await c.send(
                    {
                        "t": "open_lease",
                        "id": seq,
                        "lease": lease,
                        "ttl_ms": 60_000,
                        "client": f"c{i}",
                        "seq": seq,
                    }
                )
        with anyio.fail_after(WAIT):
            while server.machine.raft.last_index < base + 15:
                await anyio.sleep(0.005)
        storage.gate.set()
        with anyio.fail_after(WAIT):
            while storage.last_index() < server.machine.raft.last_index:
                await anyio.sleep(0.005)
        ranges = [(first, last) for _, first, last in storage.appended]
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
        assert {name for name, _, _ in storage.appended} == {"dlm-persist"}


@pytest.mark.anyio
async def test_a_failing_disk_stops_the_member_and_keeps_the_error() -> None:
    storage = GatedStorage()
    async with running_member(storage=storage) as (server, port):
        c = await Wire.client(port)
        storage.failure = OSError(5, "Input/output error")
        await c.send(
            {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 60_000, "client": "c", "seq": 1}
        )
        with anyio.fail_after(WAIT):
            await server.stopped.wait()
        assert server.failure is storage.failure
        assert "persist_failed" in log_text(server)
        await c.closed()


@pytest.mark.anyio
async def test_shutdown_refuses_new_work_and_lets_what_is_in_flight_reach_the_disk() -> None:
    storage = GatedStorage()
    async with running_member(storage=storage) as (server, port):
        c = await Wire.client(port)
        with anyio.fail_after(WAIT):  # the disk has caught up with the log
            while storage.last_index() < server.machine.raft.last_index:
                await anyio.sleep(0.005)
        index = server.machine.raft.last_index + 1
        storage.gate.clear()
        try:
            await c.send(
                {
                    "t": "open_lease",
                    "id": 1,
                    "lease": "L",
                    "ttl_ms": 60_000,
                    "client": "c",
                    "seq": 1,
                }
            )
            with anyio.fail_after(WAIT):
                while server.machine.raft.last_index < index:
                    await anyio.sleep(0.005)
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.shutdown)
                for _ in range(1000):  # until shutdown has begun
                    if (await c.request("ping")).get("code") == "SHUTTING_DOWN":
                        break
                # The listener is closed: a newcomer goes to another member.
                with pytest.raises(OSError):
                    await anyio.connect_tcp("127.0.0.1", port)
                # The open's entry is still on its way to the disk: the member waits for it.
                assert not server.stopped.is_set()
                storage.gate.set()
                with anyio.fail_after(WAIT):
                    await server.stopped.wait()
            opened = [f for f in c.frames if f.get("id") == 1] or [await c.recv()]
            assert opened == [
                {"t": "ok", "lease": "L", "ttl_ms": 60_000, "incarnation": index, "id": 1}
            ]
            assert storage.last_index() >= index
        finally:
            storage.gate.set()


def test_a_restart_without_listen_listens_where_the_data_dir_says(tmp_path: Path) -> None:
    log = Logger("n2", stream=io.StringIO())

    def restarted(listen: str | None) -> NodeConfig:
        config = NodeConfig.from_flags(
            node_id="n2", listen=listen, peers=None, data=str(tmp_path), cluster="c"
        )
        meta = check_data_dir(config)
        assert meta is not None
        return _settled(config, meta, log)

    first = NodeConfig.from_flags(
        node_id="n2",
        listen="127.0.0.1:7712",
        peers="n1=127.0.0.1:7701,n2=127.0.0.1:7702",
        data=str(tmp_path),
        cluster="c",
    )
    write_meta(first)
    # Recorded at the first start: the default port (7700) is not where it lived.
    assert restarted(None).listen == ("127.0.0.1", 7712)
    # A --listen given later wins, and says so.
    assert restarted("127.0.0.1:7722").listen == ("127.0.0.1", 7722)
    assert '"event":"listen_changed"' in log.stream.getvalue()  # type: ignore[union-attr]

    # The previous release's node.json (format 2) has no address: the member's own entry
    # among the first members stands in for it.
    meta_path = tmp_path / "node.json"
    old = json.loads(meta_path.read_text())
    del old["listen"]
    old["format"] = 2
    meta_path.write_text(json.dumps(old))
    assert restarted(None).listen == ("127.0.0.1", 7702)


def test_a_recorded_address_beyond_loopback_still_needs_authentication(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # First started with --insecure on every interface; restarted with --data alone, it
    # would listen there again, so it is refused as --listen 0.0.0.0 without --insecure is.
    anywhere = NodeConfig.from_flags(
        node_id=None, listen="0.0.0.0:7700", peers=None, data=str(tmp_path), cluster=None
    )
    write_meta(anywhere)
    code, err = start(capsys, data=str(tmp_path))
    assert code == EXIT_CONFIG
    assert "--listen 0.0.0.0:7700 is reachable from other machines" in err
