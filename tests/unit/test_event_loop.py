"""DLM_EVENT_LOOP: which loop a member, a supervisor or a gateway runs on, and its refusals."""

from __future__ import annotations

import asyncio

import pytest

from dlm import event_loop
from dlm.event_loop import ASYNCIO, ENV, UVLOOP, EventLoopChoiceError, chosen_loop

needs_uvloop = pytest.mark.skipif(
    not event_loop.uvloop_installed(), reason="uvloop is not installed here"
)


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a platform with no uvloop wheel (or in the zipapp)."""
    monkeypatch.setattr(event_loop, "uvloop_installed", lambda: False)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_means_asyncio_even_where_uvloop_is_installed(value: str | None) -> None:
    # Measured no faster for members (bench/results/ab.md): installed is not chosen.
    assert chosen_loop({} if value is None else {ENV: value}) == ASYNCIO == event_loop.DEFAULT


@pytest.mark.usefixtures("without_uvloop")
def test_unset_means_asyncio_where_uvloop_is_not_installed() -> None:
    assert chosen_loop({}) == ASYNCIO


@pytest.mark.parametrize(("value", "loop"), [("asyncio", ASYNCIO), (" AsyncIO ", ASYNCIO)])
def test_asyncio_can_always_be_chosen(value: str, loop: str) -> None:
    assert chosen_loop({ENV: value}) == loop


@needs_uvloop
def test_uvloop_can_be_chosen_where_installed() -> None:
    assert chosen_loop({ENV: "uvloop"}) == UVLOOP


@pytest.mark.parametrize("value", ["trio", "uv", "asyncio,uvloop", "1"])
def test_an_unknown_loop_is_one_line_naming_the_choices(value: str) -> None:
    with pytest.raises(EventLoopChoiceError) as caught:
        chosen_loop({ENV: value})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{ENV} must be asyncio or uvloop, not {value.strip()!r}")


@pytest.mark.usefixtures("without_uvloop")
def test_uvloop_where_it_is_not_installed_says_what_to_do() -> None:
    with pytest.raises(EventLoopChoiceError) as caught:
        chosen_loop({ENV: "uvloop"})
    assert str(caught.value) == (
        f"{ENV}=uvloop but uvloop is not installed: pip install uvloop, or set {ENV}=asyncio"
    )


async def _loop_name() -> str:
    return event_loop.running_loop_name(asyncio.get_running_loop())


def test_asyncio_runs_on_asyncios_own_loop() -> None:
    assert event_loop.run(ASYNCIO, _loop_name) == ASYNCIO


@needs_uvloop
def test_uvloop_runs_on_uvloop() -> None:
    assert event_loop.run(UVLOOP, _loop_name) == UVLOOP


async def _timer_floor() -> float:
    return event_loop.timer_floor(asyncio.get_running_loop())


def test_asyncios_loop_is_asked_for_any_wait() -> None:
    assert event_loop.run(ASYNCIO, _timer_floor) == 0.0


@needs_uvloop
def test_uvloop_is_asked_for_whole_milliseconds_at_least() -> None:
    # Shorter waits round to none on libuv's millisecond timers: the member's clock spun.
    assert event_loop.run(UVLOOP, _timer_floor) == 0.001
