"""Raft as a pure state machine: no sockets, clocks, files, threads or randomness of its own.

See types.py for the contract between the core and the runtime that drives it.
"""
