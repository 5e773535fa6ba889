"""The command the chaos run's `dlm exec` lanes run under the lock: one read-modify-write.

``python -m tests.chaos.critical STORE EVENTS RUN WORK_S``: records its own start
(with the token, lease and key dlm hands it), reads the counter of its key from
the fenced store under ``$DLM_FENCING_TOKEN``, works for WORK_S seconds while
recording a heartbeat every 20 ms (its last sign of life, if it is killed),
writes the counter plus one under the same token, and records its end. Standard
library only, and nothing else: it must start fast.
"""

from __future__ import annotations

import os
import sys
import time

from tests.chaos.record import Recorder
from tests.chaos.store import StoreClient, StoreRefused

BEAT_S = 0.02


def store_op(
    rec: Recorder,
    store: StoreClient,
    f: str,
    *,
    key: str,
    token: int,
    expected: int | None,
    lease: str,
) -> int | None:
    op = rec.call(f, key=key, token=token, lease=lease)
    try:
        if f == "read":
            value = store.read(key, token, op)
        else:
            assert expected is not None
            value = store.write(key, token, expected, op)
    except StoreRefused:
        rec.ret(op, "fail", detail="refused")
        return None
    except OSError as exc:
        rec.ret(op, "unknown", detail=str(exc))
        return None
    rec.ret(op, "ok", value=value)
    return value


def main(argv: list[str]) -> int:
    store_addr, events, run, work = argv[0], argv[1], argv[2], float(argv[3])
    key = os.environ["DLM_LOCK_KEY"]
    token = int(os.environ["DLM_FENCING_TOKEN"])
    lease = os.environ["DLM_LEASE_ID"]
    rec = Recorder(events, run)
    rec.event("cmd_start", key=key, token=token, lease=lease, pid=os.getpid())
    store = StoreClient(store_addr)
    value = store_op(rec, store, "read", key=key, token=token, expected=None, lease=lease)
    end = time.monotonic() + work
    while time.monotonic() < end:
        time.sleep(min(BEAT_S, max(0.0, end - time.monotonic())))
        rec.event("beat")
    if value is not None:
        store_op(rec, store, "write", key=key, token=token, expected=value, lease=lease)
    store.close()
    rec.event("cmd_end")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
