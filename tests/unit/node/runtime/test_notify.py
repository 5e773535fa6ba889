"""systemd readiness: notify() sends one datagram to $NOTIFY_SOCKET, or quietly does nothing."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm.node.runtime.notify import notify


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5.0)
    try:
        yield sock, path
    finally:
        sock.close()


def test_sends_the_state_to_a_socket_path(
    receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify("READY=1") is True
    assert sock.recv(4096) == b"READY=1"
    assert notify("STOPPING=1\nSTATUS=draining") is True
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"


def test_an_at_sign_means_the_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"dlm-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5.0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1") is True
        assert sock.recv(4096) == b"READY=1"


def test_without_a_socket_it_does_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify("READY=1") is False  # a missed notification never raises
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False
