"""Backup files: what is written is read back, and anything else is refused in one line."""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path

import cbor2
import pytest

from dlm.node import locks
from dlm.node.locks.commands import AcquireCommand, OpenLeaseCommand, Origin, encode_command
from dlm.records import ConfState
from dlm.store.backup import (
    FORMAT,
    MAGIC,
    PARTITIONED_FORMAT,
    Backup,
    BackupError,
    decode_backup,
    decode_backup_set,
    encode_backup,
    encode_backup_set,
    read_backup,
    read_backup_set,
    write_backup,
    write_backup_set,
)
from dlm.store.snapshot import encode_snapshot

SAMPLE = Backup(
    cluster="prod-eu",
    index=1234,
    term=7,
    taken_at_ms=1_790_000_000_123,
    voters=("n1", "n2", "n3"),
    learners=("n4",),
    image=b"\x83image bytes\x00\xff" * 10,
    leader="n2",
)
GOLDEN = Path(__file__).parent / "testdata" / "backup_v1.bin"


def test_round_trip() -> None:
    data = encode_backup(SAMPLE)
    assert data.startswith(MAGIC)
    assert decode_backup(data, "f") == SAMPLE
    assert SAMPLE.snapshot().meta.conf == ConfState(("n1", "n2", "n3"), ("n4",))
    assert SAMPLE.snapshot().meta.index == 1234 and SAMPLE.snapshot().data == SAMPLE.image


def test_format_1_files_stay_readable() -> None:
    """A file this release wrote (kept in testdata) opens in every later release."""
    assert decode_backup(GOLDEN.read_bytes(), str(GOLDEN)) == SAMPLE
    assert encode_backup(SAMPLE) == GOLDEN.read_bytes()  # equal backups, equal bytes


def test_a_real_image_restores_from_a_backup() -> None:
    machine = locks.LockStateMachine()
    machine.apply(1, encode_command(OpenLeaseCommand("L1", 10_000, Origin("c1", 1), 5)))
    machine.apply(2, encode_command(AcquireCommand("L1", "k", False, 1, {}, Origin("c1", 2), 6)))
    image = machine.snapshot()
    taken = Backup("c", 2, 1, 0, ("n1",), (), image)
    back = decode_backup(encode_backup(taken), "f")
    restored = locks.LockStateMachine.restore(back.snapshot().data)
    assert restored.snapshot() == image
    assert restored.get("k") is not None


def test_write_then_read(tmp_path: Path) -> None:
    path = str(tmp_path / "b.dlmbak")
    written = write_backup(path, SAMPLE)
    assert written == os.path.getsize(path)
    assert read_backup(path) == SAMPLE
    # Overwriting replaces the file whole and leaves no temporary file behind.
    other = Backup("c2", 9, 9, 9, ("x",), (), b"")
    write_backup(path, other)
    assert read_backup(path) == other
    assert sorted(os.listdir(tmp_path)) == ["b.dlmbak"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "b")
    write_backup(path, SAMPLE)

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        write_backup(path, Backup("c2", 9, 9, 9, ("x",), (), b"z" * 100))
    monkeypatch.undo()
    assert read_backup(path) == SAMPLE
    assert os.listdir(tmp_path) == ["b"]


def test_every_truncation_is_refused() -> None:
    data = encode_backup(SAMPLE)
    for size in range(len(data)):
        with pytest.raises(BackupError) as info:
            decode_backup(data[:size], "cut.bak")
        message = str(info.value)
        assert message.startswith("cut.bak: ") and "\n" not in message
        assert "truncated" in message or "checksum" in message or "not a dlm backup" in message
    # A cut past the header is always called what it is.
    with pytest.raises(BackupError, match=r"^cut.bak: truncated: \d+ bytes where its header"):
        decode_backup(data[:-1], "cut.bak")


def test_every_single_bit_flip_is_refused() -> None:
    data = encode_backup(SAMPLE)
    rng = random.Random(24)
    for offset in range(len(data)):
        flipped = bytearray(data)
        flipped[offset] ^= 1 << rng.randrange(8)
        with pytest.raises(BackupError) as info:
            decode_backup(bytes(flipped), "rot.bak")
        assert str(info.value).startswith("rot.bak: ") and "\n" not in str(info.value)


def test_a_flip_in_the_image_is_a_checksum_mismatch() -> None:
    data = bytearray(encode_backup(SAMPLE))
    data[len(data) - 40] ^= 0x10
    with pytest.raises(BackupError, match=r"^x: checksum mismatch"):
        decode_backup(bytes(data), "x")


def test_bytes_appended_are_refused() -> None:
    with pytest.raises(BackupError, match=r"^x: corrupt: 3 bytes after its end"):
        decode_backup(encode_backup(SAMPLE) + b"abc", "x")


def test_an_unknown_format_is_refused_by_number() -> None:
    data = bytearray(encode_backup(SAMPLE))
    struct.pack_into("<H", data, len(MAGIC), 9)
    with pytest.raises(BackupError, match=r"^x: unknown backup format 9 \(this dlm reads"):
        decode_backup(bytes(data), "x")
    with pytest.raises(BackupError, match=r"^x: unknown backup format 9 "):
        decode_backup_set(bytes(data), "x")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "truncated"),
        (b"DLMBA", "truncated"),
        (b"hello, world\n" * 10, "not a dlm backup file"),
    ],
)
def test_not_a_backup(content: bytes, reason: str) -> None:
    with pytest.raises(BackupError, match=rf"^x: {reason}"):
        decode_backup(content, "x")


