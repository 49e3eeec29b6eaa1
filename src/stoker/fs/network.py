"""Timeouts, retries and one-line errors for every call stoker makes to a store over the network.

Every network call of a :class:`~stoker.fs.remote.RemoteLocation` goes through
:func:`call` (and every read of a file it opens through :class:`NetFile`):

- **Timeouts.** A connection must open, and a read make progress, within
  ``STOKER_NET_TIMEOUT`` seconds (default 60); a filesystem's own settings get it as
  defaults (:func:`with_network_defaults`), the user's ``storage_options`` win.
- **Retries.** A transient failure is tried again up to ``STOKER_NET_RETRIES`` times
  (default 3), with growing waits; a read resumes where it stopped. An unknown host or a
  refused connection is not retried. The lower layers' own retries are turned off.
- **One line.** What still fails is one :class:`~stoker.errors.NetworkError` naming the
  URL and the cause; a missing object stays a ``FileNotFoundError``.

The object-store guide (``docs/guides/remote.md``, "Timeouts and retries") says how each
filesystem gets these settings.

Example:
    >>> def refused():
    ...     raise ConnectionRefusedError(111, "Connection refused")
    >>> call("s3://bucket/x", refused)
    Traceback (most recent call last):
    ...
    stoker.errors.NetworkError: s3://bucket/x: ...
"""

from __future__ import annotations

import errno
import ftplib
import http.client
import io
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from stoker.errors import ConfigError, NetworkError, StokerError

__all__ = ["ADVICE", "ENV_RETRIES", "ENV_TIMEOUT", "NetFile", "NetSettings", "call", "translate", "with_network_defaults"]

#: The last words of every NetworkError stoker makes (callers that add a clause put it before them).
ADVICE = "check the URL and that the store is reachable, then run again"
ENV_TIMEOUT = "STOKER_NET_TIMEOUT"
ENV_RETRIES = "STOKER_NET_RETRIES"
_DEFAULT_TIMEOUT_S = 60.0
_DEFAULT_RETRIES = 3
_MAX_RETRIES = 100  # with the backoff capped at 8 s, 100 retries already wait over 13 minutes per call
_MAX_TIMEOUT_S = 86400.0
_BACKOFF_S = 0.5
_BACKOFF_MAX_S = 8.0
#: The slowest transfer a whole-object call is given time for, on a filesystem run against a deadline.
MIN_RATE_BYTES_PER_S = 256 * 1024

# Filesystems whose own settings carry the timeout; the local-only ones need none.
_NATIVE = {"s3", "s3a", "http", "https", "ftp"}
_NO_NETWORK = {"memory", "file", "local", "data", "reference"}

# errno values with which a store refuses a request (s3fs: InvalidArgument, BucketNotEmpty, EntityTooLarge, ...)
_REFUSALS = {errno.EINVAL, errno.EPERM, errno.EACCES, errno.ENOTEMPTY, errno.EMSGSIZE, errno.ENAMETOOLONG,
             errno.EEXIST, errno.EROFS, errno.ENOSPC, errno.EFBIG}

T = TypeVar("T")


@dataclass(frozen=True)
class NetSettings:
    """How long to wait for the network and how often to try again.

    Attributes:
        timeout_s: seconds a connection may take to open, and a read may go without progress.
        retries: attempts after the first one, for transient failures.
    """

    timeout_s: float = _DEFAULT_TIMEOUT_S
    retries: int = _DEFAULT_RETRIES

    @classmethod
    def from_env(cls) -> NetSettings:
        """``STOKER_NET_TIMEOUT`` (seconds) and ``STOKER_NET_RETRIES``, else the defaults.

        Raises:
            ConfigError: a value that is not a positive number (timeout) or a count >= 0 (retries).
        """
        timeout, retries = os.environ.get(ENV_TIMEOUT, ""), os.environ.get(ENV_RETRIES, "")
        try:
            timeout_s = float(timeout) if timeout.strip() else _DEFAULT_TIMEOUT_S
            if not 0 < timeout_s <= _MAX_TIMEOUT_S:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"{ENV_TIMEOUT}={timeout!r}: must be a number of seconds > 0 and <= {_MAX_TIMEOUT_S:g} (a day), for example 60"
            ) from None
        try:
            count = int(retries) if retries.strip() else _DEFAULT_RETRIES
            if not 0 <= count <= _MAX_RETRIES:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"{ENV_RETRIES}={retries!r}: must be a whole number from 0 to {_MAX_RETRIES}, for example 3"
            ) from None
        return cls(timeout_s, count)

    def backoff_s(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt + 1`` (0.5, 1, 2, ... at most 8)."""
        return float(min(_BACKOFF_S * 2**attempt, _BACKOFF_MAX_S))


def protocol_of(url: str) -> str:
    """The innermost protocol of a URL (``simplecache::s3://b/k`` -> ``s3``)."""
    return url.split("::")[-1].split("://", 1)[0].lower()


def with_network_defaults(url: str, storage_options: Mapping[str, Any], settings: NetSettings) -> dict[str, Any]:
    """``storage_options`` with stoker's timeout and retry defaults added where the user set none.

    The user's keys win one by one (their ``config_kwargs={"read_timeout": 5}`` keeps stoker's
    ``connect_timeout``). For a chained URL the defaults go to the innermost filesystem.
    """
    protocol = protocol_of(url)
    defaults: dict[str, Any] = {}
    t = settings.timeout_s
    if protocol in ("s3", "s3a"):
        defaults = {"config_kwargs": {"connect_timeout": t, "read_timeout": t,
                                      "retries": {"total_max_attempts": 1, "mode": "standard"}}}
    elif protocol in ("http", "https"):
        try:
            import aiohttp
        except ImportError:  # the filesystem itself will say what to install
            return dict(storage_options)
        defaults = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t)}}
    elif protocol == "ftp":
        defaults = {"timeout": t}
    options = dict(storage_options)
    if "::" in url:  # chained: fsspec takes the inner filesystem's options under its protocol's name
        inner = dict(options.get(protocol) or {})
        options[protocol] = _merge(defaults, inner)
        return options
    return _merge(defaults, options)


