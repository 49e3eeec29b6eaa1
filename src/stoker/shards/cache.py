"""The verified local cache of remote shards: download once, check SHA-256, share, evict by size.

A shard of a remote shard set (``s3://bucket/packed``) is read from a local copy. The
copy is made once per machine and checked before a byte of it is used:

1. the shard is downloaded to a temporary file, hashed on the way in;
2. its size and SHA-256 are compared with the manifest's; a mismatch is retried, then
   refused with :class:`~stoker.errors.ShardError` (a damaged object is never read);
3. only then is it renamed into place, under its SHA-256: ``<cache>/sha256/ab/ab12....arrow``.

So a file in the cache under its final name is always complete and verified, and two
shard sets (or two versions of one) that share a shard share its copy. Processes on one
machine (DataLoader workers, DDP ranks) share the cache through a lock file per shard
(``fcntl.flock``): one downloads, the others wait for it and then read the same copy.

With a size limit the least recently used shards are deleted when the cache grows past
it. A shard open in some process is still readable after that (its memory map keeps the
file), and a shard being downloaded or opened is never deleted.

The cache folder is ``cache_dir=``, else the ``STOKER_CACHE`` environment variable, else
``$XDG_CACHE_HOME/stoker`` (``~/.cache/stoker``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.errors import ConfigError, ShardError
from stoker.fs import Location
from stoker.shards.cache_folder import default_cache_dir  # its own module: the manifest cache needs it too

if TYPE_CHECKING:
    from stoker.shards.manifest import ShardInfo
    from stoker.shards.reader import ShardSet

__all__ = ["ShardCache", "default_cache_dir", "parse_bytes", "read_ahead"]

_CHUNK = 4 << 20
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_bytes(value: int | str) -> int:
    """``"50GB"`` -> 53687091200 (K, M, G, T are powers of 1024); an int is bytes.

    Raises:
        ConfigError: not a size, or less than one byte.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(f"{value!r} is not a size; write for example 50GB, 512MB or 1048576")
        number = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if number < 1:
        raise ConfigError(f"{value!r}: a size must be at least one byte")
    return number


