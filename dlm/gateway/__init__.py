"""The gateway: a relay between clients and the cluster's members (`dlm gateway`).

routing.py is its pure decision (which member a connection goes to), shared by
the runtime (relay.py) and the whole-node simulator (tests/sim); relay.py does
the IO. A gateway reads only a connection's routing bytes and never a frame
after them: the member authenticates the client itself, end to end, so a
gateway holds no secret.
"""