def _merge(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in given.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def needs_deadline(url: str) -> bool:
    """True for a filesystem without a timeout setting of its own (each call is then run against a deadline)."""
    protocol = protocol_of(url)
    return protocol not in _NATIVE and protocol not in _NO_NETWORK


# -- what went wrong ------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _classify(exc: BaseException, settings: NetSettings) -> tuple[str, bool, bool] | None:
    """(the cause in words, whether trying again may help, whether nothing answered) of a network failure; None if none.

    Only an unknown host, a refused or failed connection and a timeout are "nothing
    answered" (the store is unreachable); a store that answered with an error is not.

    A ``FileNotFoundError`` raised *because of* a network failure (fsspec's HTTP
    filesystem says "not found" for a host it cannot reach) is that failure.
    """
    if isinstance(exc, StokerError):
        return None
    if isinstance(exc, FileNotFoundError):
        return _classify(exc.__cause__, settings) if exc.__cause__ is not None else None
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain}
    modules = {type(e).__module__.split(".")[0] for e in chain}
    for e in chain:
        if isinstance(e, socket.gaierror):
            return f"unknown host ({_first_line(exc)})", False, True
    if "ConnectionRefusedError" in names:
        return f"connection refused: nothing listens there ({_first_line(exc)})", False, True
    timeout = f"no answer for {settings.timeout_s:g} s (a timeout; set {ENV_TIMEOUT} to wait longer)"
    for e in chain:
        if isinstance(e, (TimeoutError, socket.timeout)) or type(e).__name__ in (
            "ConnectTimeoutError", "ReadTimeoutError", "FSTimeoutError", "ServerTimeoutError", "SocketTimeoutError",
        ):
            return timeout, True, True
    status = getattr(exc, "status", None)
    if "ClientResponseError" in names and isinstance(status, int):
        if status in (404, 410):
            return None  # not there: the caller says "missing"
        return f"HTTP {status} {getattr(exc, 'message', '')}".rstrip(), status >= 500 or status == 429, False
    if isinstance(exc, ConnectionError) or "aiohttp" in modules and isinstance(exc, OSError):
        return f"the connection failed ({_first_line(exc)})", True, True
    if isinstance(exc, (http.client.HTTPException, EOFError)):
        return f"the connection was dropped ({_first_line(exc)})", True, True
    if isinstance(exc, ftplib.error_temp):
        return f"the FTP server refused for now ({_first_line(exc)})", True, False
    if isinstance(exc, ftplib.Error):
        return f"the FTP server refused ({_first_line(exc)})", False, False
    if "botocore" in modules or "aiobotocore" in modules:
        transient = any(n in names for n in ("HTTPClientError", "ConnectionClosedError", "ResponseStreamingError",
                                              "EndpointConnectionError", "IncompleteReadError"))
        if "NoCredentialsError" in names or "PartialCredentialsError" in names:
            return f"no credentials ({_first_line(exc)}); set AWS_PROFILE or AWS_ACCESS_KEY_ID, or pass storage_options", False, False
        response = getattr(exc, "response", None)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
        if isinstance(status, int):  # a ClientError: the store answered
            code = str(response.get("Error", {}).get("Code", ""))  # type: ignore[union-attr]
            busy = status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout", "Throttling")
            return f"the store refused the request ({_first_line(exc)})", busy, False
        return _first_line(exc), transient, transient  # EndpointConnectionError and the like: nothing answered
    if "aiohttp" in modules:
        return f"the connection failed ({_first_line(exc)})", True, True
    if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                                                          FileExistsError, PermissionError)):
        # s3fs and others map a refused request to an errno: asking again gets the same answer
        return f"the store refused or failed ({_first_line(exc)})", exc.errno not in _REFUSALS, False
    return None


