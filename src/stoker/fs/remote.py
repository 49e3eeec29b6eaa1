"""A :class:`~stoker.fs.location.Location` on an fsspec filesystem (``s3://``, ``gs://``, ``memory://``, ...).

Credentials and endpoints come from fsspec's usual configuration: the environment
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``FSSPEC_S3_ENDPOINT_URL``, ...), fsspec's config
files, or ``storage_options=``; stoker adds none of its own.

Every call that touches the store has a timeout and bounded retries, and fails with one
:class:`~stoker.errors.NetworkError` line naming the URL and the cause
(:mod:`stoker.fs.network`: ``STOKER_NET_TIMEOUT``, ``STOKER_NET_RETRIES``).
"""

from __future__ import annotations

import base64
import fnmatch
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, TypeVar, cast

from stoker.errors import ConfigError, DataError, LabelError, MissingFileError
from stoker.fs.location import FileKinds, Location, join, parent, walk_kinds
from stoker.fs.network import NetFile, NetSettings, call, protocol_of, with_network_defaults

T = TypeVar("T")

__all__ = ["RemoteLocation"]

# The pip extra that brings each protocol's filesystem (fsspec's own protocols need only fsspec).
_EXTRAS = {
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure",
    "http": "remote", "https": "remote",
}


class RemoteLocation(Location):
    """A folder or file on an fsspec filesystem: the URL, its filesystem and its path there.

    The filesystem is made on first use (and again after pickling, in the process that
    uses it), so a RemoteLocation can go to DataLoader workers and Ray tasks.

    Args:
        url: an fsspec URL (``s3://bucket/prefix``, ``memory://x``, ``simplecache::s3://...``).
        storage_options: passed to the filesystem (credentials, ``endpoint_url``, ...).

    Raises:
        ConfigError: the URL's filesystem is not installed, or the URL is malformed.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/") if not url.endswith("://") else url
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._path = ""
        self._pid = 0
        self.net = NetSettings.from_env()
        self.fs  # noqa: B018  (fail now, with the install hint, rather than on first read)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (``fsspec.AbstractFileSystem``), made again in a forked process."""
        if self._fs is None or self._pid != os.getpid():
            # Async filesystems (s3fs, gcsfs) are not fork-safe: a DataLoader worker makes its own.
            self._fs, self._path = _url_to_fs(self.url, with_network_defaults(self.url, self.storage_options, self.net), self.net)
            if hasattr(self._fs, "retries") and type(self._fs).__module__.startswith("s3fs"):
                self._fs.retries = 1  # stoker retries (stoker.fs.network); s3fs's own would multiply the attempts
            self._pid = os.getpid()
        return self._fs

    @property
    def path(self) -> str:
        """The path on :attr:`fs` (no protocol)."""
        self.fs  # noqa: B018
        return self._path

    @property
    def local_path(self) -> None:
        """None: the bytes are not on local disk (download them first to memory-map them)."""
        return None

    @property
    def name(self) -> str:
        """The last part of the path (like ``Path.name``)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemoteLocation:
        """The folder holding this one."""
        return RemoteLocation(parent(self.url), self.storage_options)

    def child(self, *names: str) -> RemoteLocation:
        """The location ``self/name/...``."""
        return RemoteLocation(join(self.url, *names), self.storage_options)

    def resolve(self) -> RemoteLocation:
        """Itself: object stores have no symbolic links."""
        return self

    def contains(self, other: Location) -> bool:
        """True if ``other`` is this URL or one below it."""
        return other.url == self.url or other.url.startswith(self.url.rstrip("/") + "/")

    def _p(self, name: str | None) -> str:
        return self.path if not name else self.path.rstrip("/") + "/" + name.strip("/")

    def _call(self, name: str | None, fn: Callable[[], T]) -> T:
        """``fn()`` with the network's timeouts and retries; a failure is one NetworkError naming the URL."""
        return call(self.url_of(name), fn, self.net)

    def _info(self, name: str | None) -> dict[str, Any] | None:
        """The store's answer for one path (type, size), or None if nothing is there.

        fsspec's own ``exists``/``isfile``/``isdir`` answer False to any error, so an
        unreachable store would read as "not found"; this asks ``info`` and lets a network
        failure through as one.
        """
        path = self._p(name)
        try:
            return cast("dict[str, Any]", self._call(name, lambda: self.fs.info(path)))
        except (FileNotFoundError, NotADirectoryError):
            return None

    # -- questions ------------------------------------------------------------------------
    def exists(self, name: str | None = None) -> bool:
        """True if the object or folder exists.

        Raises:
            NetworkError: the store cannot be reached.
        """
        return self._info(name) is not None

    def is_file(self, name: str | None = None) -> bool:
        """True if this is an object (a file).

        Raises:
            NetworkError: the store cannot be reached.
        """
        info = self._info(name)
        return info is not None and info.get("type") != "directory"

    def is_dir(self, name: str | None = None) -> bool:
        """True if this is a folder (on object stores: a prefix with objects under it).

        Raises:
            NetworkError: the store cannot be reached.
        """
        info = self._info(name)
        if info is None:
            return False
        if info.get("type") == "directory":
            return True
        if protocol_of(self.url) not in ("http", "https"):
            return False
        path = self._p(name)  # a web server answers for a folder's index page as for a file: ask for a listing
        return bool(self._call(name, lambda: self.fs.isdir(path)))

    def size(self, name: str | None = None) -> int | None:
        """Bytes of one object, or None if there is none (for stores that cannot list, like plain HTTP).

        Raises:
            NetworkError: the store cannot be reached (that is not "no such object").
        """
        path = self._p(name)
        try:
            return int(self._call(name, lambda: self.fs.size(path)))
        except (FileNotFoundError, TypeError, ValueError):
            return None

    # -- reading --------------------------------------------------------------------------
    def open(self, name: str | None = None) -> IO[bytes]:
        """The object open for reading bytes (streamed through fsspec; reads time out and resume after a dropped connection)."""
        path = self._p(name)
        try:
            return cast("IO[bytes]", NetFile(self.url_of(name), lambda: self.fs.open(path, "rb"), self.net))
        except FileNotFoundError:
            raise MissingFileError(f"{self.url_of(name)}: not found") from None

    def read_bytes(self, name: str | None = None, max_bytes: int | None = None) -> bytes:
        """The bytes of this object (or of ``name`` inside this folder), of at most ``max_bytes``."""
        path = self._p(name)
        try:
            size = self.size(name) if max_bytes is not None else None  # a HEAD, then one GET
            if max_bytes is not None and size is not None and size > max_bytes:
                raise DataError(f"{self.url_of(name)}: {size:,} bytes, larger than {max_bytes:,} bytes")
            if max_bytes is not None and size is None:  # the store does not say (HTTP without a length): read at most the limit
                with self.open(name) as f:
                    data = f.read(max_bytes + 1)
                if len(data) > max_bytes:
                    raise DataError(f"{self.url_of(name)}: larger than {max_bytes:,} bytes")
                return bytes(data)
            return bytes(call(self.url_of(name), lambda: self.fs.cat_file(path), self.net, moves_bytes=size or 0))
        except FileNotFoundError:
            raise MissingFileError(f"{self.url_of(name)}: not found") from None

    def sha256(self, name: str | None = None) -> str | None:
        """The SHA-256 (hex) the store itself keeps for one object, where it keeps a trustworthy one; else None.

        Only S3's full-object ``ChecksumSHA256`` counts (asked with ``ChecksumMode=ENABLED``):
        an ETag is an MD5 at best, and a multipart upload's composite checksum is not the
        object's hash. Any other store: None (read the bytes to check them).

        Raises:
            NetworkError: the store cannot be reached.
        """
        if protocol_of(self.url) not in ("s3", "s3a") or not hasattr(self.fs, "call_s3"):
            return None
        bucket, key, _ = self.fs.split_path(self._p(name))
        try:
            head = self._call(name, lambda: self.fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
        except FileNotFoundError:
            return None
        value = head.get("ChecksumSHA256") if isinstance(head, dict) else None
        if not value or "-" in str(value) or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
            return None
        try:
            return base64.b64decode(str(value), validate=True).hex()
        except ValueError:
            return None

    # -- listing --------------------------------------------------------------------------
    def _entries(self, refresh: bool = False) -> list[dict[str, Any]]:
        path = self.path
        try:
            if refresh:
                try:
                    return list(self._call(None, lambda: self.fs.ls(path, detail=True, refresh=True)))
                except TypeError:  # filesystems whose ls takes no refresh=
                    pass
            return list(self._call(None, lambda: self.fs.ls(path, detail=True)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def kinds(self) -> FileKinds:
        """``file`` or ``dir`` for each entry directly in this folder (one listing; empty if none)."""
        return {_last(e["name"]): "dir" if e.get("type") == "directory" else "file" for e in self._entries()}

    def walk(self, prune: Callable[[str], bool] | None = None) -> Iterator[tuple[str, FileKinds]]:
        """``(folder, kinds)`` for this folder and each below, parents first in name order, from one recursive listing."""
        base = self.path.rstrip("/") + "/"
        tree: dict[str, FileKinds] = {"": {}}
        for path in self._call(None, lambda: self.fs.find(self.path)):
            text = str(path)
            if not text.startswith(base):
                continue
            parts = text[len(base) :].split("/")
            for depth in range(len(parts)):
                folder = "/".join(parts[:depth])
                kind = "file" if depth == len(parts) - 1 else "dir"
                tree.setdefault(folder, {}).setdefault(parts[depth], kind)
        return walk_kinds(lambda rel: tree.get(rel, {}), prune)

    def sizes(self) -> dict[str, int]:
        """``{name: bytes}`` of the files directly in this folder (one fresh listing)."""
        out: dict[str, int] = {}
        for e in self._entries(refresh=True):
            if e.get("type") != "file":
                continue
            name = _last(e["name"])
            size = e.get("size")
            if size is None:  # an HTTP index page lists names only
                size = self.size(name)
            if size is not None:
                out[name] = int(size)
        return out

    def list_dirs(self) -> list[str]:
        """Names of the folders directly in this one, sorted."""
        return sorted(_last(e["name"]) for e in self._entries() if e.get("type") == "directory")

    def glob(self, pattern: str) -> list[Location]:
        """The files directly in this folder whose name matches ``pattern`` (sorted)."""
        return [self.child(name) for name in sorted(self.sizes()) if fnmatch.fnmatch(name, pattern)]

    def file_inside(self, name: str, where: str, kinds: FileKinds | None = None) -> str | None:
        """See :meth:`Location.file_inside` (an object store has no links: only the name is checked)."""
        if name.startswith("/") or "\\" in name or ".." in name.split("/") or name in ("", "."):
            raise LabelError(f"{where}: {name!r} points outside the data folder {self.url}; name files relative to it")
        kind = kinds.get(name) if kinds is not None and "/" not in name else None
        if kind is None and (kinds is None or "/" in name):
            kind = "file" if self.is_file(name) else "dir" if self.is_dir(name) else None
        if kind is None:
            return None
        if kind != "file":
            raise DataError(f"{where}: {self.url_of(name)} is not a file ({kind}); only files are data")
        return self.url_of(name)

    # -- writing --------------------------------------------------------------------------
    def upload(self, local: str | os.PathLike[str], name: str) -> None:
        """Copy a local file to ``name`` in this folder.

        On object stores an object appears only once its upload is complete, so a reader
        never sees half a file.
        """
        path, size = self._p(name), os.path.getsize(local)
        call(self.url_of(name), lambda: self.fs.put_file(os.fspath(local), path), self.net, moves_bytes=size)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small object whole."""
        path = self._p(name)
        call(self.url_of(name), lambda: self.fs.pipe_file(path, data), self.net, moves_bytes=len(data))

    def remove(self, name: str) -> None:
        """Delete ``name`` if it is there."""
        path = self._p(name)
        try:
            self._call(name, lambda: self.fs.rm_file(path))
        except FileNotFoundError:
            pass

    def invalidate(self) -> None:
        """Forget cached listings (other processes may have written here)."""
        self.fs.invalidate_cache()

    # -- plumbing -------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.storage_options = state["url"], state["storage_options"]
        self._fs, self._path, self._pid = None, "", 0
        self.net = NetSettings.from_env()


def _last(path: Any) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def _url_to_fs(url: str, storage_options: Mapping[str, Any], net: NetSettings) -> tuple[Any, str]:
    protocol = url.split("::")[-1].split("://", 1)[0].lower()
    extra = _EXTRAS.get(protocol, "remote")
    try:
        import fsspec.core
    except ImportError:
        raise ConfigError(f"{url}: reading URLs needs fsspec; pip install 'stoker[{extra}]'") from None
    try:
        # Some filesystems (FTP, SFTP) connect when made: that is a network call like any other.
        fs, path = call(url, lambda: fsspec.core.url_to_fs(url, **storage_options), net)
    except ImportError as exc:
        raise ConfigError(
            f"{url}: the filesystem for {protocol}:// is not installed ({exc}); pip install 'stoker[{extra}]'"
        ) from None
    except ValueError as exc:
        if "protocol" in str(exc).lower():
            raise ConfigError(f"{url}: fsspec does not know the protocol {protocol!r} ({exc})") from None
        raise ConfigError(f"{url}: not a valid URL ({exc})") from None
    return fs, str(path)
