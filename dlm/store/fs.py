"""The filesystem seam under the store: the real disk, and a crashable double for tests.

The store touches the disk only through ``FileSystem``. ``RealFS`` is a thin
layer over ``os`` file descriptors (one ``os.write`` per call, no buffering,
so a batch built as one bytes object is one syscall). ``CrashableFS`` keeps
everything in memory and remembers what was fsynced apart from what was
merely written, so a test or the simulator can "pull the plug" and restart a
store from exactly what a real disk could have kept.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class AppendFile(Protocol):
    """An open file that only grows at its end (or is cut back by ``truncate``)."""

    @property
    def size(self) -> int: ...

    def write(self, data: bytes) -> None:
        """Append ``data`` at the end of the file (all of it, or raise)."""
        ...

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


class DirLock(Protocol):
    def release(self) -> None: ...


class FileSystem(Protocol):
    """What the store needs from a filesystem. Paths are plain strings."""

    def exists(self, path: str) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def makedirs(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]:
        """Names in ``path``, sorted."""
        ...

    def read(self, path: str) -> bytes: ...

    def size(self, path: str) -> int: ...

    def create(self, path: str) -> AppendFile:
        """Create ``path`` empty (truncating it if it exists) and open it for appending."""
        ...

    def open_append(self, path: str) -> AppendFile:
        """Open an existing file for appending at its end."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (durable only after ``fsync_dir``)."""
        ...

    def remove(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and removals of names in ``path`` durable."""
        ...

    def lock(self, path: str) -> DirLock:
        """Take an exclusive advisory lock on file ``path``; raise BlockingIOError if held."""
        ...


# ---------------------------------------------------------------------------
# The real disk.
# ---------------------------------------------------------------------------


class _RealFile:
    __slots__ = ("_fd", "_size")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._size = os.fstat(fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)

    def fsync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _RealLock:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class RealFS:
    """The operating system's filesystem, through raw file descriptors."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def create(self, path: str) -> AppendFile:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        return _RealFile(fd)

    def open_append(self, path: str) -> AppendFile:
        return _RealFile(os.open(path, os.O_WRONLY | os.O_APPEND))

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path: str) -> DirLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return _RealLock(fd)


# ---------------------------------------------------------------------------
# The crashable double.
# ---------------------------------------------------------------------------


class SimulatedCrash(Exception):
    """Raised by CrashableFS when an armed crash point is reached, or when a
    handle from before a crash is used (the process that held it is "dead")."""


class CrashMode(enum.Enum):
    """What survives ``CrashableFS.crash``."""

    PROCESS = "process"
    """kill -9: every write reached the page cache, so everything is kept."""
    POWER_LOSS = "power_loss"
    """Only fsynced file bytes and only names made durable by fsync_dir survive."""
    TORN = "torn"
    """Power loss, except that each file also keeps a random prefix of its
    unsynced appends, sometimes followed by random garbage or zeros."""


class Tear(enum.Enum):
    """How the write at an armed crash point lands (other operations land whole)."""

    WHOLE = "whole"
    CUT = "cut"
    """Only a random prefix (possibly empty) of the write lands."""
    GARBAGE = "garbage"
    """A random prefix (possibly all) lands, then 1-64 random bytes."""
    ZEROS = "zeros"
    """A random prefix (possibly all) lands, then 1-64 zero bytes."""


@dataclass(eq=False, slots=True)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced_len: int = 0
    # Set when a truncate cut below the synced length: what a crash would
    # restore then is no longer a prefix of ``data``.
    synced_override: bytes | None = None

    def synced(self) -> bytes:
        if self.synced_override is not None:
            return self.synced_override
        return bytes(self.data[: self.synced_len])


class _MemFile:
    __slots__ = ("_alive", "_fs", "_inode", "path")

    def __init__(self, fs: CrashableFS, path: str, inode: _Inode) -> None:
        self._fs = fs
        self._inode = inode
        self._alive = True
        self.path = path

    def _check(self) -> None:
        if not self._alive:
            raise SimulatedCrash(f"handle to {self.path} used after a crash or close")

    @property
    def size(self) -> int:
        return len(self._inode.data)

    def write(self, data: bytes) -> None:
        self._check()
        inode = self._inode
        room = self._fs._room()
        if room < len(data):
            # As a real short write: what fits lands, then the call fails.
            part = data[:room]
            self._fs._mutate(lambda: inode.data.extend(part), part, inode)
            raise self._fs._full_error(self.path)
        self._fs._mutate(lambda: inode.data.extend(data), data, inode)

    def fsync(self) -> None:
        self._check()
        inode = self._inode
        failure = self._fs.fsync_errno
        if failure is not None:
            # Nothing becomes durable (as after a real failed fsync, which may also
            # have dropped the dirty pages: callers must not retry).
            self._fs._mutate(lambda: None)
            raise OSError(failure, os.strerror(failure), self.path)

        def apply() -> None:
            inode.synced_len = len(inode.data)
            inode.synced_override = None

        self._fs._mutate(apply)

    def truncate(self, size: int) -> None:
        self._check()
        inode = self._inode

        def apply() -> None:
            if size < inode.synced_len and inode.synced_override is None:
                inode.synced_override = bytes(inode.data[: inode.synced_len])
            del inode.data[size:]

        self._fs._mutate(apply)

    def close(self) -> None:
        self._alive = False
        self._fs._handles.discard(self)


