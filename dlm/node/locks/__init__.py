"""The replicated lock state machine: leases, fencing tokens and FIFO waiters.

Theory of operation
-------------------
The leader encodes each client request as a command (``encode_command``) and
proposes it; once committed, every replica hands the entry to
``LockStateMachine.apply(index, data)``, which returns an ``ApplyOutcome``:

* ``result``: the reply for whoever proposed the entry (a ``Result``);
* ``promotions``: waiters that this entry made holders; the member each waiter
  is connected to pushes the grant to it;
* ``armed`` / ``ended`` / ``expired``: lease lifecycle events for the
  leader's lease tracker.

Time never comes from a clock here. The leader stamps ``at_ms`` into each
command for display, and ends a lease only by proposing ``Expire`` when the
deadline it keeps on its own monotonic clock passes. Keep-alives do not go
through the log. The fencing token of a grant is the index of the entry that
made it, so tokens rise strictly per key with no counter to replicate.

Requests that change state carry an ``Origin`` (client id, a seq that rises
per client, and the client's acknowledged floor; docs/PROTOCOL.md): a re-sent
request gets its remembered result without running again, except that a
re-sent waiting acquire whose answer was ``Queued`` reports where the wait
stands now (``Granted`` with its token once granted), and a request at or
below the floor is refused as stale. Leases carry an incarnation, and ended
leases leave tombstones, so an ``Expire`` or a delayed duplicate cannot act on
a lease other than the one it was meant for.
"""

from dlm.node.locks.commands import (
    COMMAND_MAX_BYTES,
    DELAY_LEASE_PREFIX,
    LEGACY_CLIENT,
    QUARANTINE_LEASE,
    AcquireCommand,
    ClientCommand,
    CloseLeaseCommand,
    ClusterVersionCommand,
    Command,
    CommandError,
    ExpireCommand,
    IdentityCommand,
    LeaseCommand,
    OpenLeaseCommand,
    Origin,
    ProclaimCommand,
    QuarantineCommand,
    ReleaseCommand,
    SettingsCommand,
    UpdateLeaseCommand,
    decode_command,
    delay_lease,
    delayed_key,
    encode_command,
    is_legacy,
    validate_command,
)
from dlm.node.locks.delays import LockDelay, LockDelays
from dlm.node.locks.ledger import Run, RunLedger, RunReport
from dlm.node.locks.machine import (
    MAX_UNANSWERED,
    TOMBSTONE_MS,
    TOMBSTONES,
    ApplyOutcome,
    Counts,
    KeyState,
    KeyView,
    LeaseTerms,
    LeaseView,
    LockStateMachine,
    Quarantine,
    held_count,
    holder_meta,
    key_state,
    longest_ttl_ms,
    start_incarnation,
)
from dlm.node.locks.results import (
    LEASE_CLOSED,
    LEASE_EXPIRED,
    LEASE_UNKNOWN,
    Denied,
    Granted,
    Holder,
    IdentityChanged,
    Invalid,
    LeaseClosed,
    LeaseGone,
    LeaseOpened,
    LeaseUpdated,
    Locked,
    NotHeld,
    Promotion,
    Queued,
    QuotaExceeded,
    Released,
    Result,
    SettingChanged,
    StaleRequest,
    Waiter,
    result_from_dict,
)
from dlm.node.locks.settings import ClusterSettings

__all__ = [
    "COMMAND_MAX_BYTES",
    "DELAY_LEASE_PREFIX",
    "LEASE_CLOSED",
    "LEASE_EXPIRED",
    "LEASE_UNKNOWN",
    "LEGACY_CLIENT",
    "MAX_UNANSWERED",
    "QUARANTINE_LEASE",
    "TOMBSTONES",
    "TOMBSTONE_MS",
    "AcquireCommand",
    "ApplyOutcome",
    "ClientCommand",
    "CloseLeaseCommand",
    "ClusterSettings",
    "ClusterVersionCommand",
    "Command",
    "CommandError",
    "Counts",
    "Denied",
    "ExpireCommand",
    "Granted",
    "Holder",
    "IdentityChanged",
    "IdentityCommand",
    "Invalid",
    "KeyState",
    "KeyView",
    "LeaseClosed",
    "LeaseCommand",
    "LeaseGone",
    "LeaseOpened",
    "LeaseTerms",
    "LeaseUpdated",
    "LeaseView",
    "LockDelay",
    "LockDelays",
    "LockStateMachine",
    "Locked",
    "NotHeld",
    "OpenLeaseCommand",
    "Origin",
    "ProclaimCommand",
    "Promotion",
    "Quarantine",
    "QuarantineCommand",
    "Queued",
    "QuotaExceeded",
    "ReleaseCommand",
    "Released",
    "Result",
    "Run",
    "RunLedger",
    "RunReport",
    "SettingChanged",
    "SettingsCommand",
    "StaleRequest",
    "UpdateLeaseCommand",
    "Waiter",
    "decode_command",
    "delay_lease",
    "delayed_key",
    "encode_command",
    "held_count",
    "holder_meta",
    "is_legacy",
    "key_state",
    "longest_ttl_ms",
    "result_from_dict",
    "start_incarnation",
    "validate_command",
]
