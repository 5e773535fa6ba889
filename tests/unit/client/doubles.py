"""Socket doubles for what a healthy one-member cluster will not do on demand.

Each is a few lines of scripted behaviour on 127.0.0.1 port 0, named for what
it does; none answers requests the way a member would (real_member.py's
member does that):

* ``scripted_member(script)``: welcomes every connection and answers each
  request with ``script(request)`` (a list of frames, maybe empty); with
  ``welcome_after_first_request`` it greets only once a request has arrived;
  with ``greeting`` it answers the hello with that frame and hangs up.
  ``silent_member``, ``redirecting_member`` and ``refusing_member`` are the
  usual scripts.
* ``CuttingProxy``: relays frames between the client and a real member and
  cuts both connections once: when the member answers the first request
  that matches ``cut_after_request`` (the member acted, its answer is lost),
  or right after relaying the first reply that matches ``cut_after_reply``
  (the client got the answer, then lost the connection).

Both record the frames they saw, and ``wait_for`` waits for them with a
bounded timeout. Threads are daemons, stopped and joined on exit.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dlm.wire import (
    PEER_FRAME_LIMIT,
    PROTOCOL_VERSION,
    ErrorCode,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    error,
    welcome,
)

Frame = dict[str, Any]
Script = Callable[[Frame], list[Frame]]
WAIT = 5.0
POLL = 0.02


class _Recorder:
    def __init__(self) -> None:
        self.received: list[Frame] = []
        self._cond = threading.Condition()

    def _saw(self, frame: Any) -> None:
        if isinstance(frame, dict):
            with self._cond:
                self.received.append(frame)
                self._cond.notify_all()

    def of_type(self, kind: str) -> list[Frame]:
        with self._cond:
            return [f for f in self.received if f.get("t") == kind]

    def wait_for(self, kind: str, count: int = 1, timeout: float = WAIT) -> list[Frame]:
        with self._cond:
            done = self._cond.wait_for(
                lambda: len([f for f in self.received if f.get("t") == kind]) >= count, timeout
            )
            assert done, f"{count} {kind!r} frames did not arrive within {timeout}s"
            return [f for f in self.received if f.get("t") == kind]


class _Listener:
    """Accepts on 127.0.0.1 and runs ``serve(sock)`` per connection, each in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._serve = serve
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self._spawn(self._accept_loop)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            readable, _, _ = select.select([self._sock], [], [], POLL)
            if readable:
                sock, _ = self._sock.accept()
                with self._lock:
                    self._conns.append(sock)
                self._spawn(self._serve, sock)

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            threads, conns = list(self._threads), list(self._conns)
        for thread in threads:
            thread.join(WAIT)
        for sock in conns:
            sock.close()
        self._sock.close()


def _frames(sock: socket.socket, stopping: threading.Event) -> Iterator[tuple[Frame, bytes]]:
    """(decoded frame, its bytes) as they arrive, until the peer or we hang up."""
    decoder = FrameDecoder(PEER_FRAME_LIMIT)
    while not stopping.is_set():
        readable, _, _ = select.select([sock], [], [], POLL)
        if not readable:
            continue
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        decoder.feed(data)
        try:
            for frame in decoder.frames():
                yield frame, encode_frame(frame)
        except ProtocolError:
            return


def _send(sock: socket.socket, frame: Any) -> bool:
    try:
        sock.sendall(encode_frame(frame))
    except OSError:
        return False
    return True