class _MemLock:
    def __init__(self, fs: CrashableFS, path: str) -> None:
        self._fs = fs
        self._path = path

    def release(self) -> None:
        self._fs._locks.discard(self._path)


def _norm(path: str) -> str:
    # Relative paths are taken from the in-memory root, never the real cwd.
    return os.path.normpath(os.path.join(os.sep, path))


class CrashableFS:
    """An in-memory filesystem that can crash the way a disk does.

    Construct with a seeded ``random.Random``; every random choice (tear
    points, garbage bytes, which unsynced bytes survive) comes from it, so a
    run replays exactly. Nothing here touches the real disk; operations cost
    O(bytes written) (an fsync is O(1)).

    Model: each file is an inode with its current bytes and the length that
    was last fsynced. Each directory has a *live* namespace (what ``listdir``
    shows) and a *durable* one (as of its last ``fsync_dir``). Directories
    themselves are durable as soon as they are made.

    Crashing
    --------
    ``crash(mode, under=None)`` simulates a restart of everything below the
    path ``under`` (the whole fs when None). Handles opened before it raise
    ``SimulatedCrash`` if used again; locks below ``under`` are released. Then
    reopen the store on the same ``CrashableFS``. Modes (``CrashMode``):
    PROCESS keeps every write; POWER_LOSS keeps fsynced bytes and durable
    names only; TORN is POWER_LOSS plus, per file, a random prefix of the
    unsynced tail and sometimes garbage or zeros after it.

    Crash points
    ------------
    Every mutating call (create, write, truncate, fsync, rename, remove,
    fsync_dir) is one *operation*; ``ops`` counts them. ``arm(op, tear)``
    makes operation number ``op`` (0-based, counted from construction) land
    (a write landing per ``Tear``) and then raise ``SimulatedCrash``; follow
    it with ``crash(...)`` to restart. ``flip_bit(path, bit)`` and
    ``read``/``write_file`` let tests corrupt or plant files directly.

    A full disk
    -----------
    Set ``capacity`` (bytes, over all live files) and writes beyond it land
    what fits and then fail with ``full_errno`` (ENOSPC, or EDQUOT); set
    ``fsync_errno`` and every fsync fails, making nothing durable. Raise
    ``capacity`` again (or set it to None) to "free space".

    Typical use (the simulator)::

        fs = CrashableFS(random.Random(seed))
        store = DiskStorage.open("/n1", fs=fs)        # paths are in-memory
        ...                                           # run the node
        fs.crash(CrashMode.POWER_LOSS, under="/n1")   # node n1 loses power
        store = DiskStorage.open("/n1", fs=fs)        # restart from what survived
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.capacity: int | None = None
        """Bytes all live files may hold together; None: unlimited."""
        self.full_errno = errno.ENOSPC
        """What a write beyond ``capacity`` fails with (ENOSPC or EDQUOT)."""
        self.fsync_errno: int | None = None
        """When set, every fsync fails with this errno and makes nothing durable."""
        self._dirs: set[str] = {_norm("/")}
        self._live: dict[str, _Inode] = {}
        self._durable: dict[str, _Inode] = {}
        self._handles: set[_MemFile] = set()
        self._locks: set[str] = set()
        self.ops = 0
        self._armed: tuple[int, Tear] | None = None

    # -- crash control ----------------------------------------------------

    def arm(self, op: int, tear: Tear = Tear.WHOLE) -> None:
        self._armed = (op, tear)

    def disarm(self) -> None:
        self._armed = None

    def _mutate(
        self, apply: Callable[[], None], data: bytes | None = None, inode: _Inode | None = None
    ) -> None:
        op = self.ops
        self.ops += 1
        if self._armed is None or self._armed[0] != op:
            apply()
            return
        tear = self._armed[1]
        self._armed = None
        if data is None or inode is None or tear is Tear.WHOLE:
            apply()
        else:
            keep = self._rng.randint(
                0, len(data) if tear is not Tear.CUT else max(0, len(data) - 1)
            )
            inode.data.extend(data[:keep])
            if tear is Tear.GARBAGE:
                inode.data.extend(self._rng.randbytes(self._rng.randint(1, 64)))
            elif tear is Tear.ZEROS:
                inode.data.extend(bytes(self._rng.randint(1, 64)))
        raise SimulatedCrash(f"crash point at operation {op}")

    def crash(self, mode: CrashMode, under: str | None = None) -> None:
        prefix = _norm(under) if under is not None else None

        def affected(path: str) -> bool:
            return prefix is None or path == prefix or path.startswith(prefix + os.sep)

        self._armed = None
        for handle in list(self._handles):
            if affected(handle.path):
                handle._alive = False
                self._handles.discard(handle)
        self._locks = {p for p in self._locks if not affected(p)}
        if mode is CrashMode.PROCESS:
            return
        survivors = {p: i for p, i in self._durable.items() if affected(p)}
        for path in [p for p in self._live if affected(p)]:
            del self._live[path]
        for path in [p for p in self._durable if affected(p)]:
            del self._durable[path]
        for path, old in survivors.items():
            kept = bytearray(old.synced())
            if mode is CrashMode.TORN and old.synced_override is None:
                unsynced = old.data[old.synced_len :]
                if unsynced and self._rng.random() < 0.7:
                    kept += unsynced[: self._rng.randint(0, len(unsynced))]
                    junk = self._rng.random()
                    if junk < 0.2:
                        kept += self._rng.randbytes(self._rng.randint(1, 64))
                    elif junk < 0.4:
                        kept += bytes(self._rng.randint(1, 64))
            inode = _Inode(kept, len(kept))
            self._live[path] = inode
            self._durable[path] = inode

    def _room(self) -> int:
        if self.capacity is None:
            return 1 << 62
        used = sum(len(inode.data) for inode in self._live.values())
        return max(0, self.capacity - used)

    def _full_error(self, path: str) -> OSError:
        return OSError(self.full_errno, os.strerror(self.full_errno), path)

    # -- test helpers -----------------------------------------------------

    def flip_bit(self, path: str, bit: int) -> None:
        inode = self._inode(path)
        inode.data[bit // 8] ^= 1 << (bit % 8)
        if inode.synced_override is not None:
            inode.synced_override = bytes(inode.data[: inode.synced_len])

    def write_file(self, path: str, data: bytes) -> None:
        """Plant a file whole and durable (no operation counted)."""
        path = _norm(path)
        inode = _Inode(bytearray(data), len(data))
        self._live[path] = inode
        self._durable[path] = inode

    # -- FileSystem -------------------------------------------------------

    def _inode(self, path: str) -> _Inode:
        try:
            return self._live[_norm(path)]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None

    def _need_dir(self, path: str) -> str:
        parent = os.path.dirname(_norm(path))
        if parent not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)
        return parent

    def exists(self, path: str) -> bool:
        path = _norm(path)
        return path in self._live or path in self._dirs

    def isdir(self, path: str) -> bool:
        return _norm(path) in self._dirs

    def makedirs(self, path: str) -> None:
        path = _norm(path)
        if path in self._live:
            raise FileExistsError(errno.EEXIST, "a file is in the way", path)
        while path not in self._dirs:
            self._dirs.add(path)
            path = os.path.dirname(path)

    def listdir(self, path: str) -> list[str]:
        path = _norm(path)
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        names = {os.path.basename(p) for p in self._live if os.path.dirname(p) == path}
        names |= {
            os.path.basename(d) for d in self._dirs if d != path and os.path.dirname(d) == path
        }
        return sorted(names)

    def read(self, path: str) -> bytes:
        return bytes(self._inode(path).data)

    def size(self, path: str) -> int:
        return len(self._inode(path).data)

    def create(self, path: str) -> AppendFile:
        path = _norm(path)
        self._need_dir(path)
        inode = _Inode()

        def apply() -> None:
            self._live[path] = inode

        self._mutate(apply)
        return self._handle(path, inode)

    def open_append(self, path: str) -> AppendFile:
        path = _norm(path)
        return self._handle(path, self._inode(path))

    def _handle(self, path: str, inode: _Inode) -> _MemFile:
        handle = _MemFile(self, path, inode)
        self._handles.add(handle)
        return handle

    def rename(self, src: str, dst: str) -> None:
        src, dst = _norm(src), _norm(dst)
        inode = self._inode(src)
        self._need_dir(dst)

        def apply() -> None:
            del self._live[src]
            self._live[dst] = inode

        self._mutate(apply)

    def remove(self, path: str) -> None:
        path = _norm(path)
        self._inode(path)

        def apply() -> None:
            del self._live[path]

        self._mutate(apply)

    def fsync_dir(self, path: str) -> None:
        path = _norm(path)
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)

        def apply() -> None:
            for name in [p for p in self._durable if os.path.dirname(p) == path]:
                del self._durable[name]
            for name, inode in self._live.items():
                if os.path.dirname(name) == path:
                    self._durable[name] = inode

        self._mutate(apply)

    def lock(self, path: str) -> DirLock:
        path = _norm(path)
        if path in self._locks:
            raise BlockingIOError(errno.EWOULDBLOCK, "locked", path)
        self._locks.add(path)
        return _MemLock(self, path)
