"""dlm: a distributed lock service with Raft-replicated leases and fencing tokens."""

__version__ = "0.1.0"
