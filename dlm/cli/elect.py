"""Leader election on a lock key: `dlm elect`, `dlm leader`.

An election NAME is the lock key NAME itself (same key space, same permissions). A
candidate campaigns by queueing for the key (FIFO: the existing waiter queue); the one
holding it leads, with the fencing token of its grant as the leadership epoch, and its
value is the ``value`` entry of the grant's metadata. `dlm elect` is `dlm exec` with
these few changes (exec_cmd.py takes an ``Election``): it waits for the key as long as it
takes, records the value with its acquire, prints the election once it holds the key,
and without CMD holds the key with a placeholder that waits for SIGINT or SIGTERM
(then resigns: the lock is released, exit 0). So CMD runs under exactly exec's
guarantees: it is stopped before the lease can end, and so before another candidate
can be elected.

Election is not fencing: a leader that is paused or cut off past its lease may still
act; only the token, passed to what it writes to, makes that safe (README).
"""

from __future__ import annotations

import sys

from dlm.cli import exits
from dlm.cli.exits import CliError
from dlm.cli.output import emit_json, escape, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from dlm.cli.settings import Settings
    from dlm.client.core import Grant

ELECTION_VALUE = "value"
"""The metadata entry of a grant that holds an election's value (core.ELECTION_VALUE)."""
CAMPAIGN_WAIT = "168h"
"""How long a candidate stays in the queue: the longest --wait there is."""
RESIGNED = (128 + 2, 128 + 15)
"""The placeholder's exit codes when SIGINT or SIGTERM (passed on by dlm) ended it."""


class Election:
    """One `dlm elect` run: its name and value, and whether CMD was given."""

    def __init__(self, name: str, value: str, *, has_command: bool) -> None:
        self.name = name
        self.value = value
        self.has_command = has_command

    def meta(self) -> dict[str, str]:
        return {ELECTION_VALUE: self.value}

    def placeholder(self) -> list[str]:
        """What holds the key without CMD: a process that waits for a signal (dlm passes
        SIGINT and SIGTERM on to it), dying of it silently."""
        code = (
            "import signal\n"
            "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "while True:\n"
            "    signal.pause()\n"
        )
        return [sys.executable, "-c", code]

    def elected(self, grant: Grant, as_json: bool) -> None:
        """Prints the election as soon as this candidate holds the key."""
        import time

        from dlm.client.core import iso_utc

        since = iso_utc(int(time.time() * 1000))
        if as_json:
            emit_json(
                {
                    "name": self.name,
                    "value": self.value,
                    "token": grant.token,
                    "since": since,
                    "lease": grant.lease,
                }
            )
        else:
            say(
                f"elected: {escape(self.name)} is led by this candidate, value "
                f"{escape(self.value)!r}, token {grant.token} (the leadership epoch), since "
                f"{since}, lease {grant.lease}"
            )
        sys.stdout.flush()

    def exit_code(self, code: int) -> int:
        """Without CMD, a resignation by SIGINT or SIGTERM is a success."""
        if not self.has_command and code in RESIGNED:
            return 0
        return code


def elect(
    settings: Settings,
    *,
    name: str,
    value: str,
    command: Sequence[str],
    ttl: str | None,
    kill_grace: str | None,
    lock_delay: str | None,
) -> int:
    from dlm import limits
    from dlm.cli import exec_cmd, ops

    ops.check_lock_options(name, 1, "NAME")
    problem = limits.check_meta({ELECTION_VALUE: value})
    if problem is not None:
        raise CliError("USAGE", f"bad --value: {problem}", 2)
    election = Election(name, value, has_command=bool(command))
    return exec_cmd.run(
        settings,
        key=name,
        command=list(command),
        ttl=ttl,
        wait=CAMPAIGN_WAIT,
        kill_grace=kill_grace,
        conflict_exit_code=None,
        limit=1,
        quiet=True,
        lock_delay=lock_delay,
        election=election,
    )


def leader(settings: Settings, name: str) -> None:
    """Prints the current leader of ``name`` once."""
    from dlm.cli.ops import check_key

    check_key(name, "NAME")
    client = settings.connect()
    try:
        state = client.get(name)
    finally:
        client.close()
    if state.limit not in (None, 1):
        raise CliError(
            "USAGE",
            f"{name!r} is a semaphore of {state.limit} slots, not an election",
            2,
        )
    from dlm.client.core import leadership

    found = leadership(name, state)
    if settings.json:
        emit_json({**found, "lease": found.get("lease")})
    elif found["value"] is None:
        say(f"nobody leads {escape(name)}")
    else:
        say(
            f"{escape(name)} is led by lease {found['lease']}, value {escape(found['value'])!r}, "
            f"token {found['token']}, since {found['since']}"
        )


def proclaim(settings: Settings, name: str, value: str, lease: str) -> None:
    """Changes NAME's value without a new election, only for the lease that leads it (exit
    77, NOT_HOLDER, otherwise)."""
    from dlm import limits
    from dlm.cli.ops import check_key, check_lease
    from dlm.client.errors import NotHolder

    check_key(name, "NAME")
    check_lease(lease)
    problem = limits.check_meta({ELECTION_VALUE: value})
    if problem is not None:
        raise CliError("USAGE", f"bad --value: {problem}", 2)
    client = settings.connect()
    try:
        token = client.proclaim(lease, name, value)
    except NotHolder:
        raise CliError(
            "NOT_HOLDER",
            f"lease {lease} does not lead {name!r}: only the leader's lease may proclaim",
            exits.LOST,
            name=name,
            lease=lease,
        ) from None
    finally:
        client.close()
    if settings.json:
        emit_json({"name": name, "value": value, "token": token, "lease": lease})
    else:
        say(f"{escape(name)}: value is now {escape(value)!r} (token {token}, lease {lease})")
