"""A real process appending through DiskStorage, killed with SIGKILL at random moments.

The child prints each index right after ``append`` returned (so the index is
acknowledged as durable); the parent kills it after a seeded random number of
acknowledgements, reopens the directory and checks that every acknowledged
entry is there, in order, then starts the next child on the same directory.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlm.store.disk import DiskStorage

KILLS = 24
READ_TIMEOUT_S = 20.0

CHILD = """
import sys
from dlm.records import Entry
from dlm.store.disk import DiskStorage

store = DiskStorage.open(sys.argv[1], segment_bytes=8192)
index = store.last_index()
print("ready", index, flush=True)
for _ in range(200_000):
    count = index % 9 + 1
    store.append([Entry(i, 1, b"entry-%d|" % i * 4) for i in range(index + 1, index + count + 1)])
    index += count
    print(index, flush=True)
"""


def expected_data(index: int) -> bytes:
    return b"entry-%d|" % index * 4


def read_line(proc: subprocess.Popen[bytes], selector: selectors.BaseSelector) -> str:
    """One line from the child, or fail after READ_TIMEOUT_S (never hang the suite)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READ_TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "child went silent"
        if selector.select(remaining):
            line = proc.stdout.readline()
            assert line, f"child exited early: {proc.wait()}"
            return line.decode().strip()


def test_kill_minus_nine_never_loses_an_acknowledged_entry(tmp_path: Path) -> None:
    rng = random.Random(20240607)
    data_dir = str(tmp_path / "node")
    acknowledged = 0
    for _ in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, data_dir],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[3],
        )
        try:
            assert proc.stdout is not None
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                ready = read_line(proc, selector).split()
                assert ready[0] == "ready"
                assert int(ready[1]) >= acknowledged
                for _ in range(rng.randint(1, 60)):
                    acknowledged = int(read_line(proc, selector))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=READ_TIMEOUT_S)
            if proc.stdout is not None:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL

        with DiskStorage.open(data_dir, segment_bytes=8192) as store:
            assert store.last_index() >= acknowledged
            entries = store.entries(1, store.last_index() + 1)
            assert [e.index for e in entries] == list(range(1, store.last_index() + 1))
            assert all(e.data == expected_data(e.index) for e in entries)
    assert acknowledged > KILLS
