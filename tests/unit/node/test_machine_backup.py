"""The node machine's side of backups and of images built off the loop (snapshots.py)."""

from __future__ import annotations

from collections.abc import Callable

from dlm.node.snapshots import BACKUP, PERIODIC, describe_image

from .machine_driver import Cluster


class Pending:
    """An image still being built (what the runtime's forked child stands for)."""

    def __init__(self, purpose: str, build: Callable[[], bytes]) -> None:
        self.purpose = purpose
        self.build = build


class ForkLike:
    """An imager that defers every image and says "not now" while one is pending."""

    def __init__(self) -> None:
        self.running: dict[str, Pending] = {}

    def __call__(self, build: Callable[[], bytes], purpose: str) -> Pending | None:
        if purpose in self.running:
            return None
        pending = self.running[purpose] = Pending(purpose, build)
        return pending


def started(size: int = 3, **options: object) -> Cluster:
    cluster = Cluster(size, **options)  # type: ignore[arg-type]
    cluster.elect("n1")
    return cluster


def test_a_backup_is_the_leaders_image_at_its_applied_index_after_a_read_round() -> None:
    cluster = started()
    leader = cluster["n1"]
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=30_000)
    granted = client.call("acquire", lease="L", key="k")
    rid = client.send("snapshot_save")
    # Nothing before the read round: the leader must confirm it still leads first.
    assert client.reply(rid) is None and not leader.backups
    header = client.wait(rid)
    machine = leader.machine
    index = machine.locks.applied_index
    assert header == {
        "t": "ok",
        "cluster": "unit",
        "index": index,
        "term": machine.raft.term,
        "voters": ["n1", "n2", "n3"],
        "learners": [],
        "leader": "n1",
        "taken_at_ms": cluster.now().wall_ms,
        "id": rid,
    }
    (backup,) = leader.backups
    assert isinstance(backup.image, bytes)
    contents = describe_image(backup.image, index)
    assert (contents.leases, contents.locks, contents.highest_token) == (1, 1, granted["token"])
    assert contents.longest_ttl_ms == 30_000 and contents.longest_ttl_source == "leases"
    assert sorted(contents.addresses) == ["n1", "n2", "n3"]


def test_a_follower_sends_the_client_to_the_leader() -> None:
    cluster = started()
    reply = cluster.connect("n2").call("snapshot_save")
    assert reply["code"] == "NOT_LEADER" and reply["leader"] == "n1"
    assert not cluster["n2"].backups


def test_a_second_backup_while_one_is_built_is_refused_as_busy() -> None:
    cluster = started()
    leader = cluster["n1"]
    imager = ForkLike()
    leader.machine.snapshots.imager = imager
    client = cluster.connect("n1")
    first = client.call("snapshot_save")
    assert first["t"] == "ok"
    (backup,) = leader.backups
    assert backup.image is imager.running[BACKUP]
    busy = client.call("snapshot_save")
    assert busy["code"] == "UNAVAILABLE" and busy["retry_after_ms"] == 1000
    # The image is built from the state at the header's index, whenever it is built.
    pending = imager.running.pop(BACKUP)
    assert describe_image(pending.build(), first["index"]).locks == 0


def test_a_periodic_snapshot_waits_for_the_image_being_built_then_is_taken_at_once() -> None:
    cluster = started(1, snapshot_every=5, snapshot_keep=2)
    leader = cluster["n1"]
    imager = ForkLike()
    leader.machine.snapshots.imager = imager
    client = cluster.connect("n1")
    client.call("open_lease", lease="L", ttl_ms=30_000)
    for n in range(6):
        client.call("acquire", lease="L", key=f"k{n}")
    (first,) = leader.snapshots
    assert first.pending is imager.running[PERIODIC] and first.data == b""
    for n in range(6):
        client.call("release", lease="L", key=f"k{n}")
    assert len(leader.snapshots) == 1, "one image at a time: the next one waits"
    imager.running.pop(PERIODIC)
    leader.machine.image_built()
    cluster.settle(leader)
    second = leader.snapshots[-1]
    assert second.index == leader.machine.locks.applied_index > first.index
    assert second.pending is imager.running[PERIODIC]


def test_at_version_3_inspect_reports_the_longest_ttl_the_cluster_recorded() -> None:
    """The record a restore's default quarantine covers: a lease given 90 s and closed
    since is gone from the image, but its TTL is still the longest recorded."""
    cluster = Cluster(3, max_version=3, peer_version=3)
    cluster.elect("n1")
    client = cluster.connect("n1")
    client.call("open_lease", lease="long", ttl_ms=90_000)
    client.call("close_lease", lease="long")
    client.call("open_lease", lease="L", ttl_ms=30_000)
    header = client.wait(client.send("snapshot_save"))
    (backup,) = cluster["n1"].backups
    assert isinstance(backup.image, bytes)
    contents = describe_image(backup.image, header["index"])
    assert (contents.longest_ttl_ms, contents.longest_ttl_source) == (90_000, "recorded")