def translate(exc: BaseException, url: str, settings: NetSettings | None = None, attempts: int = 1) -> StokerError | None:
    """The one-line stoker error for a failure of a call to ``url``; None where it is not a network failure.

    A missing object (``FileNotFoundError``) and stoker's own errors are not translated.
    A refused permission becomes a :class:`ConfigError` (the credentials are the fix).
    """
    if isinstance(exc, StokerError) or isinstance(exc, FileNotFoundError) and _classify(exc, settings or NetSettings()) is None:
        return None
    if isinstance(exc, PermissionError) or _denied(exc):
        return ConfigError(f"{url}: access denied ({_first_line(exc)}); check the credentials and the URL")
    settings = settings or NetSettings.from_env()
    found = _classify(exc, settings)
    if found is None:
        return None
    cause, _, unreachable = found
    tries = f" (tried {attempts} times)" if attempts > 1 else ""
    error = NetworkError(f"{url}: {cause}{tries}; {ADVICE}")
    error.unreachable = unreachable
    return error


def _denied(exc: BaseException) -> bool:
    """Whether the store answered 401 or 403 (HTTP, or an S3 error response): the credentials, not the network."""
    for e in _chain(exc):
        status = getattr(e, "status", None)
        if type(e).__name__ == "ClientResponseError" and status in (401, 403):
            return True
        response = getattr(e, "response", None)
        if isinstance(response, dict) and response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (401, 403):
            return True
    return False


def call(url: str, fn: Callable[[], T], settings: NetSettings | None = None, *, moves_bytes: int = 0) -> T:
    """``fn()``, retried on transient network failures, its failures turned into one-line errors naming ``url``.

    On a filesystem without timeouts of its own the call runs against a deadline:
    ``timeout_s``, plus the time ``moves_bytes`` (what one call uploads or downloads
    whole) takes at :data:`MIN_RATE_BYTES_PER_S`, so a large upload on a slow link is not cut off.

    Raises:
        NetworkError: the store could not be reached or read after the retries.
        ConfigError: access was denied.
        FileNotFoundError: there is no such object (the caller names it).
    """
    settings = settings or NetSettings.from_env()
    deadline_s = settings.timeout_s + moves_bytes / MIN_RATE_BYTES_PER_S
    run = (lambda: _with_deadline(fn, deadline_s)) if needs_deadline(url) else fn
    attempt = 0
    while True:
        try:
            return run()
        except Exception as exc:  # noqa: BLE001  (sorted below: only network failures are translated)
            found = _classify(exc, settings)
            if found is not None and found[1] and attempt < settings.retries and not isinstance(exc, PermissionError) \
                    and not _denied(exc):
                time.sleep(settings.backoff_s(attempt))
                attempt += 1
                continue
            error = translate(exc, url, settings, attempt + 1)
            if error is None:
                raise
            raise error from None


def _with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` in a helper thread; TimeoutError if it takes longer than ``timeout_s`` (the thread is left to finish)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            box["error"] = exc

    thread = threading.Thread(target=target, name="stoker-net-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class NetFile(io.RawIOBase):
    """A file of a store open for reading, whose reads time out, resume after a dropped connection, and fail in one line.

    Args:
        url: the object's URL (for messages).
        opener: opens the object again (a new connection) for a resumed read.
        settings: timeouts and retries.
    """

    def __init__(self, url: str, opener: Callable[[], Any], settings: NetSettings) -> None:
        super().__init__()
        self.url, self._opener, self._settings = url, opener, settings
        self._file: Any = call(url, opener, settings)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._file.seekable()) if hasattr(self._file, "seekable") else False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = int(call(self.url, lambda: self._file.seek(offset, whence), self._settings))
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        n = -1 if size is None else size
        data = self._read(lambda f: f.read(n))
        self._pos += len(data)
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def _read(self, how: Callable[[Any], bytes]) -> bytes:
        settings = self._settings
        attempt = 0
        while True:
            try:
                run = (lambda: _with_deadline(lambda: how(self._file), settings.timeout_s)) if needs_deadline(self.url) \
                    else (lambda: how(self._file))
                return run()
            except Exception as exc:  # noqa: BLE001  (sorted below)
                found = _classify(exc, settings)
                if found is not None and found[1] and attempt < settings.retries and (self._pos == 0 or self.seekable()):
                    time.sleep(settings.backoff_s(attempt))
                    attempt += 1
                    self._reopen()
                    continue
                error = translate(exc, self.url, settings, attempt + 1)
                if error is None:
                    raise
                raise error from None

    def _reopen(self) -> None:
        """A new connection, at the position the last good read reached."""
        try:
            self._file.close()
        except Exception:  # noqa: BLE001, S110  (the old connection is broken anyway)
            pass
        self._file = call(self.url, self._opener, self._settings)
        if self._pos:
            pos = self._pos
            call(self.url, lambda: self._file.seek(pos), self._settings)

    def close(self) -> None:
        inner = self.__dict__.get("_file")
        if not self.closed and inner is not None:
            try:
                inner.close()
            except Exception:  # noqa: BLE001, S110  (closing a read-only object: nothing to lose)
                pass
        super().close()

    def __getattr__(self, name: str) -> Any:  # size, details, ... of the underlying fsspec file
        inner = self.__dict__.get("_file")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)
