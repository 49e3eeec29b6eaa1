"""The last manifest read from each shard set URL, kept in the shard cache folder: a fully cached set opens offline.

Each time the manifest of a remote set is read from its store, its exact bytes are kept
in ``<cache>/manifests/<key>.json`` (the key: a SHA-256 of the URL) with the URL, the
time it was read (the last time the cache was checked against the store) and the SHA-256
of the bytes. When the store cannot be reached, :func:`recall` gives them back — checked
by that SHA-256 and, when parsed, by the manifest's own checksum — so that a set whose
shards are all in the cache trains, inspects and verifies from it. The first time a
process falls back for a URL it says so once (the ``stoker`` logger, a warning), with
the time the cache was last checked; under a launch such as ``torchrun`` only local rank
0 says it, so a run says it once per machine (each machine reads its own cache), not once
per rank; a set not fully cached stops with one
:class:`~stoker.errors.NetworkError` line naming the URL and how many shards are missing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.errors import NetworkError
from stoker.fs.network import ADVICE
from stoker.shards.cache.folder import default_cache_dir

if TYPE_CHECKING:
    from stoker.shards.format.manifest import ShardInfo

__all__ = ["cache_root", "has_cached", "mark_online", "offline_since", "recall", "remember", "require_cached", "use_offline"]

log = logging.getLogger("stoker")

_FOLDER = "manifests"
_MAX_BYTES = 1 << 30
_STALE_TMP_S = 600.0  # a manifest is written in well under a second
_offline: dict[str, float] = {}  # set URL -> when the cache was last checked against the store
_lock = threading.Lock()


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The shard cache folder: ``cache_dir``, else :func:`~stoker.shards.cache.folder.default_cache_dir`."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _path(url: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    key = hashlib.sha256(url.rstrip("/").encode("utf-8")).hexdigest()[:40]
    return cache_root(cache_dir) / _FOLDER / f"{key}.json"


def remember(url: str, data: bytes, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Keep the manifest bytes just read from the store at ``url`` (best effort: a cache that cannot be written is skipped)."""
    path = _path(url, cache_dir)
    record = {"url": url.rstrip("/"), "checked_at": time.time(), "sha256": hashlib.sha256(data).hexdigest(),
              "manifest": data.decode("utf-8", errors="strict")}
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob("*.tmp"):  # left by a process killed while writing one
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > _STALE_TMP_S:
                    stale.unlink()
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except (OSError, UnicodeDecodeError):  # the cache is an aid here: reading the set online goes on without it
        with contextlib.suppress(OSError):
            tmp.unlink()


def recall(url: str, cache_dir: str | os.PathLike[str] | None = None) -> tuple[bytes, float] | None:
    """``(manifest bytes, when last checked against the store)`` kept for ``url``; None if none, or if it is damaged."""
    path = _path(url, cache_dir)
    try:
        if path.stat().st_size > _MAX_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        data = str(record["manifest"]).encode("utf-8")
        if record["url"] != url.rstrip("/") or hashlib.sha256(data).hexdigest() != record["sha256"]:
            return None
        return data, float(record["checked_at"])
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def has_cached(url: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when a checked manifest of ``url`` is in the cache (the set may open offline)."""
    return recall(url, cache_dir) is not None


def _when(checked_at: float) -> str:
    stamp = dt.datetime.fromtimestamp(checked_at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ago = max(0.0, time.time() - checked_at)
    span = f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200 else f"{ago / 3600:.1f} h" \
        if ago < 172800 else f"{ago / 86400:.0f} days"
    return f"{stamp}, {span} ago"


def use_offline(url: str, checked_at: float, error: NetworkError, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Record that ``url`` is read from the cache because the store is unreachable; say so once per process (local rank 0 only)."""
    url = url.rstrip("/")
    with _lock:
        first = url not in _offline
        _offline[url] = checked_at
    if first and _says_notices():
        cause = str(error).removesuffix(f"; {ADVICE}")
        log.warning(
            "offline: %s; reading %s from the cache in %s, last checked against the store %s",
            cause, url, cache_root(cache_dir), _when(checked_at),
        )


def _says_notices() -> bool:
    """Whether this process says a machine's notices: local rank 0 of a launch (``LOCAL_RANK``, else ``RANK``), or a process alone."""
    rank = os.environ.get("LOCAL_RANK") or os.environ.get("RANK") or "0"
    return rank.strip() == "0"


def mark_online(url: str) -> None:
    """The store at ``url`` answered again: read it, not the cache."""
    with _lock:
        _offline.pop(url.rstrip("/"), None)


def offline_since(url: str) -> float | None:
    """When the cache of ``url`` was last checked against the store, if this process reads it offline; else None."""
    with _lock:
        return _offline.get(url.rstrip("/"))


def require_cached(url: str, split: str, infos: Sequence[ShardInfo], has: Callable[[ShardInfo], bool]) -> None:
    """Offline, every shard of ``split`` must be in the cache (``has(info)``).

    Raises:
        NetworkError: one line naming the URL and how many shards (and which first) are not cached.
    """
    missing = [info.name for info in infos if not has(info)]
    if not missing:
        return
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    raise NetworkError(
        f"{url}: the store cannot be reached and {len(missing)} of the {len(infos)} shards of split {split!r} "
        f"are not in the cache ({shown}); reconnect and run again to fetch them"
    )
