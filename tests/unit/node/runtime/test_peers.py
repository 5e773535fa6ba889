"""peers.py without sockets: batching messages into frames, and splitting off the first frame."""

from __future__ import annotations

import struct

import pytest

from dlm.node.peer_codec import decode_raft_frame
from dlm.node.raft.types import AppendEntries, Heartbeat, Message
from dlm.node.runtime.peers import FRAME_BUDGET, dial_refused, encode_batches, split_first_frame
from dlm.records import Entry
from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    PEER_FRAME_LIMIT,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)


def _append(index: int, size: int) -> AppendEntries:
    return AppendEntries(
        group=0,
        term=1,
        src="n1",
        dst="n2",
        prev_index=index - 1,
        prev_term=1,
        entries=(Entry(index, 1, b"x" * size),),
        commit=0,
    )


def _decode_all(frames: list[bytes]) -> list[Message]:
    decoder = FrameDecoder(PEER_FRAME_LIMIT)
    for frame in frames:
        decoder.feed(frame)
    return [m for obj in decoder.frames() for m in decode_raft_frame(obj)]


def test_small_messages_share_one_frame() -> None:
    msgs: list[Message] = [
        Heartbeat(group=0, term=1, src="n1", dst="n2", commit=3),
        _append(4, 10),
        _append(5, 10),
    ]
    frames = encode_batches(msgs)
    assert len(frames) == 1
    assert _decode_all(frames) == msgs


def test_big_batches_are_split_under_the_frame_limit_in_order() -> None:
    msgs: list[Message] = [_append(i, FRAME_BUDGET // 3) for i in range(1, 8)]
    frames = encode_batches(msgs)
    assert len(frames) > 1
    assert all(len(f) - 4 <= PEER_FRAME_LIMIT for f in frames)
    assert _decode_all(frames) == msgs


def test_the_first_frame_is_split_from_what_follows() -> None:
    frame = encode_frame({"t": "welcome"})
    buf = bytearray(frame[:3])
    assert split_first_frame(buf) is None
    buf += frame[3:] + b"rest"
    assert split_first_frame(buf) == ({"t": "welcome"}, b"rest")
    with pytest.raises(ProtocolError):
        split_first_frame(bytearray(struct.pack(">I", CLIENT_FRAME_LIMIT + 1)))


def test_a_name_whose_every_address_refused_counts_as_refused() -> None:
    # asyncio's error for a name with several addresses, all of which refused.
    both = OSError(
        "Multiple exceptions: [Errno 111] Connect call failed ('::1', 7701, 0, 0), "
        "[Errno 111] Connect call failed ('127.0.0.1', 7701)"
    )
    assert dial_refused(both)
    one_unreachable = OSError(
        "Multiple exceptions: [Errno 101] Network is unreachable, "
        "[Errno 111] Connect call failed ('127.0.0.1', 7701)"
    )
    assert not dial_refused(one_unreachable)
    assert dial_refused(ConnectionRefusedError(111, "refused"))
    assert not dial_refused(TimeoutError())
    assert not dial_refused(OSError(113, "No route to host"))


def test_a_link_to_a_partition_sends_its_preamble_then_a_hello_naming_the_count() -> None:
    import asyncio
    import io
    import random
    import struct

    import cbor2

    from dlm.node.runtime.log import Logger
    from dlm.node.runtime.peers import PeerLink
    from dlm.partitioning import preamble
    from dlm.wire import encode_frame, welcome

    async def main() -> bytes:
        seen = bytearray()
        got_hello = asyncio.Event()

        async def member(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.extend(await reader.readexactly(len(preamble(3))))
            (length,) = struct.unpack(">I", await reader.readexactly(4))
            seen.extend(await reader.readexactly(length))
            got_hello.set()
            writer.write(encode_frame(welcome("n2", "unit", 4, partitions=4, partition=3)))
            await writer.drain()
            await asyncio.sleep(30)

        server = await asyncio.start_server(member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = PeerLink(
            local_id="n1",
            peer_id="n2",
            address=("127.0.0.1", port),
            cluster="unit",
            log=Logger("n1", stream=io.StringIO()),
            on_down=lambda peer, gone: None,
            rng=random.Random(7),
            partition=3,
            partitions=4,
        )
        task = asyncio.ensure_future(link.run())
        try:
            await asyncio.wait_for(got_hello.wait(), 10.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            server.close()
        return bytes(seen)

    seen = asyncio.run(main())
    assert seen[:6] == preamble(3)
    hello = cbor2.loads(seen[6:])
    assert hello["t"] == "hello" and hello["role"] == "peer" and hello["partitions"] == 4
