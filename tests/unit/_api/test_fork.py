"""In a forked child every client and lock object is inert (dlm/_api/fork.py): calls raise,
and ``close``, ``with`` exits and finalizers do nothing. No cluster is needed: the objects
are made without connecting, and the child reports through a pipe."""

from __future__ import annotations

import os
import warnings

import anyio

import dlm
from dlm._api.fork import Owner


def _in_child(work: object) -> str:
    """Runs ``work()`` in a forked child; what it returned (or the error's class name)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: not ours
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            try:
                answer = str(work())  # type: ignore[operator]
            except BaseException as exc:
                answer = type(exc).__name__
            os.write(write_end, answer.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_an_owner_is_inert_in_a_forked_child_only() -> None:
    owner = Owner()
    assert not owner.inert
    assert _in_child(lambda: owner.inert) == "True"
    assert _in_child(lambda: Owner().inert) == "False"  # made in the child: its own


def test_calls_raise_in_the_child() -> None:
    client = dlm.Client("127.0.0.1:1")
    lock = client.lock("k")
    assert _in_child(lock.acquire) == "InertAfterFork"
    assert _in_child(lock.locked) == "InertAfterFork"
    assert _in_child(lock.release) == "InertAfterFork"
    assert _in_child(lambda: client.lock("k").acquire()) == "InertAfterFork"
    assert _in_child(client.__enter__) == "InertAfterFork"


def test_exits_and_close_do_nothing_in_the_child() -> None:
    client = dlm.Client("127.0.0.1:1")
    lock = client.lock("k")
    lock._holding = True  # as if held: a release would reach for the cluster

    def leave() -> str:
        lock.__exit__(None, None, None)
        client.close()
        return f"{lock._holding} {client._closed}"

    assert _in_child(leave) == "True False"
    lock._holding = False


def test_async_objects_are_inert_in_the_child_too() -> None:
    client = dlm.AsyncClient("127.0.0.1:1")
    lock = client.lock("k")

    def use() -> str:
        async def main() -> str:
            await client.aclose()  # does nothing
            try:
                async with lock:
                    return "entered"
            except dlm.InertAfterFork:
                return f"inert {client._closed}"

        return anyio.run(main)

    assert _in_child(use) == "inert False"
