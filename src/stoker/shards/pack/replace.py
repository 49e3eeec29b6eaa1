"""Replacing a shard set without ever destroying it, and one pack per folder at a time.

``stoker pack SRC OUT --overwrite`` over an existing set writes the new set in a staging
folder beside ``OUT`` (``.OUT.stoker-new``, on the same file system) and swaps the two
folders only when the new set is complete, so an interrupted re-pack — even of ``OUT``
into itself — leaves the old set whole, and the same command resumes the new one. On
Linux the swap is one atomic ``renameat2(RENAME_EXCHANGE)``; elsewhere it is two
renames. Files in ``OUT`` that stoker did not write are moved into the new folder, never
deleted.

A lock file beside ``OUT`` (``.OUT.stoker-pack.lock``; ``flock``, released by the kernel
when the process dies, so a ``kill -9`` never leaves a stale lock) makes a second pack
into the same folder fail at once with a clear error. It sits beside the folder, not in
it, so that it covers the whole pack, the swap included: a lock inside ``OUT`` would move
away with the old folder at the exchange, and a second pack started just after it would
find the new folder unlocked. (Where the parent folder cannot be written, the lock falls
back to ``OUT/.stoker-pack.lock``.)
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stoker.errors import ConfigError, ShardError
from stoker.shards.format.schema import MANIFEST_NAME, PLAN_NAME, TMP_SUFFIX, is_shard_name

__all__ = ["LOCK_NAME", "finish_swap", "is_ours", "lock_path", "pack_lock", "staging_dir", "swap_in"]

LOCK_NAME = ".stoker-pack.lock"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def is_ours(name: str) -> bool:
    """Whether a file name is one stoker writes in a shard set folder (shards, manifest, plan, lock, their temporaries)."""
    base = name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name
    return base in (MANIFEST_NAME, PLAN_NAME, LOCK_NAME) or is_shard_name(base)


def staging_dir(out: Path) -> Path:
    """Where a replacement for the set in ``out`` is written: a hidden sibling folder."""
    return out.parent / f".{out.name}.stoker-new"


def lock_path(out: Path) -> Path:
    """The pack lock of ``out``: beside it, so that swapping folders never moves it."""
    return out.parent / f".{out.name}.stoker-pack.lock"


@contextmanager
def pack_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s pack lock; a second holder gets :class:`ConfigError` at once.

    Raises:
        ConfigError: another pack is writing into ``out``.
    """
    out.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    path = lock_path(out)
    try:
        fd = os.open(path, flags, 0o644)
    except PermissionError:  # a folder in a parent this user cannot write: lock inside it
        path = out / LOCK_NAME
        fd = os.open(path, flags, 0o644)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no flock (Windows): no protection, as before
            pass
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
            raise ConfigError(
                f"{out}: another `stoker pack` (pid {holder}) is writing into this folder; "
                "wait for it to finish, or choose another output folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)  # while still held; after a kill -9 the kernel frees the lock
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux ``renameat2``); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise ShardError(f"{b}: cannot swap in the new shard set from {a} ({os.strerror(code)}); the old set is untouched")


def swap_in(staging: Path, out: Path) -> None:
    """Make the complete set in ``staging`` the set in ``out``; remove only the old set's stoker files.

    Files in ``out`` that stoker did not write move into the new ``out``.
    """
    if _exchange(staging, out):
        old = staging  # the exchange put the old folder at the staging name
    else:
        old = out.parent / f".{out.name}.stoker-old"
        if old.exists():
            shutil.rmtree(old)
        os.rename(out, old)
        os.rename(staging, out)
    _clear_old(old, out)


def finish_swap(out: Path) -> None:
    """Finish a swap interrupted after the exchange: what is left of the old set beside ``out`` goes as :func:`swap_in` does.

    Call it only when ``out`` holds the new set, complete (the staging folder then holds
    the old set's remains, never a new set).
    """
    staging = staging_dir(out)
    if staging.is_dir():
        _clear_old(staging, out)


def _clear_old(old: Path, out: Path) -> None:
    """Remove the old set's stoker files from ``old``, move the user's files into ``out``, remove ``old`` if empty."""
    for entry in sorted(os.listdir(old)):
        if is_ours(entry):
            (old / entry).unlink(missing_ok=True)
        elif not (out / entry).exists():
            os.rename(old / entry, out / entry)
    try:
        old.rmdir()
    except OSError:
        pass  # something of the user's could not move (a name clash): leave it where it is
