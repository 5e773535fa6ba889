"""The runtime's async tests run on both event loops a member can run on (dlm/event_loop.py):
asyncio's own, and uvloop where it is installed (the dev extra installs it)."""

from __future__ import annotations

import pytest

from dlm.event_loop import uvloop_installed

LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(not uvloop_installed(), reason="uvloop is not installed"),
    ),
]


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param
