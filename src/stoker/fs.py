"""Paths and URLs: where a folder or file named by the user lives (local disk or an fsspec filesystem).

stoker takes a plain path, a ``file://`` URL, or any fsspec URL (``s3://``, ``gs://``,
``az://``, ``https://``, ``memory://``, chained ones like ``simplecache::s3://``) wherever
it takes a folder or a file. Local paths stay :class:`pathlib.Path` and are read with the
operating system (no fsspec in the way); everything else is a :class:`Location`: an
fsspec filesystem and a path on it, never turned into a local folder named ``s3:``.

Credentials and endpoints come from fsspec's usual configuration: the environment
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``FSSPEC_S3_ENDPOINT_URL``, ...), fsspec's config
files, or ``storage_options=``; stoker adds none of its own.

Example:
    >>> where("data/digiface")  # doctest: +SKIP
    PosixPath('data/digiface')
    >>> where("s3://bucket/packed")  # doctest: +SKIP
    Location('s3://bucket/packed')
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from stoker.errors import ConfigError, MissingFileError

__all__ = ["Location", "PathOrURL", "is_url", "join", "local_path", "parent", "read_text", "where"]

# The pip extra that brings each protocol's filesystem (fsspec's own protocols need only fsspec).
_EXTRAS = {
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure",
    "http": "remote", "https": "remote",
}
PathOrURL = Union[str, "os.PathLike[str]", "Location"]  # what every reader of a folder or file takes

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` and chained ``a::b://...`` URLs (``file://`` included)."""
    text = os.fspath(path)
    return isinstance(text, str) and (bool(_URL_RE.match(text)) or ("::" in text and "://" in text))


def local_path(path: str | os.PathLike[str]) -> Path | None:
    """The local path of a plain path or a ``file://`` URL; None for any other URL."""
    text = os.fspath(path)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if not is_url(text):
        return Path(text)
    if text.startswith("file://"):
        return Path(text[len("file://") :])
    return None


def join(base: str | os.PathLike[str], *names: str) -> str:
    """``base/name/...`` for a path or a URL (a URL keeps its ``//``)."""
    local = local_path(base)
    if local is not None and not os.fspath(base).startswith("file://"):
        return str(local.joinpath(*names))
    text = os.fspath(base)
    return "/".join([text.rstrip("/"), *(n.strip("/") for n in names)])


def parent(path: str | os.PathLike[str]) -> str:
    """The folder holding ``path`` (a URL keeps its scheme)."""
    local = local_path(path)
    if local is not None and not os.fspath(path).startswith("file://"):
        return str(local.parent)
    head, _, _ = os.fspath(path).rstrip("/").rpartition("/")
    return head


def read_text(path: str | os.PathLike[str] | Location) -> str:
    """The text of a small local or remote file (UTF-8).

    Raises:
        FileNotFoundError: there is no such file (a :class:`MissingFileError` for a URL).
        UnicodeDecodeError: it is not UTF-8 text.
    """
    place = where(path)
    if isinstance(place, Location):
        return place.read_bytes().decode("utf-8")
    return place.read_text()


def where(path: str | os.PathLike[str] | Location, storage_options: Mapping[str, Any] | None = None) -> Path | Location:
    """A local :class:`~pathlib.Path`, or a :class:`Location` for a URL (a Location is returned as it is).

    Raises:
        ConfigError: the URL's filesystem is not installed (the message names the extra).
    """
    if isinstance(path, Location):
        return path
    local = local_path(path)
    if local is not None:
        return local
    return Location(os.fspath(path), storage_options)