def test_a_member_snapshot_file_is_named_as_such() -> None:
    from dlm.records import Snapshot, SnapshotMeta

    data = encode_snapshot(Snapshot(SnapshotMeta(5, 1, ConfState(("a",))), b"img"))
    with pytest.raises(BackupError, match=r"^x: not a dlm backup \(it is a member's snapshot"):
        decode_backup(data, "x")


def test_a_checksummed_header_with_bad_fields_is_corrupt() -> None:
    """A file whose checksum holds but whose header no dlm wrote (a forgery, or a bug)."""
    import cbor2

    header = cbor2.dumps({"cluster": "c", "index": -1, "image_bytes": 0}, canonical=True)
    body = struct.pack("<10sHI", MAGIC, FORMAT, len(header)) + header
    data = body + hashlib.sha256(body).digest()
    with pytest.raises(BackupError, match=r"^x: corrupt: index -1 is outside"):
        decode_backup(data, "x")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"index": 2**63}, "index 9223372036854775808 is outside"),
        ({"term": -1}, "term -1 is outside"),
        ({"cluster": ""}, "the cluster id is empty"),
        ({"voters": ()}, "voters is empty"),
        ({"voters": ("a", "a")}, "voters names a member twice"),
        ({"learners": ("n1",)}, "both a voter and a learner"),
        ({"leader": "bad\nname"}, "is not a printable name"),
    ],
)
def test_an_unwritable_backup_is_refused(change: dict[str, object], reason: str) -> None:
    fields = {
        "cluster": SAMPLE.cluster,
        "index": SAMPLE.index,
        "term": SAMPLE.term,
        "taken_at_ms": SAMPLE.taken_at_ms,
        "voters": SAMPLE.voters,
        "learners": SAMPLE.learners,
        "image": SAMPLE.image,
        "leader": SAMPLE.leader,
    }
    fields.update(change)
    with pytest.raises(ValueError, match=reason):
        encode_backup(Backup(**fields))  # type: ignore[arg-type]


def test_read_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match=r": no such file$"):
        read_backup(str(tmp_path / "missing"))
    with pytest.raises(BackupError, match=r": is a directory, not a backup file$"):
        read_backup(str(tmp_path))


# ---------------------------------------------------------------------------
# A partitioned cluster's backup (format 2)
# ---------------------------------------------------------------------------

PARTS = tuple(
    Backup(
        cluster="prod-eu",
        index=1000 + 17 * p,
        term=3 + p,
        taken_at_ms=1_790_000_000_000 + p,
        voters=("n1", "n2", "n3"),
        learners=(),
        image=bytes([p]) * (50 + p),
        leader=f"n{p % 3 + 1}",
    )
    for p in range(4)
)


def test_one_partition_is_written_exactly_as_before() -> None:
    assert encode_backup_set([SAMPLE], 5) == encode_backup(SAMPLE) == GOLDEN.read_bytes()
    read = decode_backup_set(GOLDEN.read_bytes(), "f")
    assert read.parts == (SAMPLE,) and read.format == FORMAT and read.partitions == 1


def test_a_partitioned_backup_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "b.dlmbackup"
    size = write_backup_set(str(path), PARTS, 1_790_000_000_000)
    assert size == path.stat().st_size
    read = read_backup_set(str(path))
    assert read.parts == PARTS and read.format == PARTITIONED_FORMAT
    assert (read.partitions, read.cluster, read.index, read.term) == (4, "prod-eu", 1051, 6)
    assert read.taken_at_ms == 1_790_000_000_000
    # Each part is a whole format-1 file, checksum and all.
    data = path.read_bytes()
    assert all(encode_backup(part) in data for part in PARTS)
    with pytest.raises(BackupError, match="a partitioned cluster's backup"):
        read_backup(str(path))


def test_a_flipped_bit_anywhere_in_a_partitioned_backup_is_refused() -> None:
    data = encode_backup_set(PARTS, 1)
    rng = random.Random(25)
    for _ in range(200):
        at = rng.randrange(len(data))
        bad = bytearray(data)
        bad[at] ^= 1 << rng.randrange(8)
        with pytest.raises(BackupError, match=r"^x: "):
            decode_backup_set(bytes(bad), "x")
    for cut in (len(data) - 1, len(data) // 2, 20):
        with pytest.raises(BackupError, match=r"^x: "):
            decode_backup_set(data[:cut], "x")
    with pytest.raises(BackupError, match=r"^x: corrupt: "):
        decode_backup_set(data + b"!", "x")


def test_a_damaged_part_is_named_by_its_partition() -> None:
    files = [encode_backup(part) for part in PARTS]
    broken = bytearray(files[2])
    broken[-1] ^= 1
    files[2] = bytes(broken)
    header = cbor2.dumps(
        {
            "cluster": "prod-eu",
            "partitions": 4,
            "taken_at_ms": 1,
            "part_bytes": [len(f) for f in files],
        },
        canonical=True,
    )
    body = struct.pack("<10sHI", MAGIC, PARTITIONED_FORMAT, len(header)) + header + b"".join(files)
    data = body + hashlib.sha256(body).digest()
    with pytest.raises(BackupError, match=r"^x: partition 2: checksum mismatch"):
        decode_backup_set(data, "x")


def test_parts_of_different_clusters_are_not_written() -> None:
    other = Backup("other", 1, 1, 0, ("n1",), (), b"")
    with pytest.raises(ValueError, match="different clusters"):
        encode_backup_set([PARTS[0], other], 1)
