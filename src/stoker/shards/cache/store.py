"""The verified local cache of remote shards: download once, check SHA-256, share, evict by size.

A shard of a remote shard set (``s3://bucket/packed``) is read from a local copy, made
once per machine and checked before a byte of it is used:

1. the shard is downloaded to a temporary file, hashed on the way in (a claimed size
   larger than the manifest's is refused before the first byte);
2. its size and SHA-256 are compared with the manifest's; a mismatch is retried, then
   refused with :class:`~stoker.errors.ShardError` (a damaged object is never read);
3. only then is it renamed into place, under its SHA-256: ``<cache>/sha256/ab/ab12....arrow``.

A copy is checked again on every use (:meth:`ShardCache.hold`, :mod:`stoker.shards.cache.entries`);
a bad one is fetched again. The processes of a machine share the cache through a lock
file per shard: one downloads, the others wait and read the same copy. With a size limit
the folder's disk use, downloads in progress and open shards included, stays within it:
shards no reader holds are evicted in the order of :mod:`stoker.shards.cache.policy`
(by the machine's reading plan, :mod:`stoker.shards.cache.readers`, else least recently used).
The folder is ``cache_dir=``, else ``$STOKER_CACHE``, else ``$XDG_CACHE_HOME/stoker``
(``~/.cache/stoker``). The object-store guide (``docs/guides/remote.md``, "Inside the
cache") says how each promise is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.errors import ConfigError, NetworkError, ShardError
from stoker.fs import Location
from stoker.lifetime import pid_alive
from stoker.shards.cache.entries import (
    STAMP_SUFFIX,
    Holder,
    allocated,
    entry_cost,
    flock,
    flock_wait,
    sha256_of,
    stamp_matches,
    tmp_name,
    tmp_reservation,
    write_stamp,
)
from stoker.shards.cache.folder import default_cache_dir  # its own module: the manifest cache needs it too
from stoker.shards.cache.policy import eviction_order
from stoker.shards.cache.readers import next_uses

if TYPE_CHECKING:
    from stoker.shards.format.manifest import ShardInfo

__all__ = ["ShardCache", "default_cache_dir", "download_note", "parse_bytes"]

log = logging.getLogger("stoker")
_said_over_limit: set[str] = set()  # cache folders said to be over their limit while offline (once each)
_said_lock = threading.Lock()
_CHUNK = 4 << 20
SAY_WAIT_S = 5.0  # a wait for room longer than this is said (once per process)
_UNLIMITED_SWEEP_S = 60.0  # how often a cache without a limit removes the partial downloads of dead processes
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




class ShardCache:
    """A folder of verified shard copies shared by every process of the machine, within a size limit.

    Args:
        cache_dir: the folder (default: :func:`default_cache_dir`).
        limit: the most disk bytes the folder takes (``"50GB"`` or an int), downloads and
            open shards included; default ``$STOKER_CACHE_LIMIT``, else none. It must hold
            what the machine's readers keep at once (:func:`stoker.shards.read.stream.cache_plan`).
        retries: downloads tried again after a corrupt or cut one (not after a
            :class:`~stoker.errors.NetworkError`: the network layer has retried that already).
        lock_timeout_s: how long to wait for another process's download of a shard, or
            for the room to download one (other readers letting go of theirs).

    Attributes:
        downloads, downloaded_bytes: the shards this object downloaded, and their bytes.

    Example:
        >>> from stoker.fs import where
        >>> from stoker.shards.format.manifest import Manifest
        >>> manifest = Manifest.load("packed")
        >>> cache = ShardCache("cache", limit="50MB")
        >>> path = cache.fetch(where("packed"), manifest.shards[0])
        >>> path.stat().st_size == manifest.shards[0].bytes
        True
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
        if limit is None and os.environ.get("STOKER_CACHE_LIMIT"):
            limit = os.environ["STOKER_CACHE_LIMIT"]
        self.limit = parse_bytes(limit) if limit is not None else None
        self.retries = retries
        self.lock_timeout_s = lock_timeout_s
        self.downloads = 0
        self.downloaded_bytes = 0
        self._said_wait = False
        self._count_lock = threading.Lock()
        self._swept_at: float | None = None  # a cache without a limit: when this object last swept (_reserve_unlimited)

    # -- where things are ---------------------------------------------------------------
    def path_of(self, info: ShardInfo) -> Path:
        """Where the verified copy of a shard lives (whether or not it is there)."""
        return self.root / "sha256" / info.sha256[:2] / f"{info.sha256}.arrow"

    def has(self, info: ShardInfo) -> bool:
        """True when a verified copy of the shard is in the cache (its stamp matches)."""
        return stamp_matches(self.path_of(info), info.bytes)

    @property
    def shard_room(self) -> int | None:
        """Bytes the limit leaves for shards: the limit less what the cache's own manifests take; None: no limit.

        What a reader plans with (how many shards at once, whether a split fits): the
        size count (:meth:`sweep`) takes every file of the folder, the cached manifests
        (:mod:`stoker.shards.cache.manifests`) too, so planning with the bare limit would
        plan one shard more than fits and fetch shards again.
        """
        if self.limit is None:
            return None
        return max(0, self.limit - _folder_bytes(self.root / "manifests"))

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

    def _lock_path(self, sha256: str, kind: str) -> Path:
        return self._folder(self.root / "locks") / f"{sha256}.{kind}"

    # -- getting a shard ----------------------------------------------------------------
    def fetch(self, remote: Location, info: ShardInfo) -> Path:
        """The path of a verified local copy of shard ``info`` of the set at ``remote``.

        The copy is not held: under a limit it may be evicted once other readers need
        room. Readers that memory-map it use :meth:`hold`.

        Raises:
            ShardError: the object is missing, or its bytes do not match the manifest
                after every retry (it is then not in the cache).
        """
        held = self.hold(remote, info)
        if held is None:  # only a hold that does not wait gives None
            raise ShardError(f"shard {info.name}: no room in the cache {self.root}")
        path, holder = held
        holder.close()
        return path

    def hold(self, remote: Location, info: ShardInfo, *, wait: bool = True) -> tuple[Path, Holder] | None:
        """A verified local copy of shard ``info``, held (never evicted) until the holder is closed.

        The entry is checked first (size and stamp; the full SHA-256 when the stamp does
        not match); a bad one is removed and fetched again. A missing one is downloaded
        once room is made within the limit.

        Args:
            wait: wait for room when every other shard in the cache is held; False
                (fetching ahead) returns None instead.

        Raises:
            ShardError: the object is missing, too large, or its bytes do not match the
                manifest after every retry; or no room came within ``lock_timeout_s``.
            NetworkError: the store cannot be reached (after the network layer's retries).
        """
        path = self.path_of(info)
        holder = Holder(self._lock_path(info.sha256, "use"), self.lock_timeout_s, f"shard {info.name}")
        try:
            if not stamp_matches(path, info.bytes):
                fd = flock_wait(self._lock_path(info.sha256, "fetch"), fcntl.LOCK_EX, self.lock_timeout_s, f"shard {info.name}")
                try:
                    if not self.check_entry(info) and not self._download(remote, info, path, wait):
                        holder.close()
                        return None
                finally:
                    os.close(fd)  # closing the only descriptor of the fetch lock releases it
            with contextlib.suppress(OSError):
                os.utime(f"{path}{STAMP_SUFFIX}")  # least recently used goes first (the entry's own times stay)
        except BaseException:
            holder.close()
            raise
        return path, holder

    def mark_done(self, info: ShardInfo) -> None:
        """A reader has read the last it needs of ``info``: it is evicted before the shards still being read."""
        with contextlib.suppress(OSError):
            os.utime(f"{self.path_of(info)}{STAMP_SUFFIX}", (0, 0))  # the oldest use there is; a reader's hold touches it again

    def check_entry(self, info: ShardInfo) -> bool:
        """True when the cache holds a good copy of ``info``; a bad one is removed (and said so once).

        Good: the size is the manifest's and the recorded stamp matches, or, when it
        does not (changed, restored, planted, or never stamped), the full SHA-256 is the
        manifest's (the stamp is then recorded again).
        """
        path = self.path_of(info)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if stamp_matches(path, info.bytes):
            return True
        if size == info.bytes and sha256_of(path) == info.sha256:
            write_stamp(path)
            return True
        problem = f"{size} bytes, the manifest says {info.bytes}" if size != info.bytes else "its SHA-256 does not match"
        log.warning("shard %s: the cached copy %s was changed or damaged (%s); it is removed and fetched again",
                    info.name, path, problem)
        self._remove_entry(path)
        return False

    def say_if_over_limit(self, url: str) -> None:
        """Offline, a cache folder over its limit is not trimmed (its copies are the only ones to read): said once.

        Once per cache folder and process, as a warning naming the folder, the bytes it holds and the limit.
        """
        if self.limit is None:
            return
        held = self.size_bytes()
        if held <= self.limit:
            return
        with _said_lock:
            if str(self.root) in _said_over_limit:
                return
            _said_over_limit.add(str(self.root))
        log.warning(
            "offline: the cache %s holds %.1f MB, over its limit of %.1f MB; %s is read from it as it is, and the "
            "folder is trimmed by the next download that needs room (or raise STOKER_CACHE_LIMIT / --cache-limit)",
            self.root, held / 1e6, self.limit / 1e6, url,
        )

    def _remove_entry(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        Path(f"{path}{STAMP_SUFFIX}").unlink(missing_ok=True)

    def _download(self, remote: Location, info: ShardInfo, dest: Path, wait: bool) -> bool:
        """Download, check and put ``info`` in place at ``dest``; False when ``wait`` is False and there is no room."""
        url = remote.url_of(info.name)
        self._folder(dest.parent)
        problem = ""
        for _attempt in range(self.retries + 1):
            tmp = self._reserve(info, wait) if self.limit is not None else self._reserve_unlimited(info)
            if tmp is None:
                return False
            try:
                digest, size = self._copy(remote, info, url, tmp)
            except NetworkError:  # the network layer has retried it already
                tmp.unlink(missing_ok=True)
                raise
            except OSError as exc:  # a dropped connection (a NetworkError was re-raised): try again
                problem = f"the download failed ({exc})"
                tmp.unlink(missing_ok=True)
                continue
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            if size != info.bytes:
                problem = f"downloaded {size}{'+' if size > info.bytes else ''} bytes, the manifest says {info.bytes}"
            elif digest != info.sha256:
                problem = "its SHA-256 does not match the manifest"
            else:
                os.replace(tmp, dest)
                write_stamp(dest)
                with self._count_lock:
                    self.downloads += 1
                    self.downloaded_bytes += size
                return True
            tmp.unlink(missing_ok=True)
        raise ShardError(
            f"shard {info.name}: {url}: {problem} (tried {self.retries + 1} times); the object is damaged "
            f"or was changed after packing, so it is not used; run `stoker verify {remote.url}`, or re-pack"
        )

    def _copy(self, remote: Location, info: ShardInfo, url: str, tmp: Path) -> tuple[str, int]:
        """Stream the object into ``tmp`` (at most the manifest's bytes + 1); its SHA-256 and size."""
        digest = hashlib.sha256()
        size = 0
        try:
            with remote.open(info.name) as src:
                claimed = getattr(src, "size", None)  # Content-Length / the object's size, before the first byte
                if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed > info.bytes:
                    raise ShardError(
                        f"shard {info.name}: {url} claims {claimed:,} bytes, the manifest says {info.bytes:,}; "
                        f"it is not downloaded; run `stoker verify {remote.url}`, or re-pack"
                    )
                with open(tmp, "r+b") as out:
                    while size <= info.bytes and (chunk := src.read(min(_CHUNK, info.bytes + 1 - size))):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        except FileNotFoundError:
            raise ShardError(f"shard {info.name}: {url} is missing; run `stoker verify {remote.url}`") from None
        return digest.hexdigest(), size

    # -- room: the limit, free space, partial downloads ---------------------------------
    def _reserve(self, info: ShardInfo, wait: bool) -> Path | None:
        """A new empty partial-download file for ``info``, made once there is room for the whole shard.

        Room means: within the limit (least recently used shards that no reader holds
        are evicted to make it) and free on the disk. Its name reserves the shard's
        bytes, so other processes count them before they are written.
        """
        need = entry_cost(info.bytes)
        where = f"shard {info.name}"
        if self.limit is not None and need > self.limit:
            raise ShardError(
                f"{where}: {info.bytes:,} bytes do not fit in the cache limit of {self.limit:,} bytes; "
                f"raise --cache-limit (STOKER_CACHE_LIMIT, cache_limit=) to at least {need:,}"
            )
        tmp_folder = self._folder(self.root / "tmp")
        start = time.monotonic()
        deadline = start + self.lock_timeout_s
        pause = 0.01
        while True:
            with _Exclusive(self.root / "cache.lock", self.lock_timeout_s, "the cache's size count"):
                used = self.sweep()
                if self.limit is not None and used + need > self.limit:
                    used -= self._make_room(used + need - self.limit)
                if self.limit is None or used + need <= self.limit:
                    tmp = self._new_partial(info, tmp_folder)
                    waited_s = time.monotonic() - start
                    if waited_s > SAY_WAIT_S and not self._said_wait:
                        self._said_wait = True
                        log.warning("%s: waited %.0f s for room in the cache %s while other readers of this machine "
                                    "held the shards in it (limit %s bytes)", where, waited_s, self.root, f"{self.limit:,}")
                    return tmp
            if not wait:
                return None
            if time.monotonic() > deadline:
                raise ShardError(
                    f"{where}: no room in the cache {self.root} within its limit of {self.limit:,} bytes for "
                    f"{self.lock_timeout_s:.0f} s: the readers of this machine hold more shards than it keeps; "
                    "raise --cache-limit (STOKER_CACHE_LIMIT), or read with fewer workers"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _make_room(self, wanted: int) -> int:
        """Evict to free ``wanted`` bytes (the caller holds ``cache.lock``), in the plan's order (see the module docs); bytes freed."""
        return self._evict_locked(wanted, next_uses(self.root))

    def _reserve_unlimited(self, info: ShardInfo) -> Path:
        """:meth:`_reserve` for a cache without a limit: there is no size count, so no ``cache.lock`` and no sweep per download.

        (Each download took the lock and listed the whole folder; the threads fetching side
        by side waited for each other's sweeps, on a lock polled with growing pauses.) The
        partial downloads of dead processes are still removed: by a sweep at most every
        :data:`_UNLIMITED_SWEEP_S` seconds, the first download of each cache object's included.
        """
        tmp_folder = self._folder(self.root / "tmp")
        now = time.monotonic()
        if self._swept_at is None or now - self._swept_at > _UNLIMITED_SWEEP_S:
            self._swept_at = now
            with _Exclusive(self.root / "cache.lock", self.lock_timeout_s, "the cache's size count"):
                self.sweep()
        return self._new_partial(info, tmp_folder)

    def _new_partial(self, info: ShardInfo, tmp_folder: Path) -> Path:
        """A new empty partial-download file for ``info``, once the disk has room for the whole shard (its name reserves the bytes).

        Raises:
            ShardError: the disk has not that much free.
        """
        need = entry_cost(info.bytes)
        free = shutil.disk_usage(tmp_folder).free
        if free < need:
            raise ShardError(
                f"shard {info.name}: needs {info.bytes:,} bytes in the cache folder {self.root}, only {free:,} are "
                "free on its disk; free some space, or choose another folder with --cache-dir (STOKER_CACHE)"
            )
        tmp = tmp_folder / tmp_name(info.sha256, info.bytes, threading.get_ident())
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return tmp

    def sweep(self) -> int:
        """Remove the partial downloads of dead processes (or older than the lock timeout); the cache's disk bytes.

        The count takes every file in the folder as the disk holds it, and each live
        partial download as the whole shard it will be.
        """
        used = 0
        now = time.time()
        for folder in (self.root / "sha256").glob("*"):
            used += _folder_bytes(folder)
        used += _folder_bytes(self.root / "manifests")  # the cached manifests (stoker.shards.cache.manifests)
        try:
            entries = list(os.scandir(self.root / "tmp"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            reserved = tmp_reservation(entry.name)
            stale = now - st.st_mtime > self.lock_timeout_s
            if reserved is None or not pid_alive(reserved[0]) or stale:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                if reserved is not None:
                    log.info("removed %s, the partial download of a process that is gone", entry.path)
                continue
            used += max(allocated(st), entry_cost(reserved[1]))
        return used

    def size_bytes(self) -> int:
        """Disk bytes of the cache folder: shards, their stamps and downloads in progress."""
        if not self.root.is_dir():
            return 0
        with _Exclusive(self._folder(self.root) / "cache.lock", self.lock_timeout_s, "the cache's size count"):
            return self.sweep()

    def _entries(self) -> list[tuple[str, float, int, Path]]:
        """(SHA-256, last used, disk bytes, path) of every shard in the cache."""
        found = []
        for path in (self.root / "sha256").glob("*/*.arrow"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            cost = allocated(st)
            try:
                side = os.stat(f"{path}{STAMP_SUFFIX}")
                used, cost = side.st_mtime, cost + allocated(side)
            except FileNotFoundError:
                used = st.st_mtime
            found.append((path.stem, used, cost, path))
        return found

    def evict(self) -> int:
        """Delete shards no reader holds, in the plan's order (see the module docs), until the cache is within its limit; bytes freed."""
        if self.limit is None or not self.root.is_dir():
            return 0
        with _Exclusive(self.root / "cache.lock", self.lock_timeout_s, "cache eviction"):
            over = self.sweep() - self.limit
            return self._make_room(over) if over > 0 else 0

    def _evict_locked(self, wanted: int, next_use: dict[str, tuple[int, int]] | None) -> int:
        """Free at least ``wanted`` bytes if shards no reader holds allow, in :func:`eviction_order`; the caller holds ``cache.lock``.

        ``next_use``: each shard's next use in the machine's plan (None: no plan, least recently used first).
        """
        found = self._entries()
        entries = {sha: (cost, path) for sha, _, cost, path in found}
        freed = 0
        for sha in eviction_order(((sha, used) for sha, used, _, _ in found), next_use):
            if freed >= wanted:
                break
            cost, path = entries[sha]
            fd = flock(self._lock_path(sha, "use"), fcntl.LOCK_EX, 0, "cache eviction")
            if fd is None:
                continue  # a reader holds it
            try:
                self._remove_entry(path)
            finally:
                os.close(fd)
            freed += cost
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


class _Exclusive:
    """``with _Exclusive(path, timeout_s, what):`` an exclusive ``flock`` on ``path`` for the block."""

    def __init__(self, path: Path, timeout_s: float, what: str) -> None:
        self.path, self.timeout_s, self.what = path, timeout_s, what
        self._fd: int | None = None

    def __enter__(self) -> _Exclusive:
        self._fd = flock_wait(self.path, fcntl.LOCK_EX, self.timeout_s, self.what)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _folder_bytes(folder: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            total += allocated(entry.stat(follow_symlinks=False))
    return total


def download_note(root: str, cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """For a shard set at a URL, one line on what reading it will download; None for a local set.

    Reads only the manifest (and looks at the cache).

    Example:
        >>> download_note("packed") is None   # a local set; for a URL: "URL: N shards, X MiB; Y MiB to download ..."
        True
    """
    from stoker.fs import where
    from stoker.shards.format.manifest import Manifest

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
