"""Durable storage for a member: the write-ahead log, the hard state and snapshots."""
