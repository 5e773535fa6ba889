"""WAL throughput on this machine: appends/s and fsyncs/s by batch size.

Run with ``python -m bench.wal [DIR]`` (DIR defaults to a temp dir under the
current directory, so the figures are for that disk). Not a test. Prints, for
batches of 1, 16 and 256 entries of 100 bytes, how many entries and how many
fsyncs per second ``DiskStorage.append`` sustains, next to the raw rate of
"write 100 bytes + fsync" on a plain file in the same directory, measured in
the same run. Each measurement runs for about ``SECONDS_EACH`` seconds.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from dlm.records import Entry
from dlm.store.disk import DiskStorage

SECONDS_EACH = 3.0
ENTRY_BYTES = 100
BATCHES = (1, 16, 256)


def raw_fsync_rate(directory: str) -> float:
    path = os.path.join(directory, "raw-fsync")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    payload = b"x" * ENTRY_BYTES
    count = 0
    start = time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - start) < SECONDS_EACH:
            os.write(fd, payload)
            os.fsync(fd)
            count += 1
    finally:
        os.close(fd)
        os.remove(path)
    return count / elapsed


def append_rate(directory: str, batch: int) -> tuple[float, float]:
    """(entries/s, fsyncs/s) for appends of ``batch`` entries."""
    store_dir = os.path.join(directory, f"store-{batch}")
    payload = b"y" * ENTRY_BYTES
    store = DiskStorage.open(store_dir)
    index = 0
    appends = 0
    start = time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - start) < SECONDS_EACH:
            store.append([Entry(i, 1, payload) for i in range(index + 1, index + batch + 1)])
            index += batch
            appends += 1
    finally:
        store.close()
        shutil.rmtree(store_dir)
    return index / elapsed, appends / elapsed


def main() -> None:
    parent = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
    directory = tempfile.mkdtemp(prefix="dlm-bench-wal-", dir=parent)
    try:
        raw = raw_fsync_rate(directory)
        print(f"disk: {directory}")
        print(f"raw write({ENTRY_BYTES} B)+fsync: {raw:10.0f} fsyncs/s")
        print(f"{'batch':>6} {'entries/s':>12} {'fsyncs/s':>10} {'fsyncs/s vs raw':>16}")
        for batch in BATCHES:
            entries_per_s, fsyncs_per_s = append_rate(directory, batch)
            share = fsyncs_per_s / raw
            print(f"{batch:>6} {entries_per_s:>12.0f} {fsyncs_per_s:>10.0f} {share:>15.0%}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
