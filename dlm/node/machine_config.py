"""A member's settings as the node machine takes them: its timing, its quotas, who it is.

A leaf of the pure side (dlm/node/): the machine and the rooms it is built of read these
records, so they live apart from the machine, which imports those rooms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dlm.node.quotas import IdentityLimits, default_limits
from dlm.records import NodeId

PROTOCOL_SPOKEN = 5
"""The highest cluster version this release can run."""


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timing:
    """Clock settings of a member.

    The election timeout is drawn by the core between ``election_ticks`` and
    twice that, so 50 ms ticks and 6 ticks give 300-600 ms: a dead leader is
    replaced well within a second, while a follower whose event loop stalls
    for a few hundred milliseconds under load does not start an election.
    """

    tick_s: float = 0.05
    election_ticks: int = 6
    heartbeat_ticks: int = 1
    request_timeout_s: float = 5.0
    """A proposal or read not answered in this time gets TIMEOUT (the client retries)."""
    expire_retry_s: float = 1.0
    """A lease whose Expire was proposed but is still alive this long after is proposed again."""

    @property
    def election_timeout_s(self) -> float:
        return self.tick_s * self.election_ticks


@dataclass(frozen=True, slots=True)
class Quotas:
    """What one member agrees to hold; requests beyond get QUOTA_EXCEEDED.

    The defaults are far beyond what a fleet of 5,000 hosts needs; they exist
    so that a runaway client cannot make the leader run out of memory.
    """

    max_leases: int = 200_000
    max_locks: int = 2_000_000
    """Held slots plus queued waiters."""
    max_meta_bytes: int = 4096
    """Owner metadata of one lock or lease, names and values together."""
    max_connections: int = 8192
    """Client connections this member serves at once (the runtime's budget)."""
    identity_max_leases: int = 0
    """Each identity's default limits (dlm/node/quotas.py); 0: derived from the caps
    above (half the cluster's leases and locks, 3/4 of the member's connections, 512
    requests in flight per connection)."""
    identity_max_locks: int = 0
    identity_max_connections: int = 0
    identity_max_inflight: int = 0

    def identity_defaults(self, *, anonymous: bool = False) -> IdentityLimits:
        """Every identity's limits where an admin set none of its own (``anonymous``: of
        the identity "", see quotas.default_limits)."""
        return default_limits(
            anonymous=anonymous,
            cluster_max_leases=self.max_leases,
            cluster_max_locks=self.max_locks,
            member_max_connections=self.max_connections,
            max_leases=self.identity_max_leases,
            max_locks=self.identity_max_locks,
            max_connections=self.identity_max_connections,
            max_inflight=self.identity_max_inflight,
        )


@dataclass(frozen=True, slots=True)
class MachineConfig:
    node_id: NodeId
    cluster: str
    peers: Mapping[NodeId, str]
    """The cluster's first members (its bootstrap configuration) and their addresses."""
    timing: Timing = field(default_factory=Timing)
    snapshot_every: int = 10_000
    snapshot_keep: int = 1_000
    quotas: Quotas = field(default_factory=Quotas)
    max_version: int = PROTOCOL_SPOKEN
    """The highest cluster version this member runs (tests lower it to play an old member)."""
    auto_promote: bool = True
    """The leader promotes a learner to voter once it is within PROMOTE_LAG entries, and
    has proved itself (peer_health.py, ``proved``)."""
    peers_authenticated: bool = False
    """Peers prove a secret or a certificate (only for the words of ``members``: with
    authentication off, a learner proves itself by answering at all)."""
    address: str = ""
    """This member's own address (for a member that joined later, not in ``peers``)."""
    incarnation: int = 0
    """The cluster incarnation this member belongs to (0: never restored or recovered):
    its peer hello says it, and a peer of another incarnation is refused."""
    join_members: Mapping[NodeId, str] = field(default_factory=dict)
    """The members a joining member was told of when it joined, with their addresses: it
    dials them until its own log names the configuration, so that it can answer a leader
    that is not among the first members."""
    partition: int = 0
    """The partition whose Raft group this machine is (0 in a cluster of one partition)."""
    partitions: int = 1
    """The cluster's partition count: a request about a key of another partition is
    refused (partition_guard.py)."""