class Location:
    """A folder or file on an fsspec filesystem: the URL, its filesystem and its path there.

    The filesystem is made on first use (and again after pickling, in the process that
    uses it), so a Location can go to DataLoader workers and Ray tasks.

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
        self.fs  # noqa: B018  (fail now, with the install hint, rather than on first read)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (``fsspec.AbstractFileSystem``), made again in a forked process."""
        if self._fs is None or self._pid != os.getpid():
            # Async filesystems (s3fs, gcsfs) are not fork-safe: a DataLoader worker makes its own.
            self._fs, self._path = _url_to_fs(self.url, self.storage_options)
            self._pid = os.getpid()
        return self._fs

    @property
    def path(self) -> str:
        """The path on :attr:`fs` (no protocol)."""
        self.fs  # noqa: B018
        return self._path

    @property
    def name(self) -> str:
        """The last part of the path (like ``Path.name``)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def child(self, *names: str) -> Location:
        """The location ``self/name/...``."""
        return Location(join(self.url, *names), self.storage_options)

    def _p(self, name: str | None) -> str:
        return self.path if not name else self.path.rstrip("/") + "/" + name.strip("/")

    # -- reading ------------------------------------------------------------------------
    def read_bytes(self, name: str | None = None, max_bytes: int | None = None) -> bytes:
        """The bytes of this file (or of ``name`` inside this folder).

        Raises:
            MissingFileError: there is no such object.
            ConfigError: the file is larger than ``max_bytes``.
        """
        path = self._p(name)
        try:
            if max_bytes is not None and int(self.fs.size(path)) > max_bytes:
                raise ConfigError(f"{self.url_of(name)}: larger than {max_bytes} bytes")
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            raise MissingFileError(f"{self.url_of(name)}: not found") from None

    def exists(self, name: str | None = None) -> bool:
        """True if the object or folder exists."""
        return bool(self.fs.exists(self._p(name)))

    def is_dir(self, name: str | None = None) -> bool:
        """True if this is a folder (on object stores: a prefix with objects under it)."""
        return bool(self.fs.isdir(self._p(name)))

    def sizes(self) -> dict[str, int]:
        """``{name: bytes}`` of the files directly in this folder (one listing)."""
        try:
            entries = self.fs.ls(self.path, detail=True, refresh=True)
        except FileNotFoundError:
            return {}
        except TypeError:  # filesystems whose ls takes no refresh=
            entries = self.fs.ls(self.path, detail=True)
        out: dict[str, int] = {}
        for e in entries:
            if e.get("type") != "file":
                continue
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            size = e.get("size")
            if size is None:  # an HTTP index page lists names only
                size = self.size(name)
            if size is not None:
                out[name] = int(size)
        return out

    def size(self, name: str | None = None) -> int | None:
        """Bytes of one object, or None if there is none (for stores that cannot list, like plain HTTP)."""
        try:
            return int(self.fs.size(self._p(name)))
        except (FileNotFoundError, OSError, TypeError, ValueError):
            return None

    def list_dirs(self) -> list[str]:
        """Names of the folders directly in this one, sorted."""
        try:
            entries = self.fs.ls(self.path, detail=True)
        except FileNotFoundError:
            return []
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def walk_files(self) -> list[str]:
        """Every file under this folder, as sorted paths relative to it (``a/b.png``)."""
        base = self.path.rstrip("/") + "/"
        found = []
        for path in self.fs.find(self.path):
            text = str(path)
            if text.startswith(base):
                found.append(text[len(base) :])
        return sorted(found)

    def url_of(self, name: str | None = None) -> str:
        """The URL of ``name`` inside this folder (or of this location)."""
        return self.url if not name else join(self.url, name)

    # -- the part of pathlib's interface that layout detection uses ---------------------------
    def __truediv__(self, name: str) -> Location:
        return self.child(name)

    @property
    def suffix(self) -> str:
        """The file name's extension (``.txt``), like ``Path.suffix``."""
        return os.path.splitext(self.name)[1]

    @property
    def parent(self) -> Location:
        """The folder holding this one."""
        return Location(parent(self.url), self.storage_options)

    def is_file(self) -> bool:
        """True if this is an object (a file)."""
        return bool(self.fs.isfile(self.path))

    def glob(self, pattern: str) -> list[Location]:
        """The files directly in this folder whose name matches ``pattern`` (sorted)."""
        return [self.child(name) for name in sorted(self.sizes()) if fnmatch.fnmatch(name, pattern)]

    def read_text(self, encoding: str = "utf-8") -> str:
        """The text of this file."""
        return self.read_bytes().decode(encoding)

    # -- writing ------------------------------------------------------------------------
    def upload(self, local: str | os.PathLike[str], name: str) -> None:
        """Copy a local file to ``name`` in this folder.

        On object stores an object appears only once its upload is complete, so a reader
        never sees half a file.
        """
        self.fs.put_file(os.fspath(local), self._p(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small object whole."""
        self.fs.pipe_file(self._p(name), data)

    def remove(self, name: str) -> None:
        """Delete ``name`` if it is there."""
        try:
            self.fs.rm_file(self._p(name))
        except FileNotFoundError:
            pass

    def invalidate(self) -> None:
        """Forget cached listings (other processes may have written here)."""
        self.fs.invalidate_cache()

    # -- plumbing -----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.storage_options = state["url"], state["storage_options"]
        self._fs, self._path, self._pid = None, "", 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.url, self.storage_options) == (other.url, other.storage_options)

    def __hash__(self) -> int:
        return hash(self.url)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Location({self.url!r})"


def _url_to_fs(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    protocol = url.split("::")[-1].split("://", 1)[0].lower()
    extra = _EXTRAS.get(protocol, "remote")
    try:
        import fsspec.core
    except ImportError:
        raise ConfigError(f"{url}: reading URLs needs fsspec; pip install 'stoker[{extra}]'") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as exc:
        raise ConfigError(
            f"{url}: the filesystem for {protocol}:// is not installed ({exc}); pip install 'stoker[{extra}]'"
        ) from None
    except ValueError as exc:
        if "protocol" in str(exc).lower():
            raise ConfigError(f"{url}: fsspec does not know the protocol {protocol!r} ({exc})") from None
        raise ConfigError(f"{url}: not a valid URL ({exc})") from None
    return fs, str(path)
