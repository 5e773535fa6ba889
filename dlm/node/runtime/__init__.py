"""The member's runtime: everything that does IO (sockets, the clock, the disk thread,
files, signals, logs, metrics) around the pure machine in dlm/node. It decides nothing
about locks or Raft; see docs/ARCHITECTURE.md section 2."""
