"""Both clients take a backup from a real member: the header, then the image in chunks."""

from __future__ import annotations

import anyio

from dlm.client import Client
from dlm.client.aio import AsyncClient
from dlm.node.snapshots import describe_image
from dlm.wire import BACKUP_CHUNK_BYTES

from .real_member import RunningMember

META = {"note": "m" * 250}
KEYS = 1_200
"""With 250 bytes of metadata each, an image of more than one chunk."""


def test_the_blocking_client_takes_a_backup_in_several_chunks(member: RunningMember) -> None:
    with Client([member.addr], timeout=10.0) as c:
        lease = c.open_lease(60_000)
        tokens = [c.acquire(lease, f"backup/{n:05d}", meta=META).token for n in range(KEYS)]
        header, image = c.save_snapshot()
        # The connection is usable again once the image is in.
        assert c.get("backup/00000").holders[0].token == tokens[0]
    assert len(image) > BACKUP_CHUNK_BYTES  # two chunks at least
    applied = member.inspect(lambda m: m.locks.applied_index)
    assert header.index == applied and header.leader == "n1" and header.voters == ["n1"]
    contents = describe_image(image, header.index)
    assert (contents.locks, contents.highest_token) == (KEYS, tokens[-1])
    assert member.wait_for("snapshot_save")
    # The member built the image in a forked child (its loop paid only for the fork), and
    # counted the backup once its last chunk was out.
    server = member._server
    assert server is not None
    stats = server.backup_stats
    assert stats.image_fork_seconds.count >= 1
    assert (stats.backups, stats.backup_bytes) == (1, len(image))


def test_the_async_client_takes_a_backup_too(member: RunningMember) -> None:
    async def main() -> None:
        async with AsyncClient([member.addr], timeout=10.0) as c:
            lease = await c.open_lease(60_000)
            for n in range(KEYS):
                await c.acquire(lease, f"backup/{n:05d}", meta=META)
            header, image = await c.save_snapshot()
            assert await c.get("backup/00001")
        assert describe_image(image, header.index).locks == KEYS

    anyio.run(main, backend="asyncio")
