"""The pack lock of a shard set in a bucket: one ``stoker pack`` per prefix at a time.

A bucket has no ``flock``. The lock is an object, ``OUT/.stoker-pack.lock``, naming its
owner (host, pid, a random token) and a lease that a thread renews while the pack runs.
A second pack that finds a live lock fails at once, naming the owner and what to do; a
lock whose lease ran out, or whose owner is a dead process of this host, is taken over
(with a note on the ``stoker`` logger). On S3 every write is conditional (``If-None-Match``,
``If-Match``), so of two packs one holds the lock; on other stores the lock is read back
and compared. :meth:`BucketLock.confirm`, right before the manifest is written, renews
once more, so a pack that lost its lock never writes its manifest. The object-store guide
(``docs/guides/remote.md``, "The pack lock") says what each store guarantees.

Example:
    >>> from stoker.fs import where
    >>> with BucketLock(where("memory://bucket/packed")) as lock:  # s3://: the same, with conditional writes
    ...     lock.confirm()  # right before the manifest is written
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, cast

from stoker.errors import ConfigError, NetworkError, ShardError
from stoker.fs import Location, RemoteLocation
from stoker.lifetime import pid_alive
from stoker.shards.pack.replace import LOCK_NAME

__all__ = ["LEASE_S", "BucketLock"]

log = logging.getLogger("stoker")

LEASE_S = 120.0  # how long a lock holds without renewal: a pack killed elsewhere blocks its prefix this long
_SETTLE_S = 0.5  # pause before reading back a lock written without a conditional PUT
_MAX_LOCK_BYTES = 1 << 16


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class BucketLock:
    """The lock object of one output prefix, held by this pack (a context manager).

    Args:
        place: the output prefix (a :class:`~stoker.fs.RemoteLocation`).
        lease_s: how long the lock holds without renewal; it is renewed every quarter of this.

    Raises:
        ConfigError: (on entering) another pack holds the lock, or the lock object is not a
            stoker lock.
        NetworkError: the store could not be reached.
    """

    def __init__(self, place: Location, lease_s: float = LEASE_S) -> None:
        if place.is_local:
            raise ConfigError(f"{place.url}: a bucket lock is for URLs; a local folder uses stoker.shards.pack.replace.pack_lock")
        if lease_s <= 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s}")
        self.place = cast(RemoteLocation, place)  # its filesystem makes the conditional writes
        self.lease_s = float(lease_s)
        self.url = f"{place.url}/{LOCK_NAME}"
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self._path = self.place.path.rstrip("/") + "/" + LOCK_NAME
        protocols = self.place.fs.protocol
        self._conditional = "s3" in (protocols if isinstance(protocols, (tuple, list)) else (protocols,))
        self._etag: str | None = None  # of our last write (S3)
        self._renewed = 0.0  # local monotonic time of our last successful write
        self._lost: str | None = None  # why the lock is no longer ours
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()  # one write of the lock object at a time (renewal thread and confirm)

    # -- the object -----------------------------------------------------------------------
    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({
            "lock": "stoker-pack", "host": self.host, "pid": os.getpid(), "token": self.token,
            "renewed": now, "renewed_utc": _utc(now), "lease_s": self.lease_s,
        }).encode()

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """``(body, etag)`` of the lock object now; ``(None, None)`` when there is none.

        Raises:
            ConfigError: the object is not a stoker lock.
        """
        fs = self.place.fs
        fs.invalidate_cache(self._path)  # a listing may have cached an older ETag
        try:
            etag = fs.info(self._path).get("ETag") if self._conditional else None
            data = fs.cat_file(self._path, start=0, end=_MAX_LOCK_BYTES)
        except FileNotFoundError:
            return None, None
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("lock") != "stoker-pack":
                raise ValueError("not a stoker lock")
            float(body["renewed"]), float(body["lease_s"]), int(body["pid"]), str(body["token"]), str(body["host"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ConfigError(
                f"{self.url}: is not a stoker pack lock (unreadable); if no `stoker pack` is writing into "
                f"{self.place.url}, delete that object and run again"
            ) from None
        return body, etag

    def _write(self, if_match: str | None = None, create: bool = False) -> None:
        """Write our body (conditionally on S3); records the ETag and the time."""
        fs = self.place.fs
        if self._conditional:
            kwargs: dict[str, Any] = {"mode": "create"} if create else {"IfMatch": if_match} if if_match else {}
            out = fs.pipe_file(self._path, self._body(), **kwargs)
            self._etag = out.get("ETag") if isinstance(out, dict) else None
            if self._etag is None:
                self._etag = fs.info(self._path).get("ETag")
        else:
            fs.pipe_file(self._path, self._body(), **({"mode": "create"} if create else {}))
        self._renewed = time.monotonic()

    def _ours(self, body: dict[str, Any] | None) -> bool:
        return body is not None and body.get("token") == self.token

    @staticmethod
    def _owner(body: dict[str, Any]) -> str:
        return f"host {body['host']} pid {body['pid']}"

    # -- taking it ------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock (or refuse); then renew it on a thread until :meth:`release`.

        Raises:
            ConfigError: another pack holds it.
            NetworkError: the store could not be reached.
        """
        try:
            self._take()
        except OSError as exc:
            raise NetworkError(f"{self.url}: cannot write the pack lock ({exc}); check the URL and the credentials") from None
        self._thread = threading.Thread(target=self._renew_loop, name="stoker-bucket-lock", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        for _attempt in range(3):  # a lock that vanishes or changes while we look: look again
            body, etag = self._read()
            if body is None:
                try:
                    self._write(create=True)
                except FileExistsError:  # another pack created it between our read and our write
                    continue
            else:
                stale = self._stale(body)
                if stale is None:
                    raise self._refusal(body)
                try:
                    self._write(if_match=etag)
                except OSError:  # S3: another pack replaced it first
                    continue
                log.warning("%s: took over the pack lock of %s (%s)", self.url, self._owner(body), stale)
            if self._confirmed_by_reading():
                return
        body, _ = self._read()
        if body is not None and not self._ours(body):
            raise self._refusal(body)
        raise ConfigError(f"{self.url}: the pack lock keeps changing under this pack; another pack is starting there; try again")

    def _confirmed_by_reading(self) -> bool:
        if not self._conditional:
            time.sleep(_SETTLE_S)  # a write by another pack that checked at the same moment lands first
        body, _ = self._read()
        return self._ours(body)

    def _stale(self, body: dict[str, Any]) -> str | None:
        """Why a lock can be taken over, or None while its owner holds it."""
        expires = float(body["renewed"]) + float(body["lease_s"])
        if time.time() > expires:
            return f"its lease ran out at {_utc(expires)}: that pack is no longer running"
        pid = int(body["pid"])
        if body["host"] == self.host and pid != os.getpid() and not pid_alive(pid):
            return f"pid {pid} no longer runs on this host"
        return None

    def _refusal(self, body: dict[str, Any]) -> ConfigError:
        expires = float(body["renewed"]) + float(body["lease_s"])
        return ConfigError(
            f"{self.place.url}: another `stoker pack` ({self._owner(body)}) is writing into this prefix "
            f"(its lock {self.url} is renewed until {_utc(expires)}); wait for it to finish, or choose another "
            f"prefix; if that pack is no longer running, run again after {_utc(expires)} (or delete the lock object)"
        )

    # -- keeping it -----------------------------------------------------------------------
    def _renew(self) -> bool:
        """Renew the lease once (read, check it is ours, write it back on that same object).

        Returns whether it was renewed; a lost lock is noted in ``_lost``, a failure to
        reach the store only once the lease ran out meanwhile.
        """
        with self._mutex:
            if self._lost is not None:
                return False
            try:
                body, etag = self._read()
                if not self._ours(body):
                    self._lost = f"it was taken over by {self._owner(body)}" if body is not None else "its lock object was deleted"
                    return False
                self._write(if_match=etag)  # S3: only if nobody replaced it since we read it
                return True
            except (OSError, ConfigError) as exc:
                if time.monotonic() - self._renewed > self.lease_s:
                    self._lost = f"its lease ran out while it could not be renewed ({exc})"
                return False  # a passing failure (or a replacement, which the next renewal names)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            self._renew()

    def confirm(self) -> None:
        """Renew now and make sure the lock is still ours (call right before the manifest is written).

        Raises:
            ShardError: the lock was lost, or could not be renewed; the manifest must not be written.
        """
        if self._renew():
            return
        why = self._lost or "it could not be renewed just now"
        raise ShardError(
            f"{self.place.url}: this pack lost its lock ({why}); it stopped before writing the manifest; "
            "run the same command again when no other pack is writing there: it resumes"
        )

    def release(self) -> None:
        """Stop renewing and delete the lock object if it is still ours (never raises)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._mutex:
            try:
                body, _ = self._read()
                if self._ours(body):
                    self.place.fs.rm_file(self._path)
            except (OSError, ConfigError) as exc:
                log.warning("%s: could not remove the pack lock (%s); it expires by itself after %.0f s", self.url, exc, self.lease_s)

    def __enter__(self) -> BucketLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
