"""What the readers of this machine still need from a shard cache soon: the shards eviction spares.

Several readers share a machine's cache (DataLoader workers, the ranks of a host), and the
readers of a stream read rows of the same shards at about the same time (see
:mod:`stoker.shards.read.stream`). Under a limit smaller than the split, a shard that one
reader is done with could be evicted to make room for the next before a slower reader
gets to it, and be downloaded again. So each reader of a *pass* (one epoch of one stream,
named by a tag that every reader of it computes alike) records the shards it reads now
and those its plan reads next (:class:`PassReader`), and the cache evicts only shards that
no live reader records (:func:`spared`; :meth:`ShardCache._reserve`). A reader that needs
room the others' shards fill waits for them to move on; that is how a reader ahead is
kept within what the cache holds of a slower one.

Readers of a pass that have not started yet (a rank or worker a moment late) are
counted in too: the pass records how many readers it has and the shards read first, and
those are spared until every reader has come, or :data:`ARRIVAL_S` passed since the first.

The records are a few hundred bytes per reader, belong to live processes, and live in
shared memory (``/dev/shm``; else the temporary folder), under a folder named after the
user and the cache folder, so they take nothing of the cache's disk limit. That folder
must be the user's own and closed to others (``0o700``): one planted by another user is
not used (said once), and then readers out of step may download a shard again::

    <registry>/<pass tag>/pass.json           {"readers": 4, "first": ["ab12...", ...]}
    <registry>/<pass tag>/<pid>.<n>.reader    ["ab12...", ...]: what that reader needs soon; [] once done

A record of a process that is gone is ignored (and removed); a pass is removed once every
reader has finished it, or no live reader is left and none is waited for.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from stoker.lifetime import pid_alive

__all__ = ["ARRIVAL_S", "PassReader", "pass_tag", "registry_dir", "spared"]

log = logging.getLogger("stoker")
ARRIVAL_S = 10.0  # how long after its first reader the readers of a pass that have not come yet are waited for
_PASS = "pass.json"
_SUFFIX = ".reader"
_numbers = itertools.count()
_warned = False


def registry_dir(cache_root: Path) -> Path:
    """The folder of the reader records of the cache at ``cache_root`` (shared memory where the machine has it)."""
    key = hashlib.sha1(str(Path(cache_root).expanduser().absolute()).encode()).hexdigest()[:16]
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"stoker-readers-{os.getuid()}-{key}"


def _own_folder(folder: Path) -> None:
    """Make ``folder`` (``0o700``) if need be, and check it is this user's own, not a link or another's.

    The registry lives in a folder anyone may write in (``/dev/shm``): a folder of that name
    planted by another user could make this one write where they choose, or spare what
    they name.

    Raises:
        OSError: it is not a folder of this user's, closed to others.
    """
    folder.mkdir(mode=0o700, exist_ok=True)
    if not _is_own(folder):
        raise PermissionError(errno.EPERM, "not a folder of this user's alone", str(folder))


def _is_own(folder: Path) -> bool:
    """Whether ``folder`` is a folder (not a link) of this user's, closed to others (``os.lstat`` may raise OSError)."""
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def pass_tag(*parts: object) -> str:
    """A name for a pass that every reader of it computes alike (from what fixes its order)."""
    return hashlib.sha1(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:24]


def _write(path: Path, value: object) -> None:
    """Write ``value`` as JSON to ``path`` whole (aside, then renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _say_unusable(folder: Path, exc: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s: the readers' records of the shard cache cannot be written (%s); readers on this machine "
                    "that are not in step may download a shard again", folder, exc.strerror or exc)


class PassReader:
    """One reader's record in a pass: the shards it needs soon, until :meth:`close`.

    Args:
        cache_root: the cache folder the reader reads through.
        tag: the pass (:func:`pass_tag`).
        readers: how many readers the pass has on this machine.
        first: the shards the pass reads first (spared for readers still to come).
    """

    def __init__(self, cache_root: Path, tag: str, readers: int, first: list[str]) -> None:
        self.folder = registry_dir(cache_root) / tag
        self.path = self.folder / f"{os.getpid()}.{next(_numbers)}{_SUFFIX}"
        self._needs: list[str] | None = None
        self._usable = True
        try:
            _own_folder(self.folder.parent)
            self.folder.mkdir(exist_ok=True)
            if not (self.folder / _PASS).exists():
                _write(self.folder / _PASS, {"readers": int(readers), "first": list(first)})
        except OSError as exc:
            self._usable = False
            _say_unusable(self.folder, exc)

    def need(self, shas: Iterable[str]) -> None:
        """Record the shards (SHA-256s) this reader reads now and next; it replaces the last record."""
        needs = sorted(set(shas))
        if not self._usable or needs == self._needs:
            return
        try:
            self.folder.mkdir(exist_ok=True)  # a finished pass of the same tag may have removed it
            _write(self.path, needs)
            self._needs = needs
        except OSError as exc:
            self._usable = False
            _say_unusable(self.folder, exc)

    def close(self) -> None:
        """This reader is done with the pass: it needs nothing more; a pass every reader has finished is removed."""
        if not self._usable:
            return
        with contextlib.suppress(OSError):
            _write(self.path, [])
            self._needs = []
            info = _read(self.folder / _PASS)
            readers = info.get("readers", 0) if isinstance(info, dict) else 0
            finished = sum(1 for p in self.folder.glob(f"*{_SUFFIX}") if _read(p) == [])
            if isinstance(readers, int) and finished >= readers:
                shutil.rmtree(self.folder, ignore_errors=True)


def _pid_of(path: Path) -> int:
    try:
        return int(path.name.split(".", 1)[0])
    except ValueError:
        return 0


def spared(cache_root: Path) -> set[str]:
    """The SHA-256s of the shards that a reader of this machine needs soon, or that a reader still to come reads first.

    On the way, records of processes that are gone and passes no one reads any more are removed.
    """
    keep: set[str] = set()
    root = registry_dir(cache_root)
    try:
        if not _is_own(root):
            return keep  # not this user's own (see _own_folder): nothing in it is trusted
        passes = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return keep
    now = time.time()
    for folder in passes:
        info = _read(folder / _PASS)
        readers = info.get("readers", 0) if isinstance(info, dict) else 0
        first = info.get("first", []) if isinstance(info, dict) else []
        try:
            records = list(folder.glob(f"*{_SUFFIX}"))
            started = (folder / _PASS).stat().st_mtime
        except OSError:
            continue
        came, live, newest = 0, 0, started
        for record in records:
            needs = _read(record)
            alive = pid_alive(_pid_of(record))
            if needs == []:  # finished (its process may have ended since)
                came += 1
                continue
            if not alive:  # a reader that is gone needs nothing
                with contextlib.suppress(OSError):
                    record.unlink()
                continue
            came += 1
            live += 1
            with contextlib.suppress(OSError):
                newest = max(newest, record.stat().st_mtime)
            if isinstance(needs, list):
                keep.update(str(s) for s in needs)
        if isinstance(readers, int) and came < readers and now - started < ARRIVAL_S and isinstance(first, list):
            keep.update(str(s) for s in first)  # readers still to come start there
        elif not live and now - newest > ARRIVAL_S:  # no one reads it, and no one is waited for
            shutil.rmtree(folder, ignore_errors=True)
    return keep
