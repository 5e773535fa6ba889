"""The server side of dlm: the Raft core, the lock state machine and their runtime."""
