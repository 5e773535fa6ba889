"""The replicated lock state machine: leases, fencing tokens and FIFO waiters.

Theory of operation
-------------------
The leader encodes each client request as a command (``encode_command``) and
proposes it; once committed, every replica hands the entry to
``LockStateMachine.apply(index, data)``, which returns an ``ApplyOutcome``:

* ``result``: the reply for whoever proposed the entry (a ``Result``);
* ``grants``: waiters that this entry made holders; the node each waiter is
  connected to pushes the grant to it;
* ``opened`` / ``closed`` / ``expired``: lease lifecycle events for the
  leader's lease tracker.

Time never comes from a clock here. The leader stamps ``at_ms`` into each
command for display, and ends a lease only by proposing ``Expire`` when the
deadline it keeps on its own monotonic clock passes. Keep-alives do not go
through the log. The fencing token of a grant is the index of the entry that
made it, so tokens rise strictly per key with no counter to replicate.

Requests that change state carry (lease, seq), where seq is a request id the
client picks and reuses unchanged when it re-sends (docs/PROTOCOL.md). Each
lease remembers the results of its last 32 request ids: a re-sent request gets
its remembered result without running again, except that a re-sent waiting
acquire whose answer was ``Queued`` reports where the wait stands now
(``Granted`` with its token once granted). Ids need not increase, so a client
may run several requests of one lease concurrently.
"""

from dlm.node.locks.commands import (
    COMMAND_MAX_BYTES,
    KEY_MAX_CHARS,
    LEASE_ID_MAX_CHARS,
    LIMIT_MAX,
    META_KEY_MAX_CHARS,
    META_MAX_ENTRIES,
    META_VALUE_MAX_CHARS,
    TTL_MAX_MS,
    TTL_MIN_MS,
    Acquire,
    CloseLease,
    Command,
    CommandError,
    Expire,
    OpenLease,
    Release,
    check_key,
    check_lease_id,
    check_meta,
    decode_command,
    encode_command,
    validate_command,
)
from dlm.node.locks.machine import (
    ApplyOutcome,
    Counts,
    KeyState,
    LeaseInfo,
    LockStateMachine,
)
from dlm.node.locks.results import (
    BadRequest,
    Grant,
    Granted,
    Holder,
    LeaseClosed,
    LeaseOpened,
    Locked,
    NotHolder,
    Queued,
    Released,
    Result,
    SessionExpired,
    Waiter,
    result_from_dict,
)

__all__ = [
    "COMMAND_MAX_BYTES",
    "KEY_MAX_CHARS",
    "LEASE_ID_MAX_CHARS",
    "LIMIT_MAX",
    "META_KEY_MAX_CHARS",
    "META_MAX_ENTRIES",
    "META_VALUE_MAX_CHARS",
    "TTL_MAX_MS",
    "TTL_MIN_MS",
    "Acquire",
    "ApplyOutcome",
    "BadRequest",
    "CloseLease",
    "Command",
    "CommandError",
    "Counts",
    "Expire",
    "Grant",
    "Granted",
    "Holder",
    "KeyState",
    "LeaseClosed",
    "LeaseInfo",
    "LeaseOpened",
    "LockStateMachine",
    "Locked",
    "NotHolder",
    "OpenLease",
    "Queued",
    "Release",
    "Released",
    "Result",
    "SessionExpired",
    "Waiter",
    "check_key",
    "check_lease_id",
    "check_meta",
    "decode_command",
    "encode_command",
    "result_from_dict",
    "validate_command",
]
