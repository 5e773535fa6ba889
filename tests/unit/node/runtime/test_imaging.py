"""Images built in a forked child: the state at the fork, whole, and every child reaped."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable

import pytest

from dlm.node.runtime.imaging import ChildImage, ForkImager

WAIT = 30.0


async def _result(made: ChildImage) -> tuple[bytes | None, str | None]:
    done = asyncio.Event()
    got: list[tuple[bytes | None, str | None]] = []

    def finished(image: bytes | None, problem: str | None) -> None:
        got.append((image, problem))
        done.set()

    made.add_done_callback(finished)
    await asyncio.wait_for(done.wait(), WAIT)
    return got[0]


def _no_child_left(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped already
    return False


def test_the_image_is_the_state_at_the_fork_and_arrives_whole() -> None:
    table = {"rows": [b"x" * 1000] * 3000}  # 3 MB: several reads of the pipe

    async def main() -> None:
        imager = ForkImager(asyncio.get_running_loop())
        made = imager(lambda: b"".join(table["rows"]), "periodic")
        assert isinstance(made, ChildImage) and made.fork_s >= 0
        table["rows"] = [b"changed"]  # after the fork: the child does not see it
        assert gc.get_freeze_count() > 0, "the parent's collector leaves the pages alone"
        assert imager(lambda: b"", "periodic") is None, "one child per purpose"
        other = imager(lambda: b"other", "backup")
        assert isinstance(other, ChildImage)
        image, problem = await _result(made)
        assert problem is None and image == b"x" * 3_000_000
        assert await _result(other) == (b"other", None)
        assert imager.running == {} and gc.get_freeze_count() == 0
        assert _no_child_left(made.pid) and _no_child_left(other.pid)

    asyncio.run(main())


def test_a_child_that_fails_is_reported_and_reaped() -> None:
    def broken() -> bytes:
        raise RuntimeError("no image today")

    async def main() -> None:
        imager = ForkImager(asyncio.get_running_loop())
        made = imager(broken, "periodic")
        assert isinstance(made, ChildImage)
        image, problem = await _result(made)
        assert image is None and problem is not None and "exited with status 1" in problem
        assert _no_child_left(made.pid) and imager.running == {}

    asyncio.run(main())


@pytest.mark.parametrize("how", ["timeout", "close"])
def test_a_child_that_hangs_is_killed(how: str) -> None:
    def hangs() -> bytes:
        time.sleep(WAIT)  # a stuck child, not synchronisation: it is killed long before
        return b""

    async def main() -> None:
        imager = ForkImager(asyncio.get_running_loop(), timeout_s=0.2 if how == "timeout" else 60)
        made = imager(hangs, "backup")
        assert isinstance(made, ChildImage)
        if how == "close":
            imager.close()
        image, problem = await _result(made)
        assert image is None and problem is not None
        assert ("longer than 0.2 s" if how == "timeout" else "the member stopped") in problem
        assert _no_child_left(made.pid)

    asyncio.run(main())


def test_without_fork_the_image_is_built_on_the_spot() -> None:
    async def main() -> None:
        build: Callable[[], bytes] = lambda: b"now"  # noqa: E731
        assert ForkImager(asyncio.get_running_loop(), fork=False)(build, "periodic") == b"now"

    asyncio.run(main())