class ScriptedMember(_Recorder):
    def __init__(
        self,
        script: Script,
        *,
        greeting: Frame | None = None,
        welcome_after_first_request: bool = False,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        super().__init__()
        self._version = version  # the protocol version its welcome negotiates
        self._script = script
        self._greeting = greeting
        self._late_welcome = welcome_after_first_request
        self._listener = _Listener(self._serve)
        self.addr = self._listener.addr
        self.hellos: list[Frame] = []
        """The hello of each connection, in order."""

    def _serve(self, sock: socket.socket) -> None:
        hello_seen = False
        for frame, _ in _frames(sock, self._listener.stopping):
            if not hello_seen:
                hello_seen = True
                self.hellos.append(frame)
                if self._greeting is not None:
                    _send(sock, self._greeting)
                    sock.shutdown(socket.SHUT_RDWR)
                    return
                if not self._late_welcome:
                    _send(sock, welcome("double", "unit", self._version))
                continue
            self._saw(frame)
            if self._late_welcome:
                self._late_welcome = False
                _send(sock, welcome("double", "unit", self._version))
            for reply in self._script(frame):
                _send(sock, reply)


@contextmanager
def scripted_member(script: Script, **options: Any) -> Iterator[ScriptedMember]:
    double = ScriptedMember(script, **options)
    double._listener.start()
    try:
        yield double
    finally:
        double._listener.stop()


def silent_member() -> Any:
    """Welcomes every connection, then never answers (a member stuck mid-fsync)."""
    return scripted_member(lambda request: [])


def redirecting_member(leader_addr: str) -> Any:
    """A follower that sends every request to ``leader_addr``."""
    return scripted_member(
        lambda request: [
            error(
                request.get("id"),
                ErrorCode.NOT_LEADER,
                "not the leader",
                leader=None,
                leader_address=leader_addr,
            )
        ]
    )


def refusing_member(refusal: Frame) -> Any:
    """Answers the hello with ``refusal`` and hangs up."""
    return scripted_member(lambda request: [], greeting=refusal)


class CuttingProxy(_Recorder):
    """Relays one client's connections to ``target``; cuts once, as described above."""

    def __init__(
        self,
        target: str,
        *,
        cut_after_request: Callable[[Frame], bool] | None = None,
        cut_after_reply: Callable[[Frame], bool] | None = None,
    ) -> None:
        super().__init__()
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._cut_request = cut_after_request
        self._cut_reply = cut_after_reply
        self._armed = threading.Event()
        self._lost_reply: Any = None
        """The id of the request whose answer is dropped (the cut happens when it comes)."""
        self.cuts = 0
        self._listener = _Listener(self._serve)
        self.addr = self._listener.addr

    def _serve(self, client: socket.socket) -> None:
        member = socket.create_connection(self._target, timeout=WAIT)
        relay = threading.Thread(target=self._relay_replies, args=(member, client), daemon=True)
        relay.start()
        try:
            for frame, data in _frames(client, self._listener.stopping):
                self._saw(frame)
                rule = self._cut_request
                if rule is not None and not self._armed.is_set() and rule(frame):
                    self._lost_reply = frame.get("id")
                    self._armed.set()
                member.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(client, member)
            relay.join(WAIT)
            member.close()

    def _relay_replies(self, member: socket.socket, client: socket.socket) -> None:
        # The cut waits for the member's answer, so the member surely acted on the request.
        try:
            for frame, data in _frames(member, self._listener.stopping):
                if self._lost_reply is not None and frame.get("id") == self._lost_reply:
                    self._lost_reply = None
                    self.cuts += 1
                    break
                client.sendall(data)
                rule = self._cut_reply
                if rule is not None and not self._armed.is_set() and rule(frame):
                    self._armed.set()
                    self.cuts += 1
                    break
        except OSError:
            pass
        finally:
            _hang_up(client, member)


def _hang_up(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@contextmanager
def cutting_proxy(target: str, **rules: Any) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(target, **rules)
    proxy._listener.start()
    try:
        yield proxy
    finally:
        proxy._listener.stop()


class PartitionedMember(_Recorder):
    """One address serving ``partitions`` groups, as a member's supervisor does: a
    connection that starts with a preamble (dlm/partitioning.py) is partition i's, any
    other partition 0's. Each connection is welcomed with the count and its partition; a
    request naming a key of another partition gets WRONG_PARTITION (with the count),
    any other ``script(partition, request)``. ``seen`` records (partition, request)."""

    def __init__(self, partitions: int, script: Callable[[int, Frame], list[Frame]]) -> None:
        super().__init__()
        self.partitions = partitions
        self._script = script
        self.seen: list[tuple[int, Frame]] = []
        self._listener = _Listener(self._serve)
        self.addr = self._listener.addr

    def _partition(self, sock: socket.socket) -> int | None:
        from dlm.partitioning import PREAMBLE_SIZE, read_preamble

        readable, _, _ = select.select([sock], [], [], WAIT)
        if not readable:
            return None
        first = sock.recv(PREAMBLE_SIZE, socket.MSG_PEEK)
        if first[:1] == b"\xff":
            first = b""
            while len(first) < PREAMBLE_SIZE:
                more = sock.recv(PREAMBLE_SIZE - len(first))
                if not more:
                    return None
                first += more
        return read_preamble(first)

    def _serve(self, sock: socket.socket) -> None:
        from dlm.partitioning import partition_of

        partition = self._partition(sock)
        if partition is None:
            sock.close()
            return
        hello_seen = False
        for frame, _ in _frames(sock, self._listener.stopping):
            if not hello_seen:
                hello_seen = True
                greeting = welcome("double", "unit")
                if self.partitions > 1:
                    greeting["partitions"] = self.partitions
                if partition:
                    greeting["partition"] = partition
                _send(sock, greeting)
                continue
            self._saw(frame)
            with self._cond:
                self.seen.append((partition, frame))
            key = frame.get("key")
            if isinstance(key, str) and partition_of(key, self.partitions) != partition:
                _send(
                    sock,
                    error(
                        frame.get("id"),
                        ErrorCode.WRONG_PARTITION,
                        "not this partition's key",
                        partitions=self.partitions,
                    ),
                )
                continue
            for reply in self._script(partition, frame):
                _send(sock, reply)


@contextmanager
def partitioned_member(
    partitions: int, script: Callable[[int, Frame], list[Frame]]
) -> Iterator[PartitionedMember]:
    double = PartitionedMember(partitions, script)
    double._listener.start()
    try:
        yield double
    finally:
        double._listener.stop()
