"""What decoding an incoming frame costs: a client request and a 1 MB AppendEntries.

Run with ``python -m bench.decode``. Not a test. Prints the best time per
frame (of several timed rounds: the machine may be shared) for:

* a typical client request (an acquire with owner metadata), through
  ``FrameDecoder`` and ``decode_request``;
* a peer frame of about 1 MB carrying one AppendEntries of small entries
  (100-byte commands, the size of a lock command), through ``FrameDecoder``
  alone and then also through ``peer_codec.decode_raft_frame``;
* the same 1 MB with 4 KB entries (fewer, larger items).

Decoding cost is per CBOR item, not per byte (strings are skipped by length),
so the small-entry frame is the expensive one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dlm import wire
from dlm.node import peer_codec
from dlm.node.raft.types import AppendEntries
from dlm.records import Entry

ROUNDS = 7


def _best_seconds(run: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(repeat):
            run()
        samples.append((time.perf_counter() - start) / repeat)
    return min(samples)


def _through_decoder(frame: bytes, limit: int) -> Callable[[], list[object]]:
    def run() -> list[object]:
        decoder = wire.FrameDecoder(limit)
        decoder.feed(frame)
        return list(decoder.frames())

    return run


def client_request_frame() -> bytes:
    request = wire.Acquire(
        id=12345,
        lease="Lr4V2o1xq0c9mZ8aPpQ3",
        seq=7318390019283748123,
        key="nightly-report",
        wait=True,
        limit=1,
        meta={"host": "web-17.example.net", "user": "cron", "pid": "48213"},
    )
    return wire.encode_frame(request.to_wire())


def append_entries_frame(entry_bytes: int, total_bytes: int = 1 << 20) -> bytes:
    count = total_bytes // (entry_bytes + 12)
    entries = tuple(Entry(1_000_000 + i, 42, bytes([i % 251]) * entry_bytes) for i in range(count))
    message = AppendEntries(
        group=0,
        term=42,
        src="n1",
        dst="n2",
        prev_index=999_999,
        prev_term=42,
        entries=entries,
        commit=999_000,
    )
    return peer_codec.raft_frame([message])


def main() -> None:
    request = client_request_frame()

    def request_and_validate() -> object:
        return [
            wire.decode_request(f) for f in _through_decoder(request, wire.CLIENT_FRAME_LIMIT)()
        ]

    seconds = _best_seconds(request_and_validate, 20_000)
    print(
        f"client acquire ({len(request)} B), FrameDecoder+decode_request: {seconds * 1e6:8.2f} us"
    )
    for entry_bytes in (100, 4096):
        frame = append_entries_frame(entry_bytes)
        decode = _through_decoder(frame, wire.PEER_FRAME_LIMIT)

        def decode_and_validate(decode: Callable[[], list[object]] = decode) -> object:
            return [peer_codec.decode_raft_frame(f) for f in decode()]

        repeat = 5 if entry_bytes < 1000 else 50
        raw = _best_seconds(decode, repeat)
        full = _best_seconds(decode_and_validate, repeat)
        label = f"AppendEntries {len(frame) / 1e6:.2f} MB of {entry_bytes} B entries"
        print(
            f"{label}, FrameDecoder: {raw * 1e3:8.2f} ms; +decode_raft_frame: {full * 1e3:8.2f} ms"
        )


if __name__ == "__main__":
    main()
