"""What shared-secret authentication costs: the handshake per side, and the MAC per frame.

Run with ``python -m bench.auth``. Not a test. Prints the best of several timed
rounds (the machine may be shared) of: the initiator's and the responder's CPU
for one handshake (dlm.auth only: the hello, welcome and auth frames' encoding
is the same as without authentication, plus a few fields), and sealing plus
opening one frame of a typical client request's size and of 1 MB.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dlm import auth

ROUNDS = 7
SECRET = auth.new_secret().encode()


def _best_seconds(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(repeat):
            run()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def main() -> None:
    hello = {"t": "hello", "role": "peer", "version": 1, "cluster": "c", "node": "n2"}
    nonces = (auth.new_nonce(), auth.new_nonce())
    initiator = auth.Initiator(SECRET, nonces[0], role="peer", cluster="c", node="n2")
    hello.update(initiator.hello_fields())
    responder = auth.Responder(SECRET, nonces[1], node="n1")
    welcome = {"t": "welcome", "node": "n1", **responder.welcome_fields(hello)}
    auth_frame = initiator.check_welcome(welcome)

    def initiator_side() -> object:
        side = auth.Initiator(SECRET, nonces[0], role="peer", cluster="c", node="n2")
        side.hello_fields()
        side.check_welcome(welcome)
        return side.keys()

    def responder_side() -> object:
        side = auth.Responder(SECRET, nonces[1], node="n1")
        side.welcome_fields(hello)
        return side.check_auth(auth_frame)

    for name, run in (("initiator", initiator_side), ("responder", responder_side)):
        print(f"handshake, {name} side: {_best_seconds(run, 2000) * 1e6:8.1f} us CPU")
    for size, repeat in ((150, 20_000), (1 << 20, 20)):
        body = bytes(size)
        sealer, opener = auth.FrameSealer(SECRET), auth.FrameOpener(SECRET)
        seal = _best_seconds(lambda body=body, sealer=sealer: sealer.seal(body), repeat)
        # Opening must follow the sealing order: seal a fresh run for each round.
        best_open = float("inf")
        for _ in range(ROUNDS):
            sealer, opener = auth.FrameSealer(SECRET), auth.FrameOpener(SECRET)
            sealed = [sealer.seal(body)[4:] for _ in range(repeat)]
            start = time.perf_counter()
            for payload in sealed:
                opener.open(payload)
            best_open = min(best_open, (time.perf_counter() - start) / repeat)
        print(f"frame of {size} B: seal {seal * 1e6:8.1f} us, open {best_open * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
