"""The files of the shard cache on disk: verified entries and their stamps, holders, partial downloads, disk use.

A cache folder holds::

    sha256/ab/ab12....arrow      a verified shard, named by its SHA-256
    sha256/ab/ab12....arrow.ok   its stamp: size, mtime, ctime, inode and device when it was verified
    tmp/ab12....<pid>.<tid>.<bytes>.tmp   a download in progress (it reserves <bytes>)
    locks/ab12....fetch          exclusive while the shard is checked or downloaded
    locks/ab12....use            shared while a reader holds the shard (open, or pinned ahead)

An entry is served only while its stamp matches the file (:func:`stamp_matches`: one
``stat`` and one small read). A file changed in place, replaced, restored or planted
does not match (its ctime or inode differs), and is hashed again in full before it is
served; one whose SHA-256 differs is removed (:meth:`ShardCache.check_entry`).

A reader holds a shard with a shared ``flock`` on its ``use`` file for as long as the
shard is memory-mapped (:class:`Holder`); eviction takes that lock exclusively and
without waiting, so a shard some process still reads is never deleted (a deleted file
that is still mapped would keep its disk space, out of the cache's count).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import time
from pathlib import Path

from stoker.errors import ShardError

__all__ = [
    "BLOCK",
    "STAMP_SUFFIX",
    "Holder",
    "allocated",
    "entry_cost",
    "flock",
    "flock_wait",
    "read_stamp",
    "sha256_of",
    "stamp_matches",
    "stamp_of",
    "tmp_name",
    "tmp_reservation",
    "write_stamp",
]

BLOCK = 4096  # disk space is counted in blocks of this size: what a file takes at least, and rounds up to
STAMP_SUFFIX = ".ok"
_CHUNK = 4 << 20
_TMP_RE = re.compile(r"^([0-9a-f]{64})\.(\d+)\.(\d+)\.(\d+)\.tmp$")


def _blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def entry_cost(size: int) -> int:
    """Disk bytes a cached shard of ``size`` bytes takes: its blocks and its stamp's block."""
    return _blocks(size) + BLOCK


def allocated(st: os.stat_result) -> int:
    """Disk bytes a file takes: its allocated blocks, or its size rounded up to blocks (whichever is more)."""
    return max(st.st_blocks * 512, _blocks(st.st_size))


# -- stamps ------------------------------------------------------------------------------
def stamp_of(st: os.stat_result) -> list[int]:
    """What identifies a file's bytes without reading them: size, mtime, ctime, inode, device.

    The ctime cannot be set back by a user, so a change in place is seen even when
    the mtime is restored.
    """
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def read_stamp(entry: Path) -> list[int] | None:
    """The stamp recorded when ``entry`` was verified; None if there is none (or it is unreadable)."""
    try:
        with open(f"{entry}{STAMP_SUFFIX}", "rb") as f:
            data = f.read(512)
        value = json.loads(data)
    except (OSError, ValueError):
        return None
    if not isinstance(value, list) or len(value) != 5 or not all(isinstance(v, int) for v in value):
        return None
    return value


def write_stamp(entry: Path) -> None:
    """Record ``entry``'s stamp (it was just verified): written aside, then renamed over the old one."""
    stamp = stamp_of(entry.stat())
    side = Path(f"{entry}{STAMP_SUFFIX}")
    tmp = side.with_name(f"{side.name}.{os.getpid()}")
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, side)


def stamp_matches(entry: Path, size: int) -> bool:
    """True when ``entry`` has ``size`` bytes and is the very file whose stamp was recorded."""
    try:
        st = entry.stat()
    except OSError:
        return False
    return st.st_size == size and read_stamp(entry) == stamp_of(st)


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- partial downloads -------------------------------------------------------------------
def tmp_name(sha256: str, size: int, tid: int) -> str:
    """The name of a download in progress: its shard, its process and thread, the bytes it reserves."""
    return f"{sha256}.{os.getpid()}.{tid}.{size}.tmp"


def tmp_reservation(name: str) -> tuple[int, int] | None:
    """``(pid, bytes reserved)`` of a partial download's file name; None for another name."""
    match = _TMP_RE.match(name)
    return (int(match.group(2)), int(match.group(4))) if match else None


# -- locks -------------------------------------------------------------------------------
def flock(path: Path, mode: int, timeout_s: float, what: str) -> int | None:
    """An open descriptor of ``path`` holding ``flock`` ``mode`` (``LOCK_SH``/``LOCK_EX``).

    ``timeout_s`` 0: do not wait, None when it is taken. Otherwise wait up to
    ``timeout_s``, then :class:`ShardError`.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if timeout_s <= 0:
            os.close(fd)
            return None
        if time.monotonic() > deadline:
            os.close(fd)
            raise ShardError(
                f"{what}: another process has held the cache lock {path} for over {timeout_s:.0f} s; the kernel "
                f"releases such a lock when its holder exits, so a live process holds it (`fuser {path}` names it): "
                "let it finish or stop it, or raise the cache's lock_timeout_s (deleting the file would let two "
                "processes in at once)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def flock_wait(path: Path, mode: int, timeout_s: float, what: str) -> int:
    """:func:`flock`, waiting (at least a moment) for the lock: a descriptor, or :class:`ShardError` after ``timeout_s``."""
    fd = flock(path, mode, max(timeout_s, 1e-3), what)
    if fd is None:  # flock only gives None when told not to wait
        raise ShardError(f"{what}: the cache lock {path} could not be taken")
    return fd


class Holder:
    """A reader's hold on a cached shard: a shared ``flock`` on its ``use`` file; eviction skips it.

    :meth:`close` closes the descriptor and never unlocks it explicitly: a forked
    DataLoader worker shares the descriptor of its parent, and an explicit unlock
    there would drop the parent's hold too.
    """

    def __init__(self, path: Path, timeout_s: float, what: str) -> None:
        self.pid = os.getpid()
        self._fd: int | None = flock_wait(path, fcntl.LOCK_SH, timeout_s, what)

    def close(self) -> None:
        """Let go of the shard (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()
