"""`make soak`: many simulator seeds, split over one pytest process per CPU core.

Usage: python tools/soak.py START:COUNT. Each process runs a contiguous share of the
range through both simulators (tests/sim: the Raft core alone, and whole members
with clients, with one partition and partitioned: ``test_node_sim_partitioned``, P = 2
to 4 by the seed); the exit code is non-zero if any share failed, and each failing seed
prints the command that replays it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        sys.stderr.write("usage: python tools/soak.py START:COUNT\n")
        return 2
    start_text, _, count_text = argv[0].partition(":")
    start, count = int(start_text), int(count_text)
    workers = max(1, min(os.cpu_count() or 1, count))
    share = -(-count // workers)
    started = time.monotonic()
    procs = []
    for i in range(workers):
        first = start + i * share
        n = min(share, start + count - first)
        if n <= 0:
            break
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "tests/sim",
                    "-q",
                    f"--sim-seeds={first}:{n}",
                    "-k",
                    "test_raft_sim or test_node_sim or test_node_sim_partitioned",
                ]
            )
        )
    codes = [p.wait() for p in procs]
    minutes = (time.monotonic() - started) / 60
    print(f"soak: {count} seeds from {start} in {minutes:.1f} min over {len(procs)} processes")
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
