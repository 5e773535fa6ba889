"""Fixtures of the client tests: a real member to talk to (real_member.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .real_member import RunningMember, running_member


@pytest.fixture
def member() -> Iterator[RunningMember]:
    """A real one-member cluster on 127.0.0.1 (see the module docstring)."""
    with running_member() as running:
        yield running


@pytest.fixture
def leaderless_member() -> Iterator[RunningMember]:
    """A real member of a three-member cluster whose two other members never answer:
    it accepts clients but never becomes leader, so it answers changes NOT_LEADER."""
    with running_member(dead_peers=2) as running:
        yield running
