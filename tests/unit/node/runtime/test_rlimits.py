"""The open-files limit: raised to the hard limit, never lowered, failures reported."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from dlm.node.runtime import rlimits

INF = resource.RLIM_INFINITY


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse_above: int | None = None) -> None:
        self.soft, self.hard, self.refuse_above = soft, hard, refuse_above

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        soft, hard = limits
        assert hard == self.hard
        if self.refuse_above is not None and soft > self.refuse_above:
            raise ValueError("not allowed to raise maximum limit")
        self.soft = soft


@pytest.mark.parametrize(
    ("soft", "hard", "refuse_above", "after"),
    [
        (1024, 524288, None, 524288),  # the usual case
        (4096, 4096, None, 4096),  # nothing to do
        (1024, INF, None, rlimits.FALLBACK_LIMIT),  # unlimited: the fallback
        (1024, INF, 65536, 1024),  # the fallback refused too: unchanged
        (1024, 1 << 30, rlimits.FALLBACK_LIMIT, rlimits.FALLBACK_LIMIT),  # above nr_open
        (INF, INF, None, INF),  # already unlimited: never lowered
        (2_000_000, INF, None, 2_000_000),  # above the fallback: never lowered
    ],
)
def test_the_soft_limit_goes_up_to_the_hard_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, refuse_above: int | None, after: int
) -> None:
    fake = FakeLimits(soft, hard, refuse_above)
    monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", fake.setrlimit)
    result = rlimits.raise_open_files_limit()
    assert (result.before, result.after, result.hard) == (soft, after, hard)
    assert fake.soft == after
    assert (result.error is not None) == (refuse_above is not None and after == soft)


def test_it_raises_the_real_limit_of_a_process() -> None:
    probe = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from dlm.node.runtime.rlimits import raise_open_files_limit\n"
        "result = raise_open_files_limit()\n"
        "print(result.before, result.after, *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    before, after, soft, hard = map(int, out)
    assert before <= 256
    assert after == soft
    assert soft == hard or (hard == INF and soft == rlimits.FALLBACK_LIMIT) or hard > soft >= 256
