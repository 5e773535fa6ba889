"""bench/loadgen.py, the second load generator: its frame codec against dlm.wire's (both
ways, for every request it sends and every reply it reads), its percentiles, and that a
bogus grant is caught. The generator itself imports nothing of dlm; these tests do, to
cross-check it."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from bench import loadgen
from dlm import wire

CLIENT = "c0ffee"
LEASE = "abc123"


def _their_frames(data: bytes) -> list[Any]:
    decoder = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT)
    decoder.feed(data)
    return list(decoder.frames())


def _our_frames(data: bytes, piece: int = 3) -> list[dict[str, Any]]:
    """Fed a few bytes at a time: frames arrive in pieces off a socket."""
    splitter = loadgen.FrameSplitter()
    out = []
    for start in range(0, len(data), piece):
        splitter.feed(data[start : start + piece])
        while (body := splitter.next_body()) is not None:
            out.append(loadgen.decode_body(body))
    return out


# Each request the generator sends, as it builds it and as dlm.wire's record of it.
REQUESTS: list[tuple[dict[str, Any], wire.Request]] = [
    (
        loadgen.open_lease_message(
            7, lease=LEASE, ttl_ms=30_000, client=CLIENT, seq=2**61 + 1, acked=2**61
        ),
        wire.OpenLease(id=7, lease=LEASE, ttl_ms=30_000, client=CLIENT, seq=2**61 + 1, acked=2**61),
    ),
    (
        loadgen.acquire_message(
            8, lease=LEASE, key="k/1", wait=False, client=CLIENT, seq=3, acked=2
        ),
        wire.Acquire(id=8, lease=LEASE, key="k/1", wait=False, client=CLIENT, seq=3, acked=2),
    ),
    (
        loadgen.acquire_message(
            9, lease=LEASE, key="hot", wait=True, client=CLIENT, seq=4, acked=3
        ),
        wire.Acquire(id=9, lease=LEASE, key="hot", wait=True, client=CLIENT, seq=4, acked=3),
    ),
    (
        loadgen.release_message(
            10, lease=LEASE, key="hot", token=41, client=CLIENT, seq=5, acked=4
        ),
        wire.Release(id=10, lease=LEASE, key="hot", token=41, client=CLIENT, seq=5, acked=4),
    ),
    (
        loadgen.close_lease_message(11, lease=LEASE, client=CLIENT, seq=6, acked=5),
        wire.CloseLease(id=11, lease=LEASE, client=CLIENT, seq=6, acked=5),
    ),
]


@pytest.mark.parametrize(("ours", "theirs"), REQUESTS, ids=lambda x: str(getattr(x, "TYPE", "")))
def test_dlm_wire_reads_each_request_as_the_one_meant(
    ours: dict[str, Any], theirs: wire.Request
) -> None:
    [decoded] = _their_frames(loadgen.encode_frame(ours))
    assert wire.decode_request(decoded) == theirs
    assert decoded["id"] == theirs.id


@pytest.mark.parametrize(("ours", "theirs"), REQUESTS, ids=lambda x: str(getattr(x, "TYPE", "")))
def test_the_generator_reads_dlm_wires_frame_of_each_request(
    ours: dict[str, Any], theirs: wire.Request
) -> None:
    [decoded] = _our_frames(wire.encode_frame(theirs.to_wire()))
    # dlm.wire writes a few fields at their defaults that the generator leaves out.
    assert {name: decoded[name] for name in ours} == ours
    assert set(decoded) - set(ours) <= {"ephemeral", "meta", "keep_lease"}


def test_the_hello_is_a_client_hello_of_version_1_up_to_5() -> None:
    [decoded] = _their_frames(loadgen.encode_frame(loadgen.hello_message()))
    hello = wire.Hello.from_wire(decoded)
    assert (hello.role, hello.version, hello.speaks) == (wire.HelloRole.CLIENT, 1, 5)
    assert hello.speaks <= wire.PROTOCOL_VERSION


REPLIES: list[dict[str, Any]] = [
    wire.welcome("n1", "cluster-1"),
    wire.LeaseOpened(lease=LEASE, ttl_ms=30_000, incarnation=12).frame(7),
    wire.LockGranted(key="k/1", token=40, lease=LEASE, ttl_ms=30_000).frame(8),
    wire.LockQueued(key="hot", lease=LEASE, position=3).frame(9),
    wire.grant_push(LEASE, "hot", 41),
    wire.LockReleased(key="hot", released="lock", token=41, lease_ended=False).frame(10),
    wire.LeaseEnded(lease=LEASE, released=["hot"]).frame(11),
    wire.error(8, wire.ErrorCode.NOT_LEADER, "not the leader", leader="n2", leader_address="h:2"),
]


def test_the_generator_reads_every_reply_it_acts_on_as_dlm_wire_wrote_it() -> None:
    stream = b"".join(wire.encode_frame(reply) for reply in REPLIES)
    assert _our_frames(stream) == REPLIES


@pytest.mark.parametrize(
    "value",
    [
        {"t": "ok", "x": 1.5},  # a float
        {"t": "ok", "x": cbor2.CBORTag(2, b"\x01")},  # a tag (bignum)
        {1: "not a text key"},
        ["not", "a", "map"],
    ],
    ids=["float", "tag", "int-key", "array"],
)
def test_a_body_outside_dlms_cbor_is_refused_by_both(value: object) -> None:
    body = cbor2.dumps(value)
    with pytest.raises(loadgen.LoadError):
        loadgen.decode_body(body)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(body)


ONE_ENTRY_MAP = bytes([0xA1, 0x61]) + b"t" + bytes([0x62]) + b"ok"  # {"t": "ok"}


@pytest.mark.parametrize(
    "body",
    [
        bytes([0xBF, 0x61]) + b"t" + bytes([0x62]) + b"ok" + bytes([0xFF]),  # indefinite map
        bytes([0xB8, 0x01, 0x61]) + b"t" + bytes([0x62]) + b"ok",  # length in a long form
        ONE_ENTRY_MAP + b"\x00",  # a byte after the item
        bytes([0xA1, 0x61]) + b"n" + bytes([0xC2, 0x41, 0x01]),  # {"n": bignum 1}
    ],
    ids=["indefinite", "long-form", "trailing", "bignum"],
)
def test_bytes_dlm_never_writes_are_refused(body: bytes) -> None:
    assert loadgen.decode_body(ONE_ENTRY_MAP) == {"t": "ok"}
    with pytest.raises(loadgen.LoadError):
        loadgen.decode_body(body)
    if body[0] != 0xB8:  # a member reads a length in a longer form than needed; no other
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(body)


def test_an_oversized_length_is_refused_before_it_is_read() -> None:
    splitter = loadgen.FrameSplitter()
    splitter.feed((loadgen.REPLY_CAP_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(loadgen.LoadError, match="out of step"):
        splitter.next_body()


# ---------------------------------------------------------------------------
# Percentiles
# ---------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank() -> None:
    values = list(range(1, 101))  # 1..100
    assert loadgen.percentile(values, 50) == 50
    assert loadgen.percentile(values, 99) == 99
    assert loadgen.percentile(values, 100) == 100
    assert loadgen.percentile([5, 7, 9, 11], 50) == 7  # rank ceil(2.0) = 2
    assert loadgen.percentile([5, 7, 9], 50) == 7  # rank ceil(1.5) = 2
    assert loadgen.percentile([5, 7, 9], 99) == 9
    assert loadgen.percentile([42], 1) == 42
    assert loadgen.percentile([], 50) is None
    with pytest.raises(ValueError):
        loadgen.percentile([1], 0)


def test_percentile_of_many_samples_has_that_share_at_or_below_it() -> None:
    values = sorted((i * 7919) % 1000 for i in range(1000))  # 0..999, shuffled then sorted
    for percent in (1, 50, 90, 99):
        found = loadgen.percentile(values, percent)
        assert found is not None
        at_or_below = sum(v <= found for v in values)
        assert at_or_below >= percent * 10 and at_or_below - 1 < percent * 10


# ---------------------------------------------------------------------------
# Checking what the members answer
# ---------------------------------------------------------------------------


def test_tokens_must_rise_per_key() -> None:
    ledger = loadgen.TokenLedger()
    ledger.record("a", 5)
    ledger.record("b", 1)  # another key counts on its own
    ledger.record("a", 9)
    with pytest.raises(loadgen.LoadError, match="not above 9"):
        ledger.record("a", 9)
    with pytest.raises(loadgen.LoadError):
        ledger.record("a", 3)
    assert ledger.checked == 3


class FakeMember:
    """One connection's worth of a member on 127.0.0.1, speaking through dlm.wire: it
    answers the hello, then each request with ``answer(request)`` (a list of frames)."""

    def __init__(self, answer: Callable[[Any], list[dict[str, Any]]]) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(10.0)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[Any] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10.0)
            decoder = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT)
            for _ in range(100):  # bounded: the tests send a handful of requests
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                decoder.feed(data)
                for frame in decoder.frames():
                    if frame.get("t") == "hello":
                        conn.sendall(wire.encode_frame(wire.welcome("n1", "fake")))
                        continue
                    request = wire.decode_request(frame)
                    self.requests.append(request)
                    for reply in self._answer(request):
                        conn.sendall(wire.encode_frame(reply))

    def stop(self) -> None:
        self._listener.close()
        self._thread.join(timeout=10)


@pytest.fixture
def member_with() -> Iterator[Callable[..., FakeMember]]:
    made: list[FakeMember] = []

    def make(answer: Callable[[Any], list[dict[str, Any]]]) -> FakeMember:
        made.append(FakeMember(answer))
        return made[-1]

    yield make
    for member in made:
        member.stop()


def _granting(tokens: list[int]) -> Callable[[Any], list[dict[str, Any]]]:
    """Opens leases and grants each acquire with the next of ``tokens``."""
    left = iter(tokens)

    def answer(request: Any) -> list[dict[str, Any]]:
        if isinstance(request, wire.OpenLease):
            return [wire.LeaseOpened(lease=request.lease, ttl_ms=30_000).frame(request.id)]
        if isinstance(request, wire.Acquire):
            token = next(left)
            return [
                wire.LockGranted(
                    key=request.key, token=token, lease=request.lease, ttl_ms=30_000
                ).frame(request.id)
            ]
        if isinstance(request, wire.Release):
            return [
                wire.LockReleased(
                    key=request.key, released="lock", token=request.token, lease_ended=False
                ).frame(request.id)
            ]
        return [wire.LeaseEnded(lease=request.lease, released=[]).frame(request.id)]

    return answer


def test_a_repeated_token_from_a_member_is_caught(
    member_with: Callable[..., FakeMember],
) -> None:
    member = member_with(_granting([5, 5]))
    session = loadgen.Session([member.address], loadgen.TokenLedger())
    try:
        session.open()
        token = session.acquire("k", wait=False)
        session.release("k", token)
        with pytest.raises(loadgen.LoadError, match="token 5, not above 5"):
            session.acquire("k", wait=False)
    finally:
        session.close()
    # The origin of each request: one client, seq rising by one, acked the last answered.
    changes = [r for r in member.requests if isinstance(r, wire.Change)]
    assert {r.client for r in changes} == {session.client}
    seqs = [r.seq for r in changes]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert [r.acked for r in changes[1:]] == seqs[:-1]


def test_a_grant_for_another_key_is_caught(member_with: Callable[..., FakeMember]) -> None:
    def answer(request: Any) -> list[dict[str, Any]]:
        if isinstance(request, wire.Acquire):
            granted = wire.LockGranted(key="other", token=3, lease=request.lease, ttl_ms=1000)
            return [granted.frame(request.id)]
        return _granting([])(request)

    member = member_with(answer)
    session = loadgen.Session([member.address], loadgen.TokenLedger())
    try:
        session.open()
        with pytest.raises(loadgen.LoadError, match="answered for"):
            session.acquire("k", wait=False)
    finally:
        session.close()


def test_a_queued_acquire_takes_its_token_from_the_grant_push(
    member_with: Callable[..., FakeMember],
) -> None:
    def answer(request: Any) -> list[dict[str, Any]]:
        if isinstance(request, wire.Acquire):
            queued = wire.LockQueued(key=request.key, lease=request.lease, position=1)
            # Another lease's push first: it must not be taken for ours.
            return [
                queued.frame(request.id),
                wire.grant_push("someone-else", request.key, 6),
                wire.grant_push(request.lease, request.key, 7),
            ]
        return _granting([])(request)

    member = member_with(answer)
    session = loadgen.Session([member.address], loadgen.TokenLedger())
    try:
        session.open()
        assert session.acquire("hot", wait=True) == 7
    finally:
        session.close()


def test_not_leader_sends_the_same_request_to_the_leader(
    member_with: Callable[..., FakeMember],
) -> None:
    leader = member_with(_granting([1]))

    def follower_answer(request: Any) -> list[dict[str, Any]]:
        return [
            wire.error(
                request.id,
                wire.ErrorCode.NOT_LEADER,
                "not the leader",
                leader="n2",
                leader_address=leader.address,
            )
        ]

    follower = member_with(follower_answer)
    session = loadgen.Session([follower.address], loadgen.TokenLedger())
    try:
        session.open()
    finally:
        session.close()
    [asked] = follower.requests
    opened = leader.requests[0]
    assert isinstance(opened, wire.OpenLease)
    assert (opened.lease, opened.seq, opened.client) == (asked.lease, asked.seq, asked.client)


# ---------------------------------------------------------------------------
# The comparison with bench.locks
# ---------------------------------------------------------------------------


def test_item_4s_cells_and_figures() -> None:
    specs = loadgen.cell_specs([1, 16, 64])
    assert [(s.hot, s.clients) for s in specs] == [(False, 1), (True, 1), (True, 64), (False, 64)]
    assert loadgen.figures_of(specs[0], 64) == ["pair p50", "pairs/s"]
    assert loadgen.figures_of(specs[2], 64) == ["pairs/s", "pair p99/p50"]
    assert loadgen.figures_of(specs[3], 64) == ["pairs/s", "server CPU per pair"]


def test_within_25_percent_is_a_ratio_between_075_and_125() -> None:
    def row(first: float, second: float) -> loadgen.Agreement:
        return loadgen.Agreement("c", "pairs/s", first, second)

    assert row(100, 125).within is True
    assert row(100, 75).within is True
    assert row(100, 126).within is False
    assert row(100, 74).within is False
    assert row(100, float("nan")).within is None
    assert loadgen.Agreement("c", "pairs/s", None, 5.0).within is None


def test_the_hook_runs_each_cell_once_after_its_last_load_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = [(False, 1, 1), (False, 64, 1), (False, 64, 2), (True, 1, 1), (True, 64, 1)]
    ran: list[tuple[bool, int]] = []
    out = loadgen.SecondRun(seconds=1.0, warmup=0.0, procs=2)

    def fake_run_cell(endpoints: Any, spec: loadgen.CellSpec, **_: Any) -> loadgen.CellFigures:
        ran.append((spec.hot, spec.clients))
        return loadgen.CellFigures(
            spec.label, spec.hot, spec.clients, 1, 1.0, 10.0, 1.0, 2.0, 0.5, 1.0, 10, 0, "",
            10, 0.1, 0.5, 1.0,
        )  # fmt: skip

    monkeypatch.setattr(loadgen, "run_cell", fake_run_cell)
    hook = loadgen.interleaved_hook(plan, lambda: ["a:1"], lambda: [1], out)
    for n in range(len(plan)):
        hook(n)
    assert ran == [(False, 1), (False, 64), (True, 1), (True, 64)]
    assert len(out.cells) == 4


def test_compare_reads_the_best_model_of_each_cell_from_bench_locks_json(
    tmp_path: Path,
) -> None:
    def cell(hot: bool, clients: int, procs: int, rate: float, cpu: float) -> dict[str, Any]:
        return {
            "hot": hot,
            "clients": clients,
            "procs": procs,
            "pairs_per_s": rate,
            "pair": {"p50_ms": 4.0, "p99_ms": 9.0, "samples": 10},
            "server_cpu": cpu,
        }

    path = tmp_path / "locks.json"
    cells = [cell(False, 64, 1, 1000.0, 0.5), cell(False, 64, 2, 1200.0, 0.9)]
    path.write_text(json.dumps({"dlm": {"cells": cells}}))
    first = loadgen.first_from_json(str(path))
    best = first(False, 64)
    assert best is not None
    assert best["pairs_per_s"] == 1200.0
    assert best["server_cpu_per_pair_us"] == pytest.approx(750.0)
    assert first(True, 64) is None


def test_leases_outlive_the_cell_within_the_protocols_bounds() -> None:
    assert loadgen.lease_ttl_ms(1.0, 3.0) == 30_000  # bench.locks' TTL
    assert loadgen.lease_ttl_ms(1.0, 600.0) == 1_222_000
    assert loadgen.lease_ttl_ms(0.0, 1e9) == 86_400_000