class _FileLock:
    """An exclusive ``flock`` on a lock file, waited for up to ``timeout_s``."""

    def __init__(self, path: Path, timeout_s: float, what: str) -> None:
        self.path, self.timeout_s, self.what = path, timeout_s, what
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if not blocking:
                os.close(fd)
                return False
            if time.monotonic() > deadline:
                os.close(fd)
                raise ShardError(
                    f"{self.what}: another process has held the cache lock {self.path} for over "
                    f"{self.timeout_s:.0f} s; if no other stoker process is running, delete the lock file"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> _FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ShardCache:
    """A folder of verified shard copies shared by every process of the machine.

    Args:
        cache_dir: the folder (default: :func:`default_cache_dir`).
        limit: the most bytes the cache keeps (``"50GB"`` or an int); ``None``: no limit.
            It should hold a few shards (those being read and fetched ahead).
        retries: downloads tried again after a corrupt or failed one.
        lock_timeout_s: how long to wait for another process's download of a shard.

    Attributes:
        downloads: shards this object downloaded (for tests and reports).
        downloaded_bytes: their bytes.

    Example:
        >>> cache = ShardCache("/tmp/stoker-cache", limit="50GB")  # doctest: +SKIP
        >>> path = cache.fetch(where("s3://bucket/packed"), manifest.shards[0])  # doctest: +SKIP
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        limit: int | str | None = None,
        *,
        retries: int = 2,
        lock_timeout_s: float = 900.0,
    ) -> None:
        if retries < 0:
            raise ConfigError(f"retries must be >= 0, got {retries}")
        self.root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.limit = parse_bytes(limit) if limit is not None else None
        self.retries = retries
        self.lock_timeout_s = lock_timeout_s
        self.downloads = 0
        self.downloaded_bytes = 0
        self._count_lock = threading.Lock()

    # -- where things are ---------------------------------------------------------------
    def path_of(self, info: ShardInfo) -> Path:
        """Where the verified copy of a shard lives (whether or not it is there)."""
        return self.root / "sha256" / info.sha256[:2] / f"{info.sha256}.arrow"

    def has(self, info: ShardInfo) -> bool:
        """True when a verified copy of the shard is in the cache."""
        return self.path_of(info).is_file()

    def missing_bytes(self, infos: list[ShardInfo] | tuple[ShardInfo, ...]) -> int:
        """Bytes that reading these shards would download (those not in the cache)."""
        return sum(info.bytes for info in {i.sha256: i for i in infos}.values() if not self.has(info))

    def _folder(self, folder: Path) -> Path:
        """``folder`` (in the cache), made if need be.

        Raises:
            ConfigError: the cache folder cannot be made or written (``STOKER_CACHE=/proc/x``,
                a read-only disk): one line naming it and how to choose another.
        """
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{self.root}: the shard cache folder cannot be used ({exc.strerror or exc}); choose a writable "
                "folder with --cache-dir DIR (cache_dir=...) or STOKER_CACHE"
            ) from None
        return folder

    def _lock(self, info: ShardInfo, what: str) -> _FileLock:
        folder = self._folder(self.root / "locks")
        return _FileLock(folder / f"{info.sha256}.lock", self.lock_timeout_s, what)

    # -- getting a shard ----------------------------------------------------------------
    def fetch(self, remote: Location, info: ShardInfo) -> Path:
        """The path of a verified local copy of shard ``info`` of the set at ``remote``.

        Raises:
            ShardError: the object is missing, or its bytes do not match the manifest
                after every retry (it is then not in the cache).
        """
        with self.holding(remote, info) as path:
            return path

    @contextlib.contextmanager
    def holding(self, remote: Location, info: ShardInfo) -> Iterator[Path]:
        """:meth:`fetch`, keeping the shard's lock while the caller opens it (eviction waits)."""
        path = self.path_of(info)
        with self._lock(info, f"shard {info.name}"):
            if path.is_file():
                with contextlib.suppress(OSError):
                    os.utime(path)  # least recently used goes first
            else:
                self._download(remote, info, path)
                if self.limit is not None:
                    self.evict()
            yield path

    def _download(self, remote: Location, info: ShardInfo, dest: Path) -> None:
        self._folder(dest.parent)
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        url = remote.url_of(info.name)
        problem = ""
        for _attempt in range(self.retries + 1):
            digest = hashlib.sha256()
            size = 0
            try:
                with remote.open(info.name) as src, open(tmp, "wb") as out:
                    while size <= info.bytes and (chunk := src.read(_CHUNK)):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            except FileNotFoundError:
                tmp.unlink(missing_ok=True)
                raise ShardError(f"shard {info.name}: {url} is missing; run `stoker verify {remote.url}`") from None
            except OSError as exc:  # a dropped connection: try again
                problem = f"the download failed ({exc})"
                tmp.unlink(missing_ok=True)
                continue
            if size != info.bytes:
                problem = f"downloaded {size}{'+' if size > info.bytes else ''} bytes, the manifest says {info.bytes}"
            elif digest.hexdigest() != info.sha256:
                problem = "its SHA-256 does not match the manifest"
            else:
                os.replace(tmp, dest)
                with self._count_lock:
                    self.downloads += 1
                    self.downloaded_bytes += size
                return
            tmp.unlink(missing_ok=True)
        raise ShardError(
            f"shard {info.name}: {url}: {problem} (tried {self.retries + 1} times); the object is damaged "
            f"or was changed after packing, so it is not used; run `stoker verify {remote.url}`, or re-pack"
        )

    # -- size limit ---------------------------------------------------------------------
    def size_bytes(self) -> int:
        """Bytes of the shards in the cache."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[float, int, Path]]:
        found = []
        for path in (self.root / "sha256").glob("*/*.arrow"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def evict(self) -> int:
        """Delete least recently used shards until the cache is within its limit; returns bytes freed.

        A shard another thread or process is downloading or opening is skipped.
        """
        if self.limit is None:
            return 0
        self._folder(self.root)
        freed = 0
        with _FileLock(self.root / "evict.lock", self.lock_timeout_s, "cache eviction"):
            entries = self._entries()
            total = sum(size for _, size, _ in entries)
            for _, size, path in entries:
                if total <= self.limit:
                    break
                lock = _FileLock(self.root / "locks" / f"{path.stem}.lock", 0, "cache eviction")
                if not lock.acquire(blocking=False):
                    continue  # in use right now
                try:
                    path.unlink(missing_ok=True)
                finally:
                    lock.release()
                total -= size
                freed += size
        return freed

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_count_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        limit = f", limit={self.limit}" if self.limit is not None else ""
        return f"ShardCache({str(self.root)!r}{limit})"


def read_ahead(shards: ShardSet, rows: np.ndarray, read_rows: int, ahead: int) -> Iterator[np.ndarray]:
    """Cut ``rows`` into reads of ``read_rows``; for a remote set, fetch the next shards while one is read.

    The shards are fetched in the order the reads first need them, ``ahead`` beyond the
    ones the current read needs (so downloads overlap reading), and each shard is closed
    after the last read that needs it (so a set larger than the cache streams through it).
    A local set is simply cut into reads.
    """
    starts = range(0, len(rows), read_rows)
    if shards.remote is None or ahead < 1 or len(rows) == 0:
        for start in starts:
            yield rows[start : start + read_rows]
        return
    shard_of = shards.locate(rows)[0]
    read_of = np.arange(len(rows)) // read_rows
    first_read: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for s, r in zip(shard_of.tolist(), read_of.tolist(), strict=True):
        first_read.setdefault(s, r)
        last_read[s] = r
    sequence = list(first_read)  # shards in the order they are first needed
    ends: dict[int, list[int]] = {}
    for s, r in last_read.items():
        ends.setdefault(r, []).append(s)
    pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="stoker-fetch")
    pending: dict[int, Future[Path]] = {}
    submitted = 0
    fetch: Callable[[int], Path] = shards.fetch
    try:
        for read, start in enumerate(starts):
            while submitted < len(sequence):
                s = sequence[submitted]
                waiting = sum(1 for t in pending if first_read[t] > read)
                if first_read[s] > read and waiting >= ahead:
                    break
                pending[s] = pool.submit(fetch, s)
                submitted += 1
            for s in np.unique(shard_of[start : start + read_rows]).tolist():
                if s in pending:
                    pending.pop(s).result()
            yield rows[start : start + read_rows]
            for s in ends.get(read, ()):
                shards.release(s)
    finally:
        for future in pending.values():
            future.cancel()
        pool.shutdown(wait=True)


def download_note(root: str, cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """For a shard set at a URL, one line on what reading it will download; None for a local set.

    Reads only the manifest (and looks at the cache).

    Example:
        >>> download_note("s3://bucket/packed")  # doctest: +SKIP
        's3://bucket/packed: 12 shards, 3,072.0 MiB; 2,048.0 MiB to download into ~/.cache/stoker (1,024.0 MiB cached)'
    """
    from stoker.fs import where
    from stoker.shards.manifest import Manifest

    place = where(root)
    if place.is_local:  # read in place: nothing to download
        return None
    manifest = Manifest.load(place)
    cache = ShardCache(cache_dir)
    missing = cache.missing_bytes(manifest.shards)
    mib = 2**20
    return (
        f"{place.url}: {len(manifest.shards)} shards, {manifest.bytes / mib:,.1f} MiB; "
        f"{missing / mib:,.1f} MiB to download into {cache.root} ({(manifest.bytes - missing) / mib:,.1f} MiB cached)"
    )
